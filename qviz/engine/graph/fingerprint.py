"""Which model a record measured: a stable fingerprint of a model's graph (house rule 14).

A numeric report, a plan or a lowered model carries the :class:`Fingerprint` of the model it
measured; a consumer handed another model's record refuses it (:func:`check_fingerprint`)
instead of matching whatever node names happen to coincide.

What is digested (SHA-256, first 16 hex digits):

* a graph (``qviz.export``, prepared, converted, or an ``ExportedProgram``): each operator, in
  graph order, as ``name op target`` (``linear call_function aten.linear.default``). Quantize,
  dequantize and choose_qparams operators, observers (``call_module``), inputs, outputs and
  parameters are left out, so the float, prepared and converted graphs of one model (without a
  folded BatchNorm), their deep copies and the ``ExportedProgram`` of the same model share a
  fingerprint, and a model with other operators or names does not;
* an eager module (a quant_nn model): each submodule as ``name class``.

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

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.fx import Graph, GraphModule

from qviz.engine.graph.qdq_ops import choose_qparams_ops, dequantize_ops, quantize_ops
from qviz.errors import ConfigError


@dataclass(frozen=True)
class Fingerprint:
    """A model's fingerprint: the digest and how many operators (or modules) it covers.

    Example:
        >>> str(Fingerprint("0123456789abcdef", 3))
        'model 0123456789abcdef (3 operators)'
    """

    digest: str
    operators: int

    def __str__(self) -> str:
        plural = "" if self.operators == 1 else "s"
        return f"model {self.digest} ({self.operators} operator{plural})"


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
    return Fingerprint(digest(lines), len(lines))


def check_fingerprint(record: Any, model: Any, where: str, *, what: str = "the report") -> None:
    """Refuse ``record`` (a numeric report, or any object with ``.fingerprint``) when it
    measured another model than ``model``. A record without a fingerprint (a table built by
    hand) is left to the caller's own checks.

    Args:
        record: the record; its ``fingerprint`` and, if any, ``float_fingerprint`` (the float
            model it was compared with) are the models it accepts.
        model: the model it is handed with.
        where: the entry point, for the message (``"export_onnx(report=...)"``).
        what: what the record is, for the message.

    Raises:
        ConfigError: naming both models' fingerprints and the fix.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> record = SimpleNamespace(fingerprint=fingerprint(torch.nn.ReLU()))
        >>> check_fingerprint(record, torch.nn.ReLU(), "here")   # the same model: accepted
        >>> check_fingerprint(record, torch.nn.Linear(2, 2), "here")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: here: the report measured another model (model ... (1 operator)) \
than this one (model ... (1 operator)); run qviz.numeric.compare on this model ...
    """
    measured = getattr(record, "fingerprint", None)
    if not isinstance(measured, Fingerprint):
        return
    accepted = {measured, getattr(record, "float_fingerprint", None)}
    this = fingerprint(model)
    if this in accepted:
        return
    raise ConfigError(
        f"{where}: {what} measured another model ({measured}) than this one ({this}); run "
        f"qviz.numeric.compare on this model (compare(float_model, quantized, data)) and pass "
        f"its report"
    )
