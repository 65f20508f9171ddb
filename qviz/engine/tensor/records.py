"""What every TensorQuantizer of a quant_nn model is and does, as frozen records.

The module-level flow (:mod:`qviz.engine.tensor.quant_nn`) keeps its decisions inside the
TensorQuantizers: bits, axis, the calibrated amax and the method that picked it. This module
reads them into :class:`QuantizerRecord` values, from the model itself or from a graph module
``qviz.export`` captured from it, so that views draw them without opening a quantizer or
reverse-engineering its arithmetic.

In an exported graph a quantizer is a handful of ATen nodes (``div`` of the amax buffer by
``quant_max``, ``reciprocal``, ``mul``, ``round``, ``clamp``, ``mul``; or one
``fake_quantize_per_*_affine`` under ``fb_fake_quant``). They are found by the innermost
``nn_module_stack`` entry (the quantizer's module path) and say what they are through the
:meth:`~qviz.engine.tensor.tensor_quantizer.TensorQuantizer.facts` the quantizer recorded on them
while exporting. Each call of a quantizer is one :class:`QuantizerCall`: its nodes, the node feeding
them (``producer``) and the nodes reading their result (``consumers``): the edge it quantizes.

Scales follow PyTorch's convention, ``scale = amax / quant_max`` (:func:`symmetric_scale`).

Example:
    >>> import torch, qviz
    >>> from qviz.engine import quant_nn
    >>> model = torch.nn.Sequential(quant_nn.QuantLinear(4, 2), torch.nn.ReLU())
    >>> model[0].input_quantizer.amax = 2.54
    >>> [(r.name, r.role, r.amax_text) for r in quantizer_records(model)]
    [('0._input_quantizer', 'input', '2.54'), ('0._weight_quantizer', 'weight', 'dynamic')]
    >>> rec = quantizer_records(qviz.export(model, (torch.randn(1, 4),)))[0]
    >>> rec.edges, f"{rec.scale[0]:.3g}"
    ((('input_1', 'linear'),), '0.02')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.fx import GraphModule, Node

from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.qparams import quant_range, symmetric_scale
from qviz.engine.tensor.tensor_quantizer import EXPORT_META_KEY, TensorQuantizer
from qviz.errors import ConfigError

_TYPE_NAME = f"{TensorQuantizer.__module__}.{TensorQuantizer.__qualname__}"


def quantizer_role(name: str) -> str:
    """``"weight"`` for a weight quantizer's module path, else ``"input"``.

    Example:
        >>> quantizer_role("conv1.0._weight_quantizer"), quantizer_role("lstm._input_quantizers.1")
        ('weight', 'input')
    """
    last = name.rpartition(".")[2]
    return "weight" if "weight_quantizer" in last or "_weight_quantizers." in name else "input"


def short_values(values: tuple[float, ...], *, count: bool = True) -> str:
    """``"4.52"`` for one value, ``"0.0785..0.131 (64 ch)"`` for several (the channel count
    left out with ``count=False``), ``"dynamic"`` for none.

    Example:
        >>> short_values((4.5173,)), short_values((0.1, 0.3, 0.2)), short_values(())
        ('4.52', '0.1..0.3 (3 ch)', 'dynamic')
    """
    if not values:
        return "dynamic"
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{min(values):.3g}..{max(values):.3g}" + (f" ({len(values)} ch)" if count else "")


@dataclass(frozen=True)
class QuantizerCall:
    """One call of a quantizer in an exported graph: the edge ``producer -> consumers`` it
    quantizes and the nodes it became (``output`` is the one whose value the consumers read)."""

    producer: str | None
    consumers: tuple[str, ...]
    nodes: tuple[str, ...]
    output: str


@dataclass(frozen=True, kw_only=True)
class QuantizerRecord:
    """One TensorQuantizer: where it is, what grid it quantizes to and with which amax.

    ``method`` is the calibration method that computed the loaded amax (``"entropy"``,
    ``"percentile 99.9"``; ``calibrated`` is then True), or the descriptor's ``calib_method``
    when the amax came from elsewhere (set by hand, loaded from a state_dict). ``enabled`` is
    False for a quantizer that is disabled or has quantization off (an exported graph holds no
    nodes for it, so only records read from a model show it). ``amax`` and ``scale`` hold one
    value per channel (empty when ``dynamic``: the amax is computed from each input); ``calls``
    are empty for records read from a model.
    """

    name: str
    role: str
    layer: str
    layer_type: str
    num_bits: int
    unsigned: bool
    narrow_range: bool
    axis: tuple[int, ...] | None
    quant_min: int
    quant_max: int
    method: str
    calibrated: bool
    calibrator: str
    enabled: bool
    dynamic: bool
    amax: tuple[float, ...] = field(default=(), repr=False)
    scale: tuple[float, ...] = field(default=(), repr=False)
    calls: tuple[QuantizerCall, ...] = field(default=(), repr=False)

    @property
    def dtype(self) -> str:
        """``"int8"``, ``"uint4"``, ...: the integer grid's name."""
        return f"{'u' if self.unsigned else ''}int{self.num_bits}"

    @property
    def per_channel(self) -> bool:
        return len(self.amax) > 1 or self.axis is not None

    @property
    def amax_text(self) -> str:
        """``"4.52"``, ``"0.0785..0.131 (64 ch)"`` or ``"dynamic"``."""
        return short_values(self.amax)

    @property
    def scale_text(self) -> str:
        """The scale as :attr:`amax_text` writes the amax."""
        return short_values(self.scale)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every graph node this quantizer became, over all its calls."""
        return tuple(n for call in self.calls for n in call.nodes)

    @property
    def edges(self) -> tuple[tuple[str, str], ...]:
        """``(producer, consumer)`` for each edge it quantizes in the graph."""
        return tuple(
            (call.producer, c) for call in self.calls if call.producer for c in call.consumers
        )

    def __repr__(self) -> str:
        state = "" if self.calibrated or self.dynamic else " (amax not calibrated here)"
        state += "" if self.enabled else " disabled"
        amax = short_values(self.amax, count=False)
        amax = "dynamic" if self.dynamic else f"amax={amax} scale={self.scale_text}"
        where = f" on {', '.join(f'{p} -> {c}' for p, c in self.edges)}" if self.edges else ""
        return (
            f"QuantizerRecord({self.name!r}, {self.role} of {self.layer or 'the model'}, "
            f"{self.dtype} {amax} {self.method}{state}{where})"
        )


def quantizer_path(node: Node) -> str | None:
    """The TensorQuantizer module path ``node`` was traced in, or None.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine import quant_nn
        >>> gm = qviz.export(quant_nn.QuantLinear(2, 2), (torch.ones(1, 2),))
        >>> sorted({quantizer_path(n) for n in gm.graph.nodes} - {None})
        ['_input_quantizer', '_weight_quantizer']
    """
    if node.op != "call_function":  # get_attr and guard calls carry no quantizer arithmetic
        return None
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    value = list(stack.values())[-1]
    if isinstance(value, tuple) and len(value) == 2 and str(value[1]) == _TYPE_NAME:
        return str(value[0])
    return None


def is_quantizer_node(node: Node) -> bool:
    """Whether ``node`` is part of a TensorQuantizer's arithmetic in an exported graph."""
    return quantizer_path(node) is not None


def _layer_of(model: nn.Module, name: str) -> tuple[str, str]:
    """The deepest module above ``name`` that is not a container: the layer it quantizes for."""
    path = name.rpartition(".")[0]
    while path:
        module = model.get_submodule(path)
        if not isinstance(module, nn.ModuleList | nn.ModuleDict | nn.Sequential):
            return path, type(module).__name__
        path = path.rpartition(".")[0]
    return "", type(model).__name__ if name != "" else ""


def _numbers(
    facts: Mapping[str, object], amax: torch.Tensor | None
) -> tuple[tuple[float, ...], tuple[float, ...], int, int]:
    bits, unsigned = int(facts["num_bits"]), bool(facts["unsigned"])  # type: ignore[call-overload]
    qmin, qmax = quant_range(bits, unsigned=unsigned, narrow_range=bool(facts["narrow_range"]))
    if amax is None:
        return (), (), qmin, qmax
    values = amax.detach().float().cpu().reshape(-1)
    if facts.get("scale_amax"):
        values = values * float(facts["scale_amax"])  # type: ignore[arg-type]
    scale = symmetric_scale(values, num_bits=bits, unsigned=unsigned)
    return tuple(values.tolist()), tuple(scale.tolist()), qmin, qmax


def _record(
    name: str,
    layer: tuple[str, str],
    facts: Mapping[str, object],
    amax: torch.Tensor | None,
    calls: tuple[QuantizerCall, ...] = (),
) -> QuantizerRecord:
    values, scale, qmin, qmax = _numbers(facts, amax)
    axis = facts.get("axis")
    enabled = not facts.get("disabled", False) and bool(facts.get("quant", True))
    return QuantizerRecord(
        name=name, role=quantizer_role(name), layer=layer[0], layer_type=layer[1],
        num_bits=int(facts["num_bits"]), unsigned=bool(facts["unsigned"]),  # type: ignore[call-overload]
        narrow_range=bool(facts["narrow_range"]),
        axis=None if axis is None else tuple(int(a) for a in axis),  # type: ignore[union-attr]
        quant_min=qmin, quant_max=qmax,
        method=str(facts.get("amax_method") or facts["calib_method"]),
        calibrated=bool(facts.get("amax_method")), calibrator=str(facts["calibrator"]),
        enabled=enabled, dynamic=amax is None, amax=values, scale=scale, calls=calls,
    )  # fmt: skip


def _module_records(model: nn.Module) -> tuple[QuantizerRecord, ...]:
    return tuple(
        _record(name, _layer_of(model, name), tq.facts(), tq.amax)
        for name, tq in model.named_modules()
        if isinstance(tq, TensorQuantizer)
    )


def _components(nodes: list[Node]) -> list[list[Node]]:
    """Split one quantizer's nodes into its calls: the connected pieces, in graph order."""
    members = set(nodes)
    parent = {n: n for n in nodes}

    def find(n: Node) -> Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in nodes:
        for arg in n.all_input_nodes:
            if arg in members:
                parent[find(arg)] = find(n)
    pieces: dict[Node, list[Node]] = {}
    for n in nodes:
        pieces.setdefault(find(n), []).append(n)
    return list(pieces.values())


def _call(name: str, piece: list[Node]) -> tuple[QuantizerCall, Node | None]:
    """The call ``piece`` makes, and the get_attr node of the quantizer's amax it reads."""
    members = set(piece)
    own = f"{name}." if name else ""
    producer, amax_node = None, None
    for n in piece:
        for arg in n.all_input_nodes:
            if arg in members:
                continue
            if (
                arg.op == "get_attr"
                and str(arg.target).startswith(own)
                and "_amax" in str(arg.target)
            ):
                amax_node = arg
            elif producer is None:
                producer = arg
    outputs = [n for n in piece if any(u not in members for u in n.users)]
    output = outputs[-1] if outputs else piece[-1]
    consumers = tuple(dict.fromkeys(u.name for u in output.users if u not in members))
    call = QuantizerCall(
        producer.name if producer is not None else None,
        consumers,
        tuple(n.name for n in piece),
        output.name,
    )
    return call, amax_node


def _facts_of(name: str, nodes: Iterable[Node]) -> Mapping[str, object]:
    for n in nodes:
        facts = (n.meta.get("custom") or {}).get(EXPORT_META_KEY)
        if isinstance(facts, Mapping):
            return facts
    raise ConfigError(
        f"the graph's nodes of TensorQuantizer {name!r} do not say what it is (no "
        f"meta['custom'][{EXPORT_META_KEY!r}]): export the quant_nn model again with "
        f"qviz.export from this version of qviz"
    )


def _graph_layer(nodes: list[Node], name: str) -> tuple[str, str]:
    stack = list((nodes[0].meta.get("nn_module_stack") or {}).values())
    for value in reversed(stack[:-1]):
        if isinstance(value, tuple) and len(value) == 2 and name.startswith(f"{value[0]}."):
            return str(value[0]), str(value[1]).rsplit(".", 1)[-1]
    return name.rpartition(".")[0], ""


def _graph_records(gm: GraphModule) -> tuple[QuantizerRecord, ...]:
    by_name: dict[str, list[Node]] = {}
    for n in gm.graph.nodes:
        path = quantizer_path(n)
        if path is not None:
            by_name.setdefault(path, []).append(n)
    records = []
    for name, nodes in by_name.items():
        facts = _facts_of(name, nodes)
        calls, amax_node = [], None
        for piece in _components(nodes):
            call, found = _call(name, piece)
            calls.append(call)
            amax_node = amax_node or found
        amax = None
        if not facts.get("dynamic"):
            target = amax_node if amax_node is not None else f"{name}._amax"
            amax = get_attr_value(gm, target, default=None)
        layer = _graph_layer(nodes, name)
        records.append(_record(name, layer, facts, amax, tuple(calls)))
    return tuple(records)


def quantizer_records(model: nn.Module) -> tuple[QuantizerRecord, ...]:
    """One :class:`QuantizerRecord` per TensorQuantizer of ``model``.

    Args:
        model: a model holding TensorQuantizers (quant_nn layers; every quantizer, the disabled
            ones too, in ``named_modules`` order), or a graph module :func:`qviz.export`
            captured from one (the quantizers that quantize, in graph order, with the nodes
            and edges of their calls; the amax is read from the graph module's buffers, so a
            dynamic quantizer has none). A model without quantizers gives ``()``.

    Raises:
        ConfigError: ``model`` is not an nn.Module, or an exported quantizer's nodes carry no
            description (a graph exported by an older qviz).

    Example:
        >>> import torch
        >>> from qviz.engine import quant_nn
        >>> pool = quant_nn.QuantMaxPool2d(2)
        >>> pool.input_quantizer.disable()
        >>> quantizer_records(pool)
        (QuantizerRecord('_input_quantizer', input of the model, int8 dynamic max disabled),)
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"quantizer_records reads an nn.Module holding TensorQuantizers or the graph module "
            f"qviz.export captured from one, got {type(model).__name__}"
        )
    if isinstance(model, GraphModule):
        return _graph_records(model)
    return _module_records(model)
