"""Which model a record measured: a fingerprint of a model's graph, its tensors and where it
came from (house rule 14).

A numeric report, a plan or a lowered model carries the :class:`Fingerprint` of the model it
measured; a consumer handed another model's record refuses it (:func:`check_fingerprint`)
instead of matching whatever node names happen to coincide, and says which of the two differs:
the operators, the weights and qparams, or the float model it was prepared from.

A fingerprint has three parts:

``digest``, the graph (SHA-256, first 16 hex digits):

* a graph (``qviz.export``, prepared, converted, or an ``ExportedProgram``): each operator, in
  graph order, as ``name op target`` (``linear call_function aten.linear.default``). Quantize,
  dequantize and choose_qparams operators, observers (``call_module``), inputs, outputs and
  parameters are left out, so the float, prepared and converted graphs of one model (without a
  folded BatchNorm), their deep copies and the ``ExportedProgram`` of the same model share a
  fingerprint, and a model with other operators or names does not;
* an eager module (a quant_nn model): each submodule as ``name class``.

``tensors``, what the numbers depend on: every parameter, buffer (an observer's statistics
included) and constant, as its name, dtype, shape and a SHA-1 of its bytes, and the scale and
zero point literals of every quantize / dequantize operator. Deep copies share it; the same graph
with other weights, another calibration or other qparams does not. Hashing runs at about 1.4 GB/s
(resnet18: 30 ms); it is computed when asked, never cached, so a weight changed in place is seen.

``origin`` and ``calibrated``, the lineage kept in the graph module's ``meta`` (so copies keep it):
:func:`qviz.prepare_pt2e` records the ``tensors`` of the float model it was given as the
prepared model's ``origin`` (a function-preserving transform, such as cross-layer equalization,
hands its input's origin on: :func:`derived_copy`), and :func:`qviz.convert_pt2e` records the
prepared model's ``tensors`` at conversion as the converted model's ``calibrated``. A float
model's origin is its own tensors.

Every fingerprint in qviz comes from :func:`digest` (the distributed path's QuantPlan digest
too). The engine reads a record's fingerprints by duck typing (``record.fingerprint``, and
``record.float_fingerprint`` for the float model it was compared with), so it imports nothing of
:mod:`qviz.numeric`.

Example:
    >>> import copy, torch, qviz
    >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 2)).eval(), (torch.randn(2, 4),))
    >>> fp = fingerprint(gm)
    >>> fp.operators, fp == fingerprint(copy.deepcopy(gm))
    (1, True)
    >>> fp == fingerprint(qviz.export(torch.nn.ReLU(), (torch.randn(2),)))
    False
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.fx import Graph, GraphModule, Node

from qviz.engine.graph.qdq_ops import choose_qparams_ops, dequantize_ops, quantize_ops
from qviz.errors import ConfigError, ModelMismatchError

ORIGIN_KEY = "qviz_origin"
"""``gm.meta`` key: the ``tensors`` digest of the float model this model descends from."""
CALIBRATED_KEY = "qviz_calibrated"
"""``gm.meta`` key of a converted model: the prepared model's ``tensors`` when it was converted."""

_M = TypeVar("_M", bound=nn.Module)


@dataclass(frozen=True)
class Fingerprint:
    """A model's fingerprint: its graph's digest and how many operators (or modules) it covers,
    the digest of its tensors and qparams, and its lineage (empty where unknown).

    Two fingerprints are equal when all parts are; :meth:`difference` says which part is not.

    Example:
        >>> str(Fingerprint("0123456789abcdef", 3))
        'model 0123456789abcdef (3 operators)'
    """

    digest: str
    operators: int
    tensors: str = ""
    origin: str = ""
    calibrated: str = ""

    def __str__(self) -> str:
        plural = "" if self.operators == 1 else "s"
        return f"model {self.digest} ({self.operators} operator{plural})"

    def difference(self, other: Fingerprint) -> str | None:
        """What differs between the model of ``self`` and the model of ``other``, in words, or
        None when nothing known does.

        Example:
            >>> a = Fingerprint("0123456789abcdef", 3, tensors="aa", origin="f1")
            >>> a.difference(Fingerprint("0123456789abcdef", 3, tensors="bb", origin="f2"))
            'the same operators with other weights: made from another float model'
            >>> a.difference(Fingerprint("0123456789abcdef", 3, tensors="bb", origin="f1"))
            'the same operators and float weights with other qparams or statistics'
        """
        if self.digest != other.digest:
            return f"other operators ({self} against {other})"
        if not self.tensors or not other.tensors or self.tensors == other.tensors:
            return None
        if self.origin and other.origin and self.origin != other.origin:
            return "the same operators with other weights: made from another float model"
        if self.origin and self.origin == other.origin:
            return "the same operators and float weights with other qparams or statistics"
        return "the same operators with other weights, qparams or statistics"


def digest(parts: Iterable[str]) -> str:
    """The first 16 hex digits of the SHA-256 of ``parts``, one per line.

    Example:
        >>> digest(["a", "b"]) == digest(["a", "b"]) != digest(["ab"])
        True
    """
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _graph_of(model: Any) -> Graph | None:
    if isinstance(model, GraphModule):
        return model.graph
    graph = getattr(model, "graph", None)  # an ExportedProgram
    return graph if isinstance(graph, Graph) else None


def _target(target: Any) -> str:
    """``aten.linear.default`` for an ATen operator, ``_operator.getitem`` for a function."""
    if hasattr(target, "_schema"):  # an operator overload
        return str(target)
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', target)}"


def _operator_lines(graph: Graph) -> list[str]:
    skip = quantize_ops() | dequantize_ops() | choose_qparams_ops()
    return [
        f"{n.name} {n.op} {_target(n.target)}"
        for n in graph.nodes
        if n.op == "call_function" and n.target not in skip
    ]


def tensor_bytes(t: torch.Tensor) -> bytes | memoryview:
    """``t``'s values as bytes, what its digests are taken of (a quantized tensor's integers, a
    sparse one densified; nothing for a meta or fake tensor).

    Example:
        >>> bytes(tensor_bytes(torch.tensor([1, 2], dtype=torch.int8)))
        b'\\x01\\x02'
    """
    t = t.detach()
    if t.is_quantized:
        t = t.int_repr()
    if t.is_sparse:
        t = t.to_dense()
    if t.device.type == "meta" or (type(t) is not torch.Tensor and not isinstance(t, nn.Parameter)):
        return b""  # no bytes to read (a meta or fake tensor): its name, dtype and shape only
    t = t.cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else b""


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    found.update(model.named_buffers(remove_duplicate=False))
    graph = _graph_of(model)
    for node in graph.nodes if graph is not None else ():
        if node.op == "get_attr" and node.target not in found:
            value = _attribute(model, str(node.target))
            if isinstance(value, torch.Tensor):
                found[str(node.target)] = value
    return found


def _attribute(model: nn.Module, path: str) -> Any:
    value: Any = model
    for part in path.split("."):
        value = getattr(value, part, None)
    return value


def _literal(value: Any) -> str:
    return "node" if isinstance(value, Node) else repr(value)


def tensors_digest(model: nn.Module) -> str:
    """The digest of what ``model``'s numbers depend on: each parameter, buffer and constant
    (name, dtype, shape, SHA-1 of its bytes) and each quantize / dequantize operator's literal
    arguments (a per-tensor scale and zero point).

    Example:
        >>> import torch
        >>> a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        >>> tensors_digest(a) == tensors_digest(a) != tensors_digest(b)
        True
    """
    lines = []
    for name, t in sorted(_tensors(model).items()):
        data = hashlib.sha1(tensor_bytes(t), usedforsecurity=False).hexdigest()
        lines.append(f"{name} {t.dtype} {tuple(t.shape)} {data}")
    graph = _graph_of(model)
    if graph is not None:
        qdq = quantize_ops() | dequantize_ops()
        for n in graph.nodes:
            if n.op == "call_function" and n.target in qdq:
                lines.append(f"{n.name} " + " ".join(_literal(a) for a in n.args[1:]))
    return digest(lines)


def origin_of(model: nn.Module, tensors: str | None = None) -> str:
    """The ``tensors`` digest of the float model ``model`` descends from: the one its ``meta``
    records (a prepared, converted or transformed model), or its own (a float model; inside
    :func:`known_origin` for it, the digest taken when the block began).

    Example:
        >>> import torch
        >>> m = torch.nn.Linear(2, 2)
        >>> origin_of(m) == tensors_digest(m)
        True
    """
    meta = getattr(model, "meta", None)
    if isinstance(meta, dict) and meta.get(ORIGIN_KEY):
        return str(meta[ORIGIN_KEY])
    if tensors is not None:
        return tensors
    for known, digest in _KNOWN_ORIGINS.get():
        if known is model:
            return digest
    return tensors_digest(model)


#: ``(model, digest)`` of each float model whose digest an enclosing :func:`known_origin` took.
_KNOWN_ORIGINS: ContextVar[tuple[tuple[nn.Module, str], ...]] = ContextVar(
    "qviz_known_origins", default=()
)


@contextmanager
def known_origin(model: nn.Module) -> Iterator[str]:
    """Digest ``model``'s weights once for a block that prepares many variants of it: inside,
    :func:`origin_of` (what every prepare reads its origin from) returns that digest instead of
    hashing the weights again (33 ms a variant on resnet18). For an entry point's own loop
    only, where nothing changes the model in between: a change inside the block is not seen.

    Example:
        >>> import torch
        >>> m = torch.nn.Linear(2, 2)
        >>> with known_origin(m) as digest:
        ...     origin_of(m) == digest == tensors_digest(m)
        True
    """
    digest = origin_of(model)
    token = _KNOWN_ORIGINS.set((*_KNOWN_ORIGINS.get(), (model, digest)))
    try:
        yield digest
    finally:
        _KNOWN_ORIGINS.reset(token)


def record_origin(model: nn.Module, origin: str) -> None:
    """Record in ``model.meta`` (a graph module's) the float model it descends from."""
    if isinstance(getattr(model, "meta", None), dict):
        model.meta[ORIGIN_KEY] = origin


def derived_copy(model: _M) -> _M:
    """A deep copy of ``model`` that keeps its origin: what a function-preserving transform
    (equalization, SmoothQuant) works on, so its output is still read against the float model
    the user started from.

    Example:
        >>> import torch, qviz
        >>> gm = qviz.export(torch.nn.Linear(2, 2).eval(), (torch.randn(1, 2),))
        >>> out = derived_copy(gm)
        >>> with torch.no_grad():
        ...     _ = out.weight.mul_(2)
        >>> fingerprint(out).origin == fingerprint(gm).tensors != fingerprint(out).tensors
        True
    """
    origin = origin_of(model)
    out = copy.deepcopy(model)
    record_origin(out, origin)
    return out


def fingerprint(model: Any) -> Fingerprint:
    """The fingerprint of ``model``: a graph module, an ``ExportedProgram`` or an nn.Module.

    Raises:
        ConfigError: ``model`` is none of these.

    Example:
        >>> import torch
        >>> fingerprint(torch.nn.Sequential(torch.nn.Linear(2, 2))).operators  # '' and '0'
        2
    """
    graph = _graph_of(model)
    if graph is not None:
        lines = _operator_lines(graph)
    elif isinstance(model, nn.Module):
        lines = [f"{name} {type(m).__qualname__}" for name, m in model.named_modules()]
    else:
        raise ConfigError(
            f"a fingerprint needs a model (a graph module, ExportedProgram or nn.Module), got "
            f"{type(model).__name__}"
        )
    if not isinstance(model, nn.Module):  # an ExportedProgram: its graph only
        return Fingerprint(digest(lines), len(lines))
    tensors = tensors_digest(model)
    meta = getattr(model, "meta", None)
    calibrated = str(meta.get(CALIBRATED_KEY, "")) if isinstance(meta, dict) else ""
    return Fingerprint(digest(lines), len(lines), tensors, origin_of(model, tensors), calibrated)


def _accepts(record: Any, this: Fingerprint) -> bool:
    """Whether ``this`` model is one ``record`` measured: its quantized or float model, or the
    prepared model the quantized one was converted from (the same statistics)."""
    measured = record.fingerprint
    accepted = [measured, getattr(record, "float_fingerprint", None)]
    for fp in accepted:
        if not isinstance(fp, Fingerprint):
            continue
        if fp.digest == this.digest and (not fp.tensors or fp.tensors == this.tensors):
            return True
        if fp.digest == this.digest and not this.tensors:  # an ExportedProgram: its graph only
            return True
    return bool(measured.calibrated) and measured.calibrated == this.tensors


def _closest(record: Any, this: Fingerprint) -> Fingerprint:
    """Of the record's fingerprints, the one with ``this`` model's operators, if any."""
    measured = record.fingerprint
    other = getattr(record, "float_fingerprint", None)
    if isinstance(other, Fingerprint) and other.digest == this.digest != measured.digest:
        return other
    return measured


def check_fingerprint(record: Any, model: Any, where: str, *, what: str = "the report") -> None:
    """Refuse ``record`` (a numeric report, or any object with ``.fingerprint``) when it
    measured another model than ``model``: other operators, or the same operators with other
    weights, qparams or statistics. A record without a fingerprint (a table built by hand) is
    left to the caller's own checks.

    Args:
        record: the record; its ``fingerprint`` and, if any, ``float_fingerprint`` (the float
            model it was compared with) are the models it accepts, and the prepared model the
            quantized one was converted from (its statistics unchanged since).
        model: the model it is handed with.
        where: the entry point, for the message (``"export_onnx(report=...)"``).
        what: what the record is, for the message.

    Raises:
        ConfigError: saying which of the two differs, with both models' fingerprints and the fix.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <...>
        >>> model = torch.nn.Linear(2, 2)
        >>> record = SimpleNamespace(fingerprint=fingerprint(model))
        >>> check_fingerprint(record, model, "here")   # the same model: accepted
        >>> check_fingerprint(record, torch.nn.ReLU(), "here")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.ModelMismatchError: here: the report measured another model than ... other \
operators (model ... (1 operator) against model ... (1 operator)); run qviz.numeric.compare ...
        >>> check_fingerprint(record, torch.nn.Linear(2, 2), "here")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.ModelMismatchError: here: the report measured another model than ... the \
same operators with other weights: made from another float model; run qviz.numeric.compare ...
    """
    measured = getattr(record, "fingerprint", None)
    if not isinstance(measured, Fingerprint):
        return
    this = fingerprint(model)
    if _accepts(record, this):
        return
    why = _closest(record, this).difference(this) or "another model"
    raise ModelMismatchError(
        f"{where}: {what} measured another model than this one: {why}; run "
        f"qviz.numeric.compare on this model (compare(float_model, quantized, data)) and pass "
        f"its report"
    )


def check_same_model(made_from: Fingerprint, model: Any, where: str, *, what: str) -> None:
    """Refuse ``model`` unless it is the model ``made_from`` fingerprinted (a lowered program's
    converted model, a search's float model), saying which part differs.

    Args:
        made_from: the fingerprint the record kept.
        model: the model handed with it.
        where: the entry point and argument, for the message.
        what: what was made from it, for the message (``"the lowered program"``).

    Raises:
        ConfigError: ``model`` has other operators, weights, qparams or statistics.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(2, 2)
        >>> check_same_model(fingerprint(model), model, "here", what="the record")
    """
    this = fingerprint(model)
    if this == made_from or (this.digest == made_from.digest and not this.tensors):
        return  # the same model, or its ExportedProgram (whose tensors are not read)
    why = made_from.difference(this) or "another model"
    raise ModelMismatchError(
        f"{where}: {what} was made from another model than this one: {why}; pass the model it "
        f"was made from, or make it again from this one"
    )


def check_lineage(float_model: Any, quantized: Any, where: str) -> None:
    """Refuse a float reference that is not the float model ``quantized`` was prepared from
    (other weights, its BatchNorm folded away, another model of the same graph). A quantized
    model that records no origin (a quant_nn model, one made outside qviz) is not checked.

    Args:
        float_model: the float model the user passed as the reference.
        quantized: a prepared or converted model (or a transform of one).
        where: the entry point, for the message.

    Raises:
        ConfigError: naming both origins and the fix.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> prepared = qviz.prepare_pt2e(gm, q)
        >>> check_lineage(gm, prepared, "here")   # its own float model: accepted
        >>> other = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
        >>> check_lineage(other, prepared, "here")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.ModelMismatchError: here: the quantized model was prepared from another float \
model (weights ...) than float_model (weights ...): pass the float model you gave ...
    """
    meta = getattr(quantized, "meta", None)
    recorded = meta.get(ORIGIN_KEY) if isinstance(meta, dict) else None
    if not recorded or not isinstance(float_model, nn.Module):
        return
    given = origin_of(float_model)
    if given == recorded:
        return
    raise ModelMismatchError(
        f"{where}: the quantized model was prepared from another float model (weights "
        f"{recorded}) than float_model (weights {given}): pass the float model you gave "
        f"prepare_pt2e (its BatchNorm unfolded, its weights as they were), or prepare, "
        f"calibrate and convert this one"
    )


def check_converted_from(record: Any, prepared: Any, where: str) -> None:
    """Refuse ``prepared`` unless ``record`` (a report) measured a model converted from it with
    the statistics it holds now: not another model of the same graph, not the same model
    calibrated again, or with other data, since.

    Args:
        record: the report (``record.fingerprint`` is its quantized model's); one without a
            fingerprint, or whose quantized model records no conversion, is not checked.
        prepared: the prepared model handed with it.
        where: the entry point and argument, for the message.

    Raises:
        ConfigError: saying which of the two differs, and the fix.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> record = SimpleNamespace(fingerprint=Fingerprint("0123456789abcdef", 1))
        >>> check_converted_from(record, torch.nn.Linear(2, 2), "here")  # nothing recorded
    """
    measured = getattr(record, "fingerprint", None)
    if not isinstance(measured, Fingerprint) or not measured.calibrated:
        return
    this = fingerprint(prepared)
    if this.tensors == measured.calibrated:
        return
    if this.digest != measured.digest:
        why = f"other operators ({measured} against {this})"
    elif measured.origin and this.origin != measured.origin:
        why = "the same operators with other weights: made from another float model"
    else:
        why = "the same model with other observer statistics (calibrated again, or otherwise)"
    raise ModelMismatchError(
        f"{where}: the report's quantized model was not converted from this prepared model: "
        f"{why}; pass the prepared model as it was when you converted it, or convert this one "
        f"and compare again"
    )
