"""Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization Through Weight
Equalization and Bias Correction", section 4.1), with high-bias absorption (section 4.2.1).

Two layers joined by a positively homogeneous function (``relu``, ``leaky_relu``, ``prelu``, or
nothing) compute the same function when output channel ``i`` of the first is divided by
``s_i > 0`` and input channel ``i`` of the second multiplied by it: ``f(x / s) = f(x) / s``.
With ``r1_i`` the range (largest magnitude) of output channel ``i`` of ``W1`` and ``r2_i`` that of
input channel ``i`` of ``W2``, the paper's choice ``s_i = sqrt(r1_i * r2_i) / r2_i`` gives both
channels the range ``sqrt(r1_i * r2_i)``, so that ``r1_i / max(r1) == r2_i / max(r2)``: per-tensor
weight quantization then wastes no levels on small channels. Layers in a chain are equalized pair
after pair, in graph order, sweep after sweep until no scale moves (the paper's iteration).

A ``conv -> depthwise -> conv`` triplet is equalized as AIMET does: in one step, to the limit of
equalizing its two pairs in turn (every channel of the three layers gets the range
``cbrt(r0_i * r1_i * r2_i)``); grouped convolutions are equalized per channel inside their groups.
With ``sweeps=1`` the result is AIMET's ``equalize_model`` (one pass over the same sets).

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU6(), nn.Conv2d(4, 4, 1)).eval()
    >>> eq = cross_layer_equalization(qviz.export(model, (torch.randn(1, 3, 4, 4),)))
    >>> [(r.nodes, r.detail) for r in eq.meta["qviz_transforms"]]  # doctest: +NORMALIZE_WHITESPACE
    [(('conv2d', 'conv2d_1'), 'skipped: hardtanh: relu6/hardtanh clips at a fixed value, so it
      is not scale-equivariant')]
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node

from qviz.engine.graph.debug_handles import COMPARE_AS
from qviz.engine.graph.fingerprint import derived_copy
from qviz.engine.graph.get_attr import get_attr_value, set_constant
from qviz.engine.graph.stage import Stage, check_stage
from qviz.engine.pt2e.passes.bn_fold import (
    BN_OPS,
    CONV_OPS,
    FOLDED_BN,
    LINEAR_OPS,
    TRANSPOSED_CONV_OPS,
    fold_batch_norm,
)
from qviz.engine.pt2e.plan import TransformRecord, record_transform
from qviz.engine.repair.options import EqualizationOptions

aten = torch.ops.aten

#: Positively homogeneous per-channel functions: ``f(s * x) == s * f(x)`` for every ``s > 0``.
HOMOGENEOUS = {
    aten.relu.default: "relu",
    aten.relu_.default: "relu",
    aten.leaky_relu.default: "leaky_relu",
    aten.leaky_relu_.default: "leaky_relu",
    aten.prelu.default: "prelu",
}
#: Ops that pass a tensor on unchanged in an inference graph.
_IDENTITY = {aten.dropout.default, aten.clone.default, aten.contiguous.default}
#: Activations that are not scale-equivariant: a pair through one of them is skipped, with why.
NOT_EQUIVARIANT = {
    aten.hardtanh.default: "relu6/hardtanh clips at a fixed value",
    aten.hardtanh_.default: "relu6/hardtanh clips at a fixed value",
    aten.relu6.default: "relu6 clips at a fixed value",
    aten.sigmoid.default: "sigmoid is not positively homogeneous",
    aten.tanh.default: "tanh is not positively homogeneous",
    aten.gelu.default: "gelu is not positively homogeneous",
    aten.silu.default: "silu is not positively homogeneous",
    aten.silu_.default: "silu is not positively homogeneous",
    aten.hardswish.default: "hardswish is not positively homogeneous",
    aten.hardswish_.default: "hardswish is not positively homogeneous",
    aten.hardsigmoid.default: "hardsigmoid is not positively homogeneous",
    aten.elu.default: "elu is not positively homogeneous",
}
_LAYERS = CONV_OPS | LINEAR_OPS


@dataclass
class _Layer:
    node: Node
    weight: torch.Tensor  # float64 working copy, (out, in / groups, *kernel)
    bias: torch.Tensor | None
    groups: int


@dataclass(kw_only=True)
class _Pair:
    first: _Layer
    second: _Layer
    activation: str  # "relu", "leaky_relu", "prelu" or "identity"
    scale: torch.Tensor = field(default=None)  # total scale of first's output channels
    r1_before: torch.Tensor = field(default=None)
    r2_before: torch.Tensor = field(default=None)


def _groups(node: Node) -> int:
    if node.target in LINEAR_OPS:
        return 1
    args = list(node.args) + [None] * 7
    return int(node.kwargs.get("groups", args[6] if args[6] is not None else 1))


def _output_ranges(layer: _Layer) -> torch.Tensor:
    """r1: the largest magnitude of each output channel of the layer's weight."""
    return layer.weight.abs().flatten(1).amax(1)


def _input_ranges(layer: _Layer) -> torch.Tensor:
    """r2: the largest magnitude of each input channel, over the output channels that read it."""
    w = layer.weight.abs().flatten(2) if layer.weight.ndim > 2 else layer.weight.abs()[..., None]
    out, per_group = w.shape[:2]
    g = layer.groups
    per_col = w.amax(2).reshape(g, out // g, per_group).amax(1)  # (groups, in / groups)
    return per_col.reshape(-1)


def _scale_output(layer: _Layer, s: torch.Tensor) -> None:
    layer.weight = layer.weight / s.reshape(-1, *([1] * (layer.weight.ndim - 1)))
    if layer.bias is not None:
        layer.bias = layer.bias / s


def _scale_input(layer: _Layer, s: torch.Tensor) -> None:
    g, w = layer.groups, layer.weight
    out, per_group = w.shape[:2]
    s = s.reshape(g, 1, per_group, *([1] * (w.ndim - 2)))
    layer.weight = (w.reshape(g, out // g, per_group, *w.shape[2:]) * s).reshape(w.shape)


def _safe(s: torch.Tensor) -> torch.Tensor:
    """1 (no scaling) where a channel is all zeros on either side."""
    return torch.where(torch.isfinite(s) & (s > 0), s, torch.ones_like(s))


def _is_depthwise(layer: _Layer) -> bool:
    """A depthwise conv with multiplier 1: each channel is its own group."""
    return (
        layer.node.target in CONV_OPS
        and layer.groups == layer.weight.shape[0] > 1
        and (layer.weight.shape[1] == 1)
    )


def _constant_weight(node: Node) -> str | None:
    """Why the layer's weight (and bias) cannot be rescaled, or None when they can."""
    for i, what in ((1, "weight"), (2, "bias")):
        arg = node.args[i] if len(node.args) > i else None
        if arg is None and what == "bias":
            continue
        if not isinstance(arg, Node) or arg.op != "get_attr":
            return f"{node.name}'s {what} is not a constant"
        if len(arg.users) != 1:
            others = [u.name for u in arg.users if u is not node]
            return f"{node.name}'s {what} is shared with {others}"
    return None


def _channel_dim_ok(first: Node, second: Node) -> str | None:
    """Why ``first``'s output channels are not ``second``'s input channels (None when they are)."""
    val = first.meta.get("val")
    ndim = val.ndim if isinstance(val, torch.Tensor) else None
    if second.target in LINEAR_OPS and first.target in CONV_OPS and ndim != 2:
        return (
            f"{second.name} (linear) reads the last dimension of {first.name}'s output, "
            "not its channels"
        )
    if second.target in CONV_OPS and first.target in LINEAR_OPS and ndim is not None and ndim > 2:
        return f"{second.name} (conv) reads dimension 1 of {first.name}'s output, not its features"
    return None


def _follow(layer: Node) -> tuple[Node | None, str, str | None, bool]:
    """From a conv / linear to the layer it alone feeds: (second layer, activation, why it is
    not a pair, whether the skip is worth a record)."""
    activation, node = "identity", layer
    while True:
        users = list(node.users)
        if len(users) != 1:
            named = [u.name for u in users]
            worth = any(u.target in _LAYERS for u in users)
            return None, activation, f"{node.name}'s output feeds {len(users)} nodes {named}", worth
        user = users[0]
        if user.target in _LAYERS:
            if user.args[0] is not node:
                return None, activation, f"{node.name} is not {user.name}'s input", False
            return user, activation, None, True
        if user.target in HOMOGENEOUS and activation == "identity":
            activation, node = HOMOGENEOUS[user.target], user
        elif user.target in _IDENTITY:
            if user.target == aten.dropout.default and (len(user.args) < 3 or user.args[2]):
                return None, activation, "dropout in training mode", False
            node = user
        elif user.target in NOT_EQUIVARIANT:
            nxt = list(user.users)
            worth = len(nxt) == 1 and nxt[0].target in _LAYERS
            reason = f"{user.name}: {NOT_EQUIVARIANT[user.target]}, so it is not scale-equivariant"
            return (nxt[0] if worth else None), activation, reason, worth
        else:
            why = f"{user.name} ({user.target}) is not a homogeneous activation"
            return None, activation, why, False


def _find_pairs(
    gm: GraphModule,
) -> tuple[list[tuple[Node, Node, str]], list[tuple[tuple[str, ...], str]]]:
    """The pairs to equalize (first, second, activation) and the candidates skipped, with why."""
    pairs, skipped = [], []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _LAYERS | TRANSPOSED_CONV_OPS:
            continue
        second, activation, why, worth = _follow(node)
        names = (node.name,) if second is None else (node.name, second.name)
        if why is None and node.target in TRANSPOSED_CONV_OPS:
            why = f"{node.name} is a transposed convolution (not supported)"
        if why is None and second.target in TRANSPOSED_CONV_OPS:
            why = f"{second.name} is a transposed convolution (not supported)"
        if why is None:
            why = _constant_weight(node) or _constant_weight(second)
            why = why or _channel_dim_ok(node, second)
        if why is None:
            pairs.append((node, second, activation))
        elif worth:
            skipped.append((names, why))
    return pairs, skipped


def _sets(pairs: list[_Pair]) -> list[tuple[_Pair, ...]]:
    """AIMET's CLS sets, in graph order: a pair, or the two pairs of a conv -> depthwise ->
    conv triplet."""
    by_first = {id(p.first): p for p in pairs}
    sets, used = [], set()
    for p in pairs:
        if id(p) in used:
            continue
        q = by_first.get(id(p.second))
        if q is not None and id(q) not in used and _is_depthwise(p.second):
            if not _is_depthwise(p.first):
                sets.append((p, q))
                used.update((id(p), id(q)))
                continue
        sets.append((p,))
        used.add(id(p))
    return sets


def _equalize_set(cls_set: tuple[_Pair, ...]) -> float:
    """Equalize one set in place; the largest ``|log s|`` it applied."""
    if len(cls_set) == 1:
        (p,) = cls_set
        r1, r2 = _output_ranges(p.first), _input_ranges(p.second)
        s = _safe(torch.sqrt(r1 * r2) / r2)  # the paper's s_i = sqrt(r1_i r2_i) / r2_i
        _scale_output(p.first, s)
        _scale_input(p.second, s)
        p.scale = p.scale * s
        return float(s.log().abs().max()) if s.numel() else 0.0
    p, q = cls_set
    r0, r1, r2 = _output_ranges(p.first), _output_ranges(p.second), _input_ranges(q.second)
    cube = torch.pow(r0 * r1 * r2, 1.0 / 3)
    s12, s23 = _safe(r0 / cube), _safe(cube / r2)
    _scale_output(p.first, s12)
    _scale_input(p.second, s12)
    _scale_output(q.first, s23)
    _scale_input(q.second, s23)
    p.scale, q.scale = p.scale * s12, q.scale * s23
    return max(float(s12.log().abs().max()), float(s23.log().abs().max()))


def _block_diagonal(layer: _Layer) -> torch.Tensor:
    """The layer's weight summed over its kernel, as a full (out, in) matrix."""
    w = layer.weight.flatten(2).sum(2) if layer.weight.ndim > 2 else layer.weight
    g = layer.groups
    if g == 1:
        return w
    out, per_group = w.shape
    full = torch.zeros(out, per_group * g, dtype=w.dtype, device=w.device)
    for k in range(g):
        rows = slice(k * out // g, (k + 1) * out // g)
        full[rows, k * per_group : (k + 1) * per_group] = w[rows]
    return full


def _spread(r: torch.Tensor) -> float:
    """max / min of a layer's per-channel ranges (inf when a channel is all zeros)."""
    small = float(r.min())
    return float(r.max()) / small if small > 0 else math.inf


def cross_layer_equalization(
    gm: GraphModule,
    *,
    sweeps: int | None = None,
    tol: float = 1e-6,
    max_sweeps: int = 1000,
    high_bias_absorption: bool = True,
    num_std: float = 3.0,
) -> GraphModule:
    """Equalize the weight ranges of consecutive conv / linear layers of a float graph; a copy.

    BatchNorms are folded first (``qviz.engine.pt2e.passes.bn_fold``, as ``prepare_pt2e``
    folds them), keeping their statistics for high-bias absorption. Pairs are conv / linear ->
    (``relu`` | ``leaky_relu`` | ``prelu`` | nothing) -> conv / linear where the first layer's
    output feeds only the second; depthwise and grouped convolutions included. Each pair gets
    one ``TransformRecord`` (kind ``"cross_layer_equalization"``; ``prepared.plan`` lists it)
    with its scales and the spread (max / min) of its per-channel weight ranges before and
    after; a candidate pair left alone (through ``relu6``, which clips at 6 and so is not
    scale-equivariant, or whose first output also feeds another node) gets a record saying why.

    Args:
        gm: the float graph ``qviz.export`` returned (not changed).
        sweeps: passes over the pairs; None (the default) repeats them until no scale moves by
            more than ``tol`` (the paper's iteration, at most ``max_sweeps``). ``sweeps=1`` is
            AIMET's ``equalize_model`` (one pass).
        tol: convergence: the largest ``|log s|`` a sweep may still apply (>= 0).
        max_sweeps: the most sweeps when ``sweeps`` is None (a warning when they run out).
        high_bias_absorption: move the part of a first layer's bias its BatchNorm statistics
            say is always positive (``max(0, beta - num_std * |gamma|)``) into the next layer's
            bias (paper section 4.2.1, as AIMET does; the float function changes slightly).
        num_std: standard deviations kept below the absorbed bias (>= 0).

    Returns:
        An equalized copy of ``gm``, BatchNorms folded.

    Raises:
        ConfigError: an argument of the wrong type or out of its range, checked first
            (:class:`~qviz.engine.repair.options.EqualizationOptions`: integers must be
            integers, NaN and infinity are refused), or ``gm`` is not a float exported graph.

    Example:
        >>> import torch, qviz
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
        >>> gm = qviz.export(model, (torch.randn(3, 4),))
        >>> eq = cross_layer_equalization(gm)
        >>> x = torch.randn(3, 4)
        >>> torch.allclose(eq(x)[0], gm(x)[0], atol=1e-5)
        True
        >>> [r.nodes for r in eq.meta["qviz_transforms"]]
        [('linear', 'linear_1')]
    """
    options = EqualizationOptions(
        sweeps=sweeps, tol=tol, max_sweeps=max_sweeps,
        high_bias_absorption=high_bias_absorption, num_std=num_std,
    )  # fmt: skip
    check_stage(gm, Stage.FLOAT, where="cross_layer_equalization", arg="gm", exported=True)
    out = derived_copy(gm)  # read against the float model the user started from
    bn_stats = _fold_keeping_statistics(out)
    found, skipped = _find_pairs(out)
    layers, pairs = _layers_and_pairs(out, found)
    cls_sets = _sets(pairs)
    done = _sweep(cls_sets, options)
    absorbed = (
        _absorb_high_bias(pairs, bn_stats, options.num_std) if options.high_bias_absorption else {}
    )
    _write_back(out, layers)
    _record_pairs(out, pairs, cls_sets, absorbed, done, skipped)
    return out


def _fold_keeping_statistics(out: GraphModule) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Fold ``out``'s BatchNorms (in place); each folded conv's BatchNorm (gamma, beta)."""
    bn_stats: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for bn in [n for n in out.graph.nodes if n.op == "call_function" and n.target in BN_OPS]:
        conv, channels = bn.args[0], None
        if isinstance(conv, Node) and isinstance(conv.meta.get("val"), torch.Tensor):
            channels = conv.meta["val"].shape[1 if conv.target not in LINEAR_OPS else -1]
        gamma, beta = (
            get_attr_value(out, a).detach().double() if isinstance(a, Node) else None
            for a in bn.args[1:3]
        )
        if channels is not None and isinstance(conv, Node):
            like = gamma if gamma is not None else beta  # the model's device
            kw = {"dtype": torch.float64, "device": None if like is None else like.device}
            gamma = torch.ones(channels, **kw) if gamma is None else gamma
            beta = torch.zeros(channels, **kw) if beta is None else beta
            bn_stats[conv.name] = (gamma, beta)
    fold_batch_norm(out)
    for node in out.graph.nodes:  # the folded conv is this graph's own operator now: a model
        node.meta.pop(COMPARE_AS, None)  # prepared from it is compared with it, not the gone BN
    return {
        name: stats
        for name, stats in bn_stats.items()
        if any(n.name == name and FOLDED_BN in n.meta for n in out.graph.nodes)
    }


def _layers_and_pairs(out: GraphModule, found: list) -> tuple[dict[Node, _Layer], list[_Pair]]:
    """The layers of the pairs found (their weights and biases in float64) and the pairs."""
    layers: dict[Node, _Layer] = {}

    def layer(node: Node) -> _Layer:
        if node not in layers:
            bias = node.args[2] if len(node.args) > 2 else None
            layers[node] = _Layer(
                node,
                get_attr_value(out, node.args[1]).detach().double(),
                None if bias is None else get_attr_value(out, bias).detach().double(),
                _groups(node),
            )
        return layers[node]

    pairs = [_Pair(first=layer(a), second=layer(b), activation=act) for a, b, act in found]
    for p in pairs:
        p.scale = torch.ones(
            p.first.weight.shape[0], dtype=torch.float64, device=p.first.weight.device
        )
        p.r1_before, p.r2_before = _output_ranges(p.first), _input_ranges(p.second)
    return layers, pairs


def _sweep(cls_sets: list, options: EqualizationOptions) -> int:
    """Equalize every set ``sweeps`` times, or until no scale moves by more than ``tol`` (a
    warning when ``max_sweeps`` ran out first); how many sweeps ran."""
    sweeps, done, moved = options.sweeps, 0, 0.0
    while done < (sweeps or options.max_sweeps):
        moved = max((_equalize_set(s) for s in cls_sets), default=0.0)
        done += 1
        if sweeps is None and moved <= options.tol:
            return done
    if sweeps is None:
        warnings.warn(
            f"cross_layer_equalization did not converge in max_sweeps={options.max_sweeps} "
            f"sweeps: a scale still moved by |log s| = {moved:.3g} > tol={options.tol:g}; the "
            f"pairs are equalized as far as they got (raise max_sweeps or tol)",
            stacklevel=3,
        )
    return done


def _absorb_high_bias(pairs: list[_Pair], bn_stats: dict, num_std: float) -> dict[int, float]:
    """Move each first layer's always-positive bias into the next layer's (section 4.2.1);
    the largest amount moved per pair index."""
    absorbed: dict[int, float] = {}
    for i, p in enumerate(pairs):
        stats = bn_stats.get(p.first.node.name)
        if stats is None or p.first.bias is None or p.second.bias is None:
            continue
        beta, gamma = stats[1] / p.scale, stats[0] / p.scale
        c = beta if p.activation == "identity" else torch.clamp(beta - num_std * gamma.abs(), min=0)
        p.first.bias = p.first.bias - c
        p.second.bias = p.second.bias + _block_diagonal(p.second) @ c
        absorbed[i] = float(c.abs().max())
    return absorbed


def _write_back(out: GraphModule, layers: dict[Node, _Layer]) -> None:
    for lay in layers.values():
        w_node, b_node = lay.node.args[1], lay.node.args[2] if len(lay.node.args) > 2 else None
        dtype = get_attr_value(out, w_node).dtype
        set_constant(out, str(w_node.target), lay.weight.to(dtype))
        if b_node is not None:
            set_constant(out, str(b_node.target), lay.bias.to(dtype))
    out.recompile()


def _record_pairs(
    out: GraphModule, pairs: list[_Pair], cls_sets: list, absorbed: dict, done: int, skipped: list
) -> None:
    """One TransformRecord per equalized pair (scales, range spreads) and per skipped one."""
    in_triplet = {id(p): len(s) == 2 for s in cls_sets for p in s}
    for i, p in enumerate(pairs):
        r1, r2 = _output_ranges(p.first), _input_ranges(p.second)
        via = "" if p.activation == "identity" else f" through {p.activation}"
        shape = " (conv -> depthwise -> conv triplet)" if in_triplet[id(p)] else ""
        detail = f"weight ranges equalized{via}{shape} over {done} sweep(s)"
        if i in absorbed:
            detail += f"; high bias absorbed into {p.second.node.name}"
        params = (
            ("equalized", True),
            ("max_scale", float(p.scale.max())),
            ("min_scale", float(p.scale.min())),
            ("range_spread_before", (_spread(p.r1_before), _spread(p.r2_before))),
            ("range_spread_after", (_spread(r1), _spread(r2))),
            ("sweeps", done),
            ("max_absorbed_bias", absorbed.get(i, 0.0)),
        )
        names = (p.first.node.name, p.second.node.name)
        record_transform(out, TransformRecord("cross_layer_equalization", names, detail, params))
    for names, why in skipped:
        record_transform(
            out,
            TransformRecord(
                "cross_layer_equalization", names, f"skipped: {why}", (("equalized", False),)
            ),
        )
