"""The causes :func:`qviz.numeric.diagnose` tells apart, one rule per cause.

Each rule reads one poor layer's report row (:class:`~qviz.numeric.NumericReport`), the
plan and the observers of the calibrated prepared model, and the per-channel ranges measured
when data was given; it returns ``(evidence, prescription)`` when its cause explains the layer,
else None. :data:`RULES` lists them in the order they are tried: the first that matches names
the cause.

Example:
    >>> [cause.value for cause, _ in RULES]  # doctest: +NORMALIZE_WHITESPACE
    ['shared group', 'outlier channels', 'outlier channels', 'slice', 'degenerate range',
     'clipping', 'rounding']
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch
from torch.fx import GraphModule, Node

from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.graph.node_data import op_name
from qviz.engine.pt2e.plan import QuantPlan, TensorRecord
from qviz.engine.qparams import affine_qparams, bits_of_range
from qviz.errors import QvizError
from qviz.numeric.measure.metrics import histogram_clipped_fraction

_WEIGHTED = ("conv", "linear")
_OVERRIDE = "qviz.engine.quantizers.override.OverrideQuantizer"
_PASS_THROUGH = ("view", "reshape", "clone", "permute", "transpose", "contiguous", "flatten")


class Cause(StrEnum):
    """Why a layer loses accuracy (see :func:`qviz.numeric.diagnose`)."""

    OUTLIER_CHANNELS = "outlier channels"
    CLIPPING = "clipping"
    ROUNDING = "rounding"
    SHARED_GROUP = "shared group"
    DEGENERATE = "degenerate range"
    SLICE = "slice"


#: The fill of each cause when a graph is coloured by cause (light enough for black text).
CAUSE_COLOURS = {
    Cause.OUTLIER_CHANNELS: "#fdae6b", Cause.CLIPPING: "#f1b6da", Cause.ROUNDING: "#fee08b",
    Cause.SHARED_GROUP: "#bcbddc", Cause.DEGENERATE: "#bdbdbd", Cause.SLICE: "#9ecae1",
}  # fmt: skip


@dataclass(frozen=True)
class Prescription:
    """What to do about a finding, and which qviz function does it.

    Attributes:
        action: one line for people.
        function: the qviz function (dotted path) that applies it.
        arguments: what to pass it, as ``(name, value)`` pairs.

    Example:
        >>> p = Prescription("keep mul in float", "qviz.numeric.fallback",
        ...                  (("nodes_or_module_names", "mul"),))
        >>> p.function, dict(p.arguments)["nodes_or_module_names"]
        ('qviz.numeric.fallback', 'mul')
    """

    action: str
    function: str
    arguments: tuple[tuple[str, Any], ...] = ()


@dataclass(kw_only=True)
class Context:
    """What every rule reads: the report's rows, the prepared model and its plan, the
    measured per-channel absolute maxima (``{node name: tensor}``; empty without data)."""

    rows: dict[str, dict[str, Any]]
    prepared: GraphModule
    plan: QuantPlan
    threshold_db: float
    outlier_factor: float
    channel_amax: dict[str, torch.Tensor] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.nodes = {n.name: n for n in self.prepared.graph.nodes}
        self.observers = self.plan.observer_names()

    def source(self, arg: Any) -> Node | None:
        """The node behind ``arg``, past the observer calls prepare inserted."""
        while isinstance(arg, Node) and arg.op == "call_module" and arg.target in self.observers:
            arg = arg.args[0]
        return arg if isinstance(arg, Node) else None

    def records(self, name: str) -> list[TensorRecord]:
        """The plan's records of ``name``'s output and input edges."""
        return [r for r in self.plan.tensors if name in (r.tensor.producer, r.tensor.consumer)]

    def observer(self, group: int) -> Any:
        return self.prepared.get_submodule(self.plan.group(group).observer)

    def qparams(self, group: int) -> tuple[float, int, int, int] | None:
        """``(scale, zero_point, quant_min, quant_max)`` of a per-tensor group, else None."""
        try:
            obs = self.observer(group)
            scale, zp = obs.calculate_qparams()
        except (QvizError, AttributeError, RuntimeError):  # no data, or no observer to read
            return None
        if scale.numel() != 1:
            return None
        return float(scale), int(zp), int(obs.quant_min), int(obs.quant_max)


def _value(row: dict[str, Any], key: str) -> float:
    value = row.get(key, math.nan)
    return float(value) if value is not None else math.nan


def _spread(amax: torch.Tensor) -> tuple[float, int]:
    """``max / median`` of per-channel absolute maxima, and the largest channel's index."""
    amax = amax.double().reshape(-1)
    median = float(amax.median())
    index = int(amax.argmax())
    if median <= 0:
        return (math.inf if float(amax[index]) > 0 else 1.0), index
    return float(amax[index]) / median, index


def _weight(ctx: Context, node: Node) -> tuple[str, torch.Tensor, TensorRecord] | None:
    """A conv / linear's weight: its get_attr node name, value and the plan's edge record."""
    if len(node.args) < 2:
        return None
    src = ctx.source(node.args[1])
    if src is None or src.op != "get_attr":
        return None
    rec = next((r for r in ctx.records(node.name) if r.tensor.producer == src.name), None)
    value = get_attr_value(ctx.prepared, src, default=None)
    if rec is None or not isinstance(value, torch.Tensor) or value.dim() < 2:
        return None
    return src.name, value.detach(), rec


def _per_tensor(ctx: Context, rec: TensorRecord) -> bool:
    return (ctx.plan.group(rec.group).spec.qscheme or "").startswith("per_tensor")


def shared_group(row: dict[str, Any], ctx: Context) -> tuple | None:
    """Members of one observer group whose own float ranges (the report's) differ widely."""
    name = row["node"]
    for group in dict.fromkeys(r.group for r in ctx.records(name)):
        record = ctx.plan.group(group)
        ranges = {}
        for ref in record.members:
            other = ctx.rows.get(ref.producer)
            if other is not None:
                span = max(abs(_value(other, "float_min")), abs(_value(other, "float_max")))
                if math.isfinite(span) and span > 0:
                    ranges[ref.producer] = span
        if len(ranges) < 2:
            continue
        small, large = min(ranges, key=ranges.get), max(ranges, key=ranges.get)
        ratio = ranges[large] / ranges[small]
        if ratio < ctx.outlier_factor:
            continue
        evidence = (("group", group), ("range_ratio", ratio), ("small_member", small),
                    ("small_range", ranges[small]), ("large_member", large),
                    ("large_range", ranges[large]))  # fmt: skip
        edits = {str(ref): {"observer": "HistogramObserver"}
                 for ref in record.members if ref.producer == small}  # fmt: skip
        return evidence, Prescription(
            f"quantize {small} apart from {large} (editing a shared spec unshares it), or "
            f"rescale the branch: one grid for both spends {ratio:.0f}x its step on {small}",
            _OVERRIDE, (("overrides", edits),),
        )  # fmt: skip
    return None


def outlier_weights(row: dict[str, Any], ctx: Context) -> tuple | None:
    """A conv / linear whose per-tensor weight has output channels far wider than the rest."""
    node = ctx.nodes.get(row["node"])
    if node is None or not any(k in op_name(node) for k in _WEIGHTED):
        return None
    weight = _weight(ctx, node)
    if weight is None or not _per_tensor(ctx, weight[2]):
        return None
    name, value, rec = weight
    axis = 1 if "transpose" in op_name(node) else 0
    amax = value.abs().transpose(0, axis).reshape(value.shape[axis], -1).amax(1)
    spread, channel = _spread(amax)
    if spread < ctx.outlier_factor:
        return None
    evidence = (("tensor", name), ("channel_spread", spread), ("widest_channel", channel),
                ("weight_sqnr", _value(row, "weight_sqnr")),
                ("local_worst_channel_sqnr", _value(row, "local_worst_channel_sqnr")))  # fmt: skip
    edit = {str(rec.tensor): {"qscheme": "per_channel_symmetric", "ch_axis": axis}}
    return evidence, Prescription(
        f"quantize {name} per channel: channel {channel} is {spread:.0f}x the median "
        f"channel's range, so one scale starves the others",
        _OVERRIDE, (("overrides", edit),),
    )  # fmt: skip


def _upstream(ctx: Context, node: Node | None, depth: int = 4) -> list[Node]:
    """``node`` and its producers through one-input reshaping ops (at most ``depth``)."""
    out = []
    while node is not None and depth:
        out.append(node)
        if not any(k in op_name(node) for k in _PASS_THROUGH) or not node.args:
            break
        node, depth = ctx.source(node.args[0]), depth - 1
    return out


def _consumer(ctx: Context, node: Node) -> Node | None:
    """The first conv / linear reading ``node``'s output (past observers)."""
    todo = list(node.users)
    while todo:
        user = todo.pop(0)
        if user.op == "call_module" and user.target in ctx.observers:
            todo.extend(user.users)
        elif any(k in op_name(user) for k in _WEIGHTED):
            return user
    return None


def _activation_prescription(
    ctx: Context, src: Node, consumer: Node | None, spread: float
) -> Prescription:
    """SmoothQuant for a linear after a LayerNorm, equalization for conv / linear pairs through
    a relu, SmoothQuant on the consumer otherwise, float when nothing quantized reads it."""
    chain = _upstream(ctx, src)
    why = f"its channels' ranges spread {spread:.0f}x under one per-tensor scale"
    if consumer is None:
        return Prescription(f"keep {src.name} in float: {why}", "qviz.numeric.fallback",
                            (("nodes_or_module_names", src.name),))  # fmt: skip
    after_norm = any("layer_norm" in op_name(n) for n in chain)
    producer = chain[-1]
    if op_name(producer) in ("relu", "relu_", "hardtanh", "hardtanh_") and producer.args:
        producer = ctx.source(producer.args[0]) or producer
    if not after_norm and any(k in op_name(producer) for k in _WEIGHTED):
        pair = (producer.name, consumer.name)
        return Prescription(
            f"equalize {pair[0]} and {pair[1]} (cross-layer equalization): {why}",
            "qviz.engine.repair.cross_layer_equalization", (("pairs", (pair,)),),
        )  # fmt: skip
    return Prescription(
        f"move the activation's channel ranges into {consumer.name}'s weights (SmoothQuant): "
        f"{why}" + (" after a LayerNorm" if after_norm else ""),
        "qviz.engine.repair.smooth_quant", (("nodes", (consumer.name,)),),
    )  # fmt: skip


def outlier_activations(row: dict[str, Any], ctx: Context) -> tuple | None:
    """An activation (a conv / linear's input, or the layer's output) with a per-tensor grid
    whose measured channel ranges spread widely (needs data)."""
    node = ctx.nodes.get(row["node"])
    if node is None or not ctx.channel_amax:
        return None
    candidates = [(node, _consumer(ctx, node))]
    if any(k in op_name(node) for k in _WEIGHTED) and node.args:
        src = ctx.source(node.args[0])
        if src is not None:
            candidates.insert(0, (src, node))
    best = None
    for src, consumer in candidates:
        amax = ctx.channel_amax.get(src.name)
        recs = [r for r in ctx.plan.tensors if r.tensor.producer == src.name]
        if amax is None or amax.numel() < 2 or not recs:
            continue
        if not all(_per_tensor(ctx, r) for r in recs):
            continue
        spread, channel = _spread(amax)
        if spread >= ctx.outlier_factor and (best is None or spread > best[0]):
            best = (spread, channel, src, consumer)
    if best is None:
        return None
    spread, channel, src, consumer = best
    evidence = (("tensor", src.name), ("channel_spread", spread), ("widest_channel", channel),
                ("local_sqnr", _value(row, "local_sqnr")),
                ("local_worst_channel_sqnr", _value(row, "local_worst_channel_sqnr")))  # fmt: skip
    return evidence, _activation_prescription(ctx, src, consumer, spread)


def broken_slice(row: dict[str, Any], ctx: Context) -> tuple | None:
    """The tensor-wide SQNR passes while one token or channel is far below the threshold."""
    whole = _value(row, "local_sqnr")
    if not whole >= ctx.threshold_db:
        return None
    options = []
    for kind in ("token", "channel"):
        value = _value(row, f"local_worst_{kind}_sqnr")
        if value < ctx.threshold_db:
            options.append((value, kind, int(row.get(f"worst_{kind}", -1))))
    if not options:
        return None
    value, kind, index = min(options)
    name = row["node"]
    evidence = (("local_sqnr", whole), (f"local_worst_{kind}_sqnr", value),
                (f"worst_{kind}", index))  # fmt: skip
    offset = _value(row, "worst_channel_bias_share") if kind == "channel" else math.nan
    if offset >= 0.5:  # the channel's error is mostly a constant: what bias correction removes
        return (*evidence, ("worst_channel_bias_share", offset)), Prescription(
            f"correct {name}'s bias: {offset:.0%} of channel {index}'s error ({value:.1f} dB, "
            f"the tensor {whole:.1f} dB) is a constant offset",
            "qviz.engine.repair.bias_correction", (("nodes", (name,)),),
        )  # fmt: skip
    node = ctx.nodes.get(name)
    weight = _weight(ctx, node) if node is not None and kind == "channel" else None
    if weight is not None and _per_tensor(ctx, weight[2]):
        edit = {str(weight[2].tensor): {"qscheme": "per_channel_symmetric", "ch_axis": 0}}
        return evidence, Prescription(
            f"quantize {weight[0]} per channel: channel {index} of {name} is at {value:.1f} dB "
            f"while the tensor is at {whole:.1f} dB", _OVERRIDE, (("overrides", edit),),
        )  # fmt: skip
    return evidence, Prescription(
        f"keep {name} in float (or give its {kind}s their own grid, e.g. 16-bit activations): "
        f"{kind} {index} is at {value:.1f} dB while the tensor is at {whole:.1f} dB",
        "qviz.numeric.fallback", (("nodes_or_module_names", name),),
    )  # fmt: skip


def _zero_shares(ctx: Context, rec: TensorRecord) -> tuple[float, float, float, float] | None:
    """``(zeros before, zeros after quantizing, scale, max |x|)`` of one observed tensor: exact
    for a constant, from its observer's histogram (or range) for an activation."""
    qparams = ctx.qparams(rec.group)
    if qparams is None:
        return None
    scale, zp, qmin, qmax = qparams
    src = ctx.nodes.get(rec.tensor.producer)
    if src is not None and src.op == "get_attr":
        value = get_attr_value(ctx.prepared, src, default=None)
        if not isinstance(value, torch.Tensor) or not value.numel():
            return None
        v = value.detach().float()
        fq = torch.fake_quantize_per_tensor_affine(v, scale, zp, qmin, qmax)
        zeros = float((v == 0).double().mean()), float((fq == 0).double().mean())
        return *zeros, scale, float(v.abs().max())
    obs = ctx.observer(rec.group)
    low, high = getattr(obs, "min_val", None), getattr(obs, "max_val", None)
    if not isinstance(low, torch.Tensor) or low.numel() != 1 or not bool(high >= low):
        return None
    low, high = float(low), float(high)
    max_abs, counts = max(abs(low), abs(high)), getattr(obs, "histogram", None)
    if isinstance(counts, torch.Tensor) and float(counts.sum()) > 0 and high > low:
        edges = torch.linspace(low, high, counts.numel() + 1, dtype=torch.float64)
        after = 1.0 - histogram_clipped_fraction(counts, edges, -scale / 2, scale / 2)[0]
        # zero before: within a bin of 0 (a ReLU's exact zeros), which the histogram can't split
        near = min(float(edges[1] - edges[0]), scale / 2)
        before = 1.0 - histogram_clipped_fraction(counts, edges, -near, near)[0]
        return before, after, scale, max_abs
    after = 1.0 if max_abs < scale / 2 else 0.0
    return (1.0 if max_abs == 0 else 0.0), after, scale, max_abs


def degenerate(row: dict[str, Any], ctx: Context) -> tuple | None:
    """A tensor of the layer (input, constant or output) whose values round to zero. A conv /
    linear's weight is left to the other rules: at 3 bits per tensor most of any weight rounds
    to zero (its step is a third of its largest value), which is rounding, not a degenerate
    range (learned rounding, or per-channel scales for outlier channels, fix it; float would
    not be the remedy)."""
    best = None
    node = ctx.nodes.get(row["node"])
    weighted = node is not None and any(k in op_name(node) for k in _WEIGHTED)
    weight = _weight(ctx, node) if weighted else None
    for rec in ctx.records(row["node"]):
        if weight is not None and rec is weight[2]:
            continue
        shares = _zero_shares(ctx, rec)
        if shares is not None and shares[1] - shares[0] >= 0.5:
            if best is None or shares[1] - shares[0] > best[1][1] - best[1][0]:
                best = (rec, shares)
    if best is None:
        return None
    rec, (before, after, scale, max_abs) = best
    name = row["node"]
    evidence = (("tensor", str(rec.tensor)), ("zeros_before", before), ("zeros_after", after),
                ("scale", scale), ("max_abs", max_abs),
                ("local_sqnr", _value(row, "local_sqnr")))  # fmt: skip
    return evidence, Prescription(
        f"keep {name} in float (or give {rec.tensor} a finer grid): {after:.0%} of its values "
        f"round to zero on a step of {scale:.3g} (largest |x| {max_abs:.3g})",
        "qviz.numeric.fallback", (("nodes_or_module_names", name),),
    )  # fmt: skip


def _fixed_range(low: float, high: float, qmin: int, qmax: int) -> dict[str, Any]:
    """The scale and zero point of an affine grid over ``[low, high]`` (zero included)."""
    scale, zero_point = affine_qparams(low, high, qmin, qmax, eps=0.0)
    return {"scale": scale, "zero_point": zero_point}


def clipping(row: dict[str, Any], ctx: Context) -> tuple | None:
    """The output's grid clips values and the clipped values carry most of its error."""
    clipped, share = _value(row, "clipped"), _value(row, "clip_error_share")
    if not (clipped > 0 and share >= 0.5):
        return None
    name = row["node"]
    low, high = _value(row, "float_min"), _value(row, "float_max")
    rec = next((r for r in ctx.records(name) if r.tensor.producer == name), None)
    obs = ctx.observer(rec.group) if rec is not None else None
    seen = (float(getattr(obs, "min_val", math.nan)), float(getattr(obs, "max_val", math.nan)))
    evidence = (("clipped", clipped), ("clip_error_share", share), ("float_min", low),
                ("float_max", high), ("grid_min", _value(row, "grid_min")),
                ("grid_max", _value(row, "grid_max")), ("calibrated_min", seen[0]),
                ("calibrated_max", seen[1]))  # fmt: skip
    qparams = ctx.qparams(rec.group) if rec is not None else None
    if qparams is not None and (low < seen[0] or high > seen[1]):
        edit = {name: _fixed_range(low, high, qparams[2], qparams[3])}
        return evidence, Prescription(
            f"widen {name}'s range: the data reaches [{low:.3g}, {high:.3g}], calibration saw "
            f"[{seen[0]:.3g}, {seen[1]:.3g}]; calibrate on data like it, or fix the range",
            _OVERRIDE, (("overrides", edit),),
        )  # fmt: skip
    method = ctx.plan.group(rec.group).spec.method if rec is not None else None
    better = "max" if method == "mse" else "mse"
    return evidence, Prescription(
        f"pick {name}'s range with HistogramObserver method {better!r} (its {method or 'l2'} "
        f"range clips {clipped:.2%} of the values, which carry {share:.0%} of the error)",
        _OVERRIDE, (("overrides", {name: {"observer": "HistogramObserver", "method": better}}),),
    )  # fmt: skip


def rounding(row: dict[str, Any], ctx: Context) -> tuple | None:
    """What is left: the grid's step itself (SQNR near the grid's theoretical one)."""
    name = row["node"]
    local, mse = _value(row, "local_sqnr"), _value(row, "local_mse")
    rec = next((r for r in ctx.records(name) if r.tensor.producer == name), None)
    qparams = ctx.qparams(rec.group) if rec is not None else None
    theory, bits = math.nan, math.nan
    if qparams is not None and math.isfinite(local) and mse > 0:
        signal = mse * 10 ** (local / 10)
        theory = 10 * math.log10(signal / (qparams[0] ** 2 / 12))
        bits = bits_of_range(qparams[2], qparams[3])
    weight_db, bias = _value(row, "weight_sqnr"), _value(row, "local_bias_share")
    evidence = (("local_sqnr", local), ("grid_sqnr", theory), ("bits", bits),
                ("clipped", _value(row, "clipped")), ("weight_sqnr", weight_db),
                ("local_bias_share", bias))  # fmt: skip
    if bias >= 0.5:
        return evidence, Prescription(
            f"correct {name}'s bias: {bias:.0%} of its error is a constant offset per channel",
            "qviz.engine.repair.bias_correction", (("nodes", (name,)),),
        )  # fmt: skip
    if weight_db < local + 6:
        return evidence, Prescription(
            f"learn {name}'s weight rounding (AdaRound): its weights ({weight_db:.1f} dB) set "
            f"the error", "qviz.engine.repair.adaround", (("nodes", (name,)),),
        )  # fmt: skip
    return evidence, Prescription(
        f"a finer grid for {name} (16 bits): its error is the step of its grid",
        _OVERRIDE, (("overrides", {name: {"dtype": "int16"}}),),
    )  # fmt: skip


Rule = Callable[[dict[str, Any], Context], "tuple | None"]

#: ``(cause, rule)`` in the order they are tried; the first rule that matches names the cause.
RULES: tuple[tuple[Cause, Rule], ...] = (
    (Cause.SHARED_GROUP, shared_group),
    (Cause.OUTLIER_CHANNELS, outlier_weights),
    (Cause.OUTLIER_CHANNELS, outlier_activations),
    (Cause.SLICE, broken_slice),
    (Cause.DEGENERATE, degenerate),
    (Cause.CLIPPING, clipping),
    (Cause.ROUNDING, rounding),
)
