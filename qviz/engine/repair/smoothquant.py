"""SmoothQuant (Xiao et al. 2023): move activation outliers into the weights that read them.

A transformer's LayerNorm output often has a few channels far larger than the rest, and a
per-tensor activation scale sized for them leaves the other channels a handful of steps. For a
linear ``y = X W^T`` the product is unchanged when input channel ``j`` of ``X`` is divided by
``s_j`` and column ``j`` of ``W`` multiplied by it; with

    s_j = max|X_j| ** alpha / max|W_j| ** (1 - alpha)

the activation's channel ranges and the weight's column ranges meet in between (``alpha = 0.5``
makes ``max|X_j / s_j| = max|W_j * s_j|`` for every channel). ``X / s`` costs nothing at run time
when the layer that produces ``X`` can absorb it:

* a LayerNorm (``aten.layer_norm`` with an affine weight and bias): its weight and bias are
  divided by ``s``. Every linear that reads it shares one ``s`` (q, k, v: the column maxima are
  taken over all of them, as the paper does);
* a linear whose output only feeds linears: its weight rows and bias are divided by ``s``.

Between the two, ops that move no channel (transpose / permute / view / reshape keeping the last
dimension, contiguous, clone, eval-mode dropout) are followed. Any other linear is skipped, with a
reason (a warning lists them): its input comes from an op that cannot absorb a per-channel scale
(a relu, an attention output, an add), or its producer also feeds something other than linears
(a residual add reads the LayerNorm's output in a post-norm transformer).

Example:
    >>> import torch, qviz
    >>> model = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 2)).eval()
    >>> x = torch.randn(8, 4)
    >>> gm = qviz.export(model, (x,))
    >>> smoothed = smooth_quant(gm, [x], progress=False)
    >>> torch.allclose(smoothed(x), gm(x), atol=1e-5)
    True
    >>> smoothed.meta["qviz_transforms"][0].nodes
    ('layer_norm', 'linear')
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from qviz.engine.graph.fingerprint import derived_copy
from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.graph.inputs import bind_batch, measured_batches
from qviz.engine.graph.stage import Stage, check_stage
from qviz.engine.pt2e.plan import TransformRecord, record_transform
from qviz.engine.repair.options import SmoothQuantOptions, check_alpha
from qviz.errors import CalibrationError, ConfigError

aten = torch.ops.aten
_LINEAR = aten.linear.default
_NORMS = {aten.layer_norm.default}
_MOVES = {aten.transpose.int, aten.permute.default}  # reorder dims: the last must stay last
_RESHAPES = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_SAME = {aten.contiguous.default, aten.clone.default, aten.alias.default, aten.dropout.default}


@dataclass(frozen=True)
class _Group:
    """A producer whose output channels are divided by ``s`` and the linears that read it."""

    source: Node  # a layer_norm or a linear
    linears: tuple[Node, ...]


def smoothing_factors(
    act_max: torch.Tensor, weight_max: torch.Tensor, alpha: float = 0.5
) -> torch.Tensor:
    """SmoothQuant's per-channel factors ``s = act_max**alpha / weight_max**(1 - alpha)``.

    A channel whose activation or weight range is zero gets ``s = 1`` (nothing to balance).

    Args:
        act_max: ``max |X_j|`` per input channel, over the calibration data.
        weight_max: ``max |W_j|`` per input channel, over every linear reading ``X``.
        alpha: the migration strength, a finite number in [0, 1] (0: weights unchanged; 1:
            activations flat).

    Example:
        >>> smoothing_factors(torch.tensor([16.0, 1.0, 0.0]), torch.tensor([1.0, 4.0, 2.0]))
        tensor([4.0000, 0.5000, 1.0000])
    """
    alpha = check_alpha(alpha)
    if not (isinstance(act_max, torch.Tensor) and isinstance(weight_max, torch.Tensor)) or (
        act_max.shape != weight_max.shape
    ):
        raise ConfigError(
            f"smoothing_factors: act_max and weight_max must be tensors of one shape (a range "
            f"per input channel), got {_kind(act_max)} and {_kind(weight_max)}"
        )
    act, w = act_max.double(), weight_max.double()
    s = act.pow(alpha) / w.pow(1.0 - alpha)
    keep = (act > 0) & (w > 0) & torch.isfinite(s)
    return torch.where(keep, s, torch.ones_like(s)).to(act_max.dtype)


def _kind(value: Any) -> str:
    return (
        f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    )


def _shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return tuple(int(d) for d in val.shape)
    except (TypeError, RuntimeError):  # a symbolic dimension
        return tuple(-1 for _ in val.shape)


def _keeps_channels(node: Node, channels: int) -> bool:
    """``node`` passes its input's last-dimension channels through, in place and unchanged."""
    shape_in, shape_out = _shape(node.args[0]), _shape(node)
    if shape_in is None or shape_out is None or not shape_in or not shape_out:
        return False
    if shape_in[-1] != channels or shape_out[-1] != channels:
        return False
    if node.target in _MOVES:
        last, ndim = len(shape_in) - 1, len(shape_in)
        if node.target == aten.transpose.int:
            return all(int(d) % ndim != last for d in node.args[1:3])
        return int(node.args[1][-1]) % ndim == last
    if node.target == aten.dropout.default:
        return len(node.args) > 2 and node.args[2] is False
    return node.target in _RESHAPES | _SAME


def _readers(source: Node, channels: int) -> tuple[list[Node], str | None]:
    """The linears reading ``source``'s output (through channel-keeping ops), or why not all do."""
    linears, todo = [], [source]
    while todo:
        node = todo.pop()
        for user in node.users:
            if user.target == _LINEAR and user.args[0] is node and user.args[1] is not node:
                linears.append(user)
            elif user.op == "call_function" and user.args[0] is node:
                if not _keeps_channels(user, channels):
                    return linears, f"{source.name}'s output also feeds {user.name} ({user.target})"
                todo.append(user)
            else:
                return linears, f"{source.name}'s output also feeds {user.name} ({user.op})"
    return linears, None if linears else f"{source.name}'s output feeds no linear"


def _own_constant(gm: GraphModule, node: Any, readers: tuple[Node, ...]) -> bool:
    """``node`` reads a constant that nothing outside ``readers`` reads (no tied weights)."""
    if not isinstance(node, Node) or node.op != "get_attr":
        return False
    same = [n for n in gm.graph.nodes if n.op == "get_attr" and n.target == node.target]
    return all(u in readers for n in same for u in n.users)


def _source_problem(gm: GraphModule, source: Node) -> str | None:
    """Why ``source`` cannot absorb a per-channel divisor (None when it can)."""
    if source.target in _NORMS:
        args = list(source.args) + [None] * (4 - len(source.args))
        if len(args[1]) != 1:
            return f"{source.name} normalizes over {list(args[1])}, not one channel dimension"
        for what, node in (("weight", args[2]), ("bias", args[3])):
            if not _own_constant(gm, node, (source,)):
                return f"{source.name} has no {what} of its own (elementwise_affine=False or tied)"
        return None
    if not _own_constant(gm, source.args[1], (source,)):
        return f"{source.name}'s weight is not a constant of its own"
    bias = source.args[2] if len(source.args) > 2 else None
    if bias is not None and not _own_constant(gm, bias, (source,)):
        return f"{source.name}'s bias is not a constant of its own"
    return None


def _channels(gm: GraphModule, source: Node) -> int:
    if source.target in _NORMS:
        return int(source.args[1][0])
    return int(get_attr_value(gm, source.args[1]).shape[0])


def _producer(linear: Node) -> Any:
    """The node whose output ``linear`` reads, past channel-keeping ops."""
    node = linear.args[0]
    while isinstance(node, Node) and node.op == "call_function" and node.args:
        shape = _shape(node)
        if node.target == _LINEAR or node.target in _NORMS or not shape:
            break
        if not (node.target in _MOVES | _RESHAPES | _SAME and _keeps_channels(node, shape[-1])):
            break
        node = node.args[0]
    return node


def find_groups(gm: GraphModule) -> tuple[list[_Group], dict[str, str]]:
    """The groups SmoothQuant can smooth, in graph order, and why each other linear cannot be.

    Example:
        >>> import torch, qviz
        >>> m = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 4),
        ...                         torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
        >>> groups, skipped = find_groups(qviz.export(m, (torch.randn(2, 4),)))
        >>> [(g.source.name, [n.name for n in g.linears]) for g in groups], list(skipped)
        ([('layer_norm', ['linear'])], ['linear_1'])
    """
    groups, problems = [], {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _NORMS | {_LINEAR}:
            continue
        problem = _source_problem(gm, node)
        linears, why = _readers(node, _channels(gm, node)) if problem is None else ([], problem)
        tied = [n.name for n in linears if not _own_constant(gm, n.args[1], (n,))]
        why = why or (f"{tied} have weights that are not constants of their own" if tied else None)
        if why is None:
            groups.append(_Group(node, tuple(linears)))
        else:
            problems[node] = why
    covered = {n for g in groups for n in g.linears}
    skipped = {}
    for node in gm.graph.nodes:
        if node.target == _LINEAR and node not in covered:
            source = _producer(node)
            what = source.target if source.op == "call_function" else source.op
            skipped[node.name] = problems.get(source) or (
                f"its input comes from {source.name} ({what}), which cannot absorb a "
                f"per-channel scale"
            )
    return groups, skipped


class _Ranges(Interpreter):
    """Runs the float graph, keeping each wanted node's per-channel (last dimension) max |x|."""

    def __init__(self, gm: GraphModule, wanted: set[Node]) -> None:
        super().__init__(gm)
        self.wanted = wanted
        self.ranges: dict[Node, torch.Tensor] = {}

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if n in self.wanted and isinstance(result, torch.Tensor):
            amax = result.detach().abs().reshape(-1, result.shape[-1]).amax(dim=0).float()
            old = self.ranges.get(n)
            self.ranges[n] = amax if old is None else torch.maximum(old, amax)
        return result


def _activation_ranges(
    gm: GraphModule, wanted: set[Node], data: Any, progress: bool
) -> dict[Node, torch.Tensor]:
    """``max |X_j|`` per channel of each wanted node over ``data`` (non-finite: an error)."""
    from tqdm.auto import tqdm

    batches = measured_batches(data, "smooth_quant")  # finite, at least one
    bound = [bind_batch(gm, b, f"smooth_quant: batch {i}") for i, b in enumerate(batches)]
    run = _Ranges(gm, wanted)
    with torch.no_grad():
        for i, inputs in enumerate(tqdm(bound, desc="smooth_quant", disable=not progress)):
            run.run(*inputs.args)
            bad = [n.name for n, r in run.ranges.items() if not torch.isfinite(r).all()]
            if bad:
                raise CalibrationError(
                    f"smooth_quant: batch {i} gives non-finite values at {bad}; check the batch "
                    f"and the model (nothing was changed)"
                )
    return run.ranges


def _scale_constant(gm: GraphModule, node: Node, factor: torch.Tensor) -> None:
    """Multiply the constant ``node`` reads by ``factor`` (broadcast), in place."""
    value = get_attr_value(gm, node)
    with torch.no_grad():
        value.copy_(value * factor.to(value.dtype))


def _smooth(gm: GraphModule, group: _Group, act: torch.Tensor, alpha: float) -> TransformRecord:
    """Fold SmoothQuant's factors into ``group`` (in place) and return its record."""
    weights = [get_attr_value(gm, n.args[1]) for n in group.linears]
    w_max = torch.stack([w.detach().abs().amax(dim=0).float() for w in weights]).amax(dim=0)
    s = smoothing_factors(act, w_max, alpha)
    src = group.source
    if src.target in _NORMS:
        for node in src.args[2:4]:
            _scale_constant(gm, node, 1.0 / s)
    else:
        _scale_constant(gm, src.args[1], (1.0 / s)[:, None])
        if len(src.args) > 2 and src.args[2] is not None:
            _scale_constant(gm, src.args[2], 1.0 / s)
    for n in group.linears:
        _scale_constant(gm, n.args[1], s[None, :])
    before = float((act / w_max.clamp_min(1e-12)).max())
    after = float(((act / s) / (w_max * s).clamp_min(1e-12)).max())
    names = ", ".join(n.name for n in group.linears)
    return TransformRecord(
        "smoothquant",
        (src.name, *(n.name for n in group.linears)),
        f"{src.name}'s output divided by s per channel and {names}'s input columns multiplied "
        f"by it (alpha {alpha}): activation/weight range ratio {before:.3g} -> {after:.3g}",
        (
            ("alpha", alpha),
            ("ratio_before", before),
            ("ratio_after", after),
            ("max_s", float(s.max())),
            ("min_s", float(s.min())),
        ),
    )


def smooth_quant(
    gm: GraphModule, data: Any, *, alpha: float = 0.5, progress: bool = True
) -> GraphModule:
    """SmoothQuant on a float graph: activation outliers moved into the weights, on a copy.

    Args:
        gm: the float graph module ``qviz.export`` returned (not changed).
        data: calibration batches (as ``qviz.calibrate`` takes them) for the activation ranges.
        alpha: migration strength in [0, 1]; 0.5 balances activation and weight ranges.
        progress: show a progress bar over the batches.

    Returns:
        A copy computing the same float function, with one ``TransformRecord`` per smoothed
        group (``kind="smoothquant"``) that ``prepare_pt2e`` copies into the plan. Linears that
        could not be smoothed are listed, with why, in one warning.

    Raises:
        ConfigError: ``alpha`` or ``progress`` of the wrong type or out of range, checked first
            (:class:`~qviz.engine.repair.options.SmoothQuantOptions`), or ``gm`` is not a float
            exported graph, or ``data`` has no batch.

    Example:
        >>> import torch, qviz
        >>> m = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 2)).eval()
        >>> gm = qviz.export(m, (torch.randn(2, 4),))
        >>> out = smooth_quant(gm, [torch.randn(2, 4)], alpha=0.5, progress=False)
        >>> dict(out.meta["qviz_transforms"][0].params)["ratio_after"] < 1.001
        True
    """
    options = SmoothQuantOptions(alpha=alpha, progress=progress)
    check_stage(gm, Stage.FLOAT, where="smooth_quant", arg="gm", exported=True)
    out = derived_copy(gm)  # read against the float model the user started from
    groups, skipped = find_groups(out)
    if skipped:
        reasons = "; ".join(f"{name}: {why}" for name, why in skipped.items())
        warnings.warn(f"smooth_quant skipped {len(skipped)} linear(s): {reasons}", stacklevel=2)
    if not groups:
        return out
    ranges = _activation_ranges(out, {g.source for g in groups}, data, options.progress)
    for group in groups:
        if group.source in ranges:
            record_transform(out, _smooth(out, group, ranges[group.source], options.alpha))
    return out
