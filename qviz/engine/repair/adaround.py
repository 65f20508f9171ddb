"""AdaRound on a converted model: learned up / down rounding of each quantized conv / linear.

Nearest rounding makes each weight as close as it can be on its own, but a layer's output is a
sum over many weights whose rounding errors need not cancel. AdaRound (Nagel et al. 2020; the
optimization is in :mod:`qviz.engine.repair.adaround_optim`) chooses, per weight, the integer
below or above ``w / scale`` that best reconstructs the layer's float output on calibration
data. Layer by layer, in graph order:

1. the quantized model's own inputs to the layer are cached (the integers chosen for earlier
   layers included), and the float model's output of the same layer (BatchNorm folded in, as
   prepare folded it; the relu after it applied on both sides when one follows);
2. the rounding is learned from the nearest-rounding start;
3. the chosen integers replace the layer's int weight constant. Scales and zero points stay:
   the grid does not change, only which of its two nearest points each weight takes.

Each layer records a ``TransformRecord`` (``kind="adaround"``) in the model's plan: iterations,
reconstruction loss before and after (nearest vs chosen, over all the cached data), and the
share of weights rounded the other way than nearest.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> torch.manual_seed(0) and None
    >>> gm = qviz.export(torch.nn.Linear(8, 4).eval(), (torch.randn(16, 8),), dynamic_batch=True)
    >>> config = get_symmetric_quantization_config(weight_qmin=-7, weight_qmax=7)
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    >>> data = [torch.randn(16, 8) for _ in range(4)]
    >>> _ = qviz.calibrate(prepared, data, progress=False)
    >>> converted = qviz.convert_pt2e(prepared)
    >>> rounded = adaround(converted, gm, data, iterations=200, progress=False)
    >>> record = rounded.plan.transforms[-1]
    >>> record.kind, record.nodes, dict(record.params)["loss_after"] <= dict(record.params)[
    ...     "loss_before"]
    ('adaround', ('linear',), True)
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node
from torch.utils._pytree import tree_map

from qviz.engine.compat import quantized_decomposed
from qviz.engine.graph.debug_handles import assign_handles, handle
from qviz.engine.graph.fingerprint import check_lineage
from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.graph.inputs import ModelInputs, bind_batch, measured_batches
from qviz.engine.graph.memo import ContentDigest, ContentMemo
from qviz.engine.graph.stage import Stage, check_stage
from qviz.engine.pt2e.passes.bn_fold import (
    CONV_OPS,
    LINEAR_OPS,
    TRANSPOSED_CONV_OPS,
    fold_batch_norm,
)
from qviz.engine.pt2e.plan import TransformRecord, record_transform
from qviz.engine.repair.adaround_optim import AdaRoundSettings, learn_rounding, reconstruction_loss
from qviz.engine.repair.options import AdaRoundOptions
from qviz.errors import CalibrationError, ConfigError, closest_names

_RELU = {torch.ops.aten.relu.default, torch.ops.aten.relu_.default}

#: Each layer's learned rounding by what it was learned from (:func:`_rounding_key`): the
#: chosen integers are the size of the layer's int weight, so 256 layers of a few-MB model are
#: a few MB. A ``RepairSession`` that rebuilds after a quantizer change learns again only the
#: layers whose weights, grid, inputs or settings changed.
RECENT_ROUNDINGS = ContentMemo(size=256)


@dataclass(frozen=True)
class WeightGrid:
    """A weight's quantization grid, shaped to broadcast against it.

    Example:
        >>> g = WeightGrid(torch.tensor(0.5), torch.tensor(0.0), -128, 127)
        >>> g.nearest(torch.tensor([0.7, -0.2])), g.weight(torch.tensor([1.0, -1.0]))
        (tensor([1., 0.]), tensor([ 0.5000, -0.5000]))
    """

    scale: torch.Tensor
    zero_point: torch.Tensor
    qmin: int
    qmax: int

    def nearest(self, w: torch.Tensor) -> torch.Tensor:
        return torch.clamp(torch.round(w / self.scale) + self.zero_point, self.qmin, self.qmax)

    def weight(self, codes: torch.Tensor) -> torch.Tensor:
        """Dequantized weight of ``floor(w / s) + h`` codes (zero point added, clamped)."""
        q = torch.clamp(codes + self.zero_point, self.qmin, self.qmax)
        return (q - self.zero_point) * self.scale


@dataclass(frozen=True)
class _Layer:
    node: Node  # the conv / linear of the converted copy
    weight: Node  # the get_attr of its int weight
    grid: WeightGrid
    twin: Node  # the same operator in the float graph (BatchNorm folded)
    relu: bool


def _value(gm: GraphModule, arg: Any) -> Any:
    return get_attr_value(gm, arg) if isinstance(arg, Node) and arg.op == "get_attr" else arg


def _grid(gm: GraphModule, dq: Node, ndim: int) -> WeightGrid | None:
    """The grid of a weight's ``dequantize_per_tensor`` / ``_per_channel`` (None: another op)."""
    qd = quantized_decomposed()
    args = [_value(gm, a) for a in dq.args]
    if dq.target == qd.dequantize_per_channel.default:
        scale, zp, axis, qmin, qmax = args[1:6]
        shape = [1] * ndim
        shape[int(axis)] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    elif dq.target in (qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor):
        scale, zp, qmin, qmax = args[1:5]
    else:
        return None
    scale = torch.as_tensor(scale, dtype=torch.float32).detach()
    zp = torch.as_tensor(zp).detach().to(torch.float32)
    return WeightGrid(scale, zp, int(qmin), int(qmax))


def _layer(gm: GraphModule, node: Node, twins: dict[int, Node]) -> _Layer | str:
    """The layer AdaRound rounds at ``node``, or why it cannot."""
    dq = node.args[1] if len(node.args) > 1 else None
    if not isinstance(dq, Node) or not dq.args or not isinstance(dq.args[0], Node):
        return "its weight is not a dequantized constant"
    weight = dq.args[0]
    value = get_attr_value(gm, weight, default=None) if weight.op == "get_attr" else None
    if not isinstance(value, torch.Tensor) or value.is_floating_point():
        return f"its weight {dq.name} does not dequantize an integer constant"
    if len(weight.users) != 1 or len(dq.users) != 1:
        return f"its int weight {weight.name} is shared with other operators"
    grid = _grid(gm, dq, value.ndim)
    if grid is None:
        return f"its weight is dequantized by {dq.target}, not per tensor or per channel"
    twin = twins.get(handle(node)) if handle(node) is not None else None
    if twin is None or twin.target != node.target:
        return "the float model has no matching operator (debug handle)"
    users = list(node.users)
    relu = len(users) == 1 and users[0].target in _RELU
    return _Layer(node, weight, grid, twin, relu)


class _Capture(Interpreter):
    """Runs a graph and keeps one node's arguments (``inputs``) or its output."""

    def __init__(self, gm: GraphModule, node: Node, output: bool) -> None:
        super().__init__(gm)
        self.node, self.keep_output = node, output
        self.kept: Any = None

    def run_node(self, n: Node) -> Any:
        # copies: a later in-place op (ResNet's ``out += x``, ``relu_``) writes into these tensors
        if n is self.node and not self.keep_output:
            self.kept = tree_map(_copy, self.fetch_args_kwargs_from_env(n))
        result = super().run_node(n)
        if n is self.node and self.keep_output:
            self.kept = _copy(result)
        return result


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _collect(
    gm: GraphModule, node: Node, batches: list[ModelInputs], output: bool
) -> tuple[torch.Tensor, Any]:
    """``node``'s first argument (or output) over every batch, concatenated along dim 0; and
    its arguments of the first batch (the constants: bias, stride, ...)."""
    values, first = [], None
    run = _Capture(gm, node, output)
    with torch.no_grad():
        for i, inputs in enumerate(batches):
            run.run(*inputs.args)
            value = run.kept if output else run.kept[0][0]
            if not torch.isfinite(value).all():
                raise CalibrationError(
                    f"adaround: batch {i} gives non-finite values at {node.name}; check the "
                    f"batch and the model (nothing was written)"
                )
            values.append(value.detach())
            first = run.kept if first is None else first
    return torch.cat(values), first


def _layer_fn(layer: _Layer, call: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
    """``f(x, weight)``: the layer's output (relu after it if one follows), channels last."""
    args, kwargs = call
    target, relu = layer.node.target, layer.relu
    channels_first = target in CONV_OPS | TRANSPOSED_CONV_OPS

    def run(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = target(x, weight, *args[2:], **kwargs)
        out = torch.relu(out) if relu else out
        return out.movedim(1, -1) if channels_first else out

    return run


def _float_twins(float_gm: GraphModule) -> tuple[GraphModule, dict[int, Node]]:
    """A copy of the float graph with BatchNorm folded as prepare folds it, and its operators
    by debug handle."""
    fgm = copy.deepcopy(float_gm)
    if not any(handle(n) is not None for n in fgm.graph.nodes):
        assign_handles(fgm)
    fold_batch_norm(fgm)
    return fgm, {handle(n): n for n in fgm.graph.nodes if handle(n) is not None}


def _wanted(out: GraphModule, nodes: tuple[str, ...] | None) -> set[str] | None:
    """The conv / linear node names ``nodes`` asks for (None: every one), checked."""
    if nodes is None:
        return None
    names = set(nodes)
    layers = [n.name for n in out.graph.nodes if n.target in CONV_OPS | LINEAR_OPS]
    missing = sorted(names - set(layers))
    if missing:
        raise ConfigError(
            f"adaround(nodes=...): {missing[0]!r} is not a conv / linear of the converted model "
            f"({closest_names(missing[0], layers)}; its layers: {layers[:12]})"
        )
    return names


def _layers(
    out: GraphModule, float_gm: GraphModule, wanted: set[str] | None
) -> tuple[GraphModule, list[_Layer]]:
    """The folded float graph and the layers of ``out`` to round (``wanted``, or all), in
    graph order; the others are named, with why, in one warning."""
    fgm, twins = _float_twins(float_gm)
    layers, skipped = [], []
    for node in out.graph.nodes:
        if wanted is not None and node.name not in wanted:
            continue
        if node.op == "call_function" and node.target in CONV_OPS | LINEAR_OPS:
            found = _layer(out, node, twins)
            if isinstance(found, _Layer):
                layers.append(found)
            else:
                skipped.append(f"{node.name}: {found}")
    if skipped:
        warnings.warn(
            f"adaround skipped {len(skipped)} layer(s): {'; '.join(skipped)}", stacklevel=3
        )
    return fgm, layers


def _bound(converted: GraphModule, data: Any) -> list[ModelInputs]:
    """``data``'s batches bound to ``converted`` and checked before anything runs."""
    return [
        bind_batch(converted, b, f"adaround: batch {i}")
        for i, b in enumerate(measured_batches(data, "adaround"))  # finite, at least one
    ]


def _check_float_weight(layer: _Layer, w: torch.Tensor, stored: torch.Tensor) -> None:
    """The float weight must be the one the stored integers were rounded from."""
    if w.shape != stored.shape:
        raise ConfigError(
            f"adaround: {layer.node.format_node()}: the float weight has shape "
            f"{tuple(w.shape)}, the int weight {tuple(stored.shape)}; pass the float graph this "
            f"model was prepared from as float_gm"
        )
    diff = (layer.grid.nearest(w) - stored.float()).abs()
    if float(diff.max()) > 1:
        raise ConfigError(
            f"adaround: {layer.node.format_node()}: {int((diff > 1).sum())} of {diff.numel()} "
            f"int weights are more than one step from the float weights rounded to nearest; "
            f"pass the float graph this model was prepared from as float_gm"
        )


def _rounding_key(layer: _Layer, stored: torch.Tensor, w: torch.Tensor, x: torch.Tensor,
                  ref: torch.Tensor, call: Any, settings: AdaRoundSettings) -> str:  # fmt: skip
    """A digest of everything ``layer``'s learned rounding is computed from: the operator, its
    other arguments (bias, stride, ...), the relu after it, the nearest integers, the float
    weight, the grid, the cached inputs and float outputs, the optimization settings (seed
    included) and the thread count (the order of the sums)."""
    digest = ContentDigest()
    digest.add((str(layer.node.target), layer.relu, torch.get_num_threads()))
    digest.add(tuple(getattr(settings, f.name) for f in dataclasses.fields(AdaRoundSettings)))
    args, kwargs = call
    for value in (*args[2:], *sorted(kwargs.items())):
        digest.add(value)
    grid = layer.grid
    for value in (stored, w, grid.scale, grid.zero_point, (grid.qmin, grid.qmax), x, ref):
        digest.add(value)
    return digest.hexdigest()


def _round_layer(
    out: GraphModule,
    fgm: GraphModule,
    layer: _Layer,
    batches: list[ModelInputs],
    settings: AdaRoundSettings,
) -> TransformRecord:
    """Learn ``layer``'s rounding on ``out`` (in place), return its record; a layer learned
    before from the same content (:data:`RECENT_ROUNDINGS`) takes the
    integers it chose then."""
    stored = get_attr_value(out, layer.weight)
    w = get_attr_value(fgm, layer.twin.args[1]).detach().float()
    _check_float_weight(layer, w, stored)
    x, call = _collect(out, layer.node, batches, output=False)
    ref, _ = _collect(fgm, layer.twin, batches, output=True)
    ref = torch.relu(ref) if layer.relu else ref
    if layer.node.target in CONV_OPS | TRANSPOSED_CONV_OPS:
        ref = ref.movedim(1, -1)
    key = _rounding_key(layer, stored, w, x, ref, call, settings)
    learned = RECENT_ROUNDINGS.get(key)
    if learned is None:
        learned = _learn(layer, stored, w, x, ref, call, settings)
        RECENT_ROUNDINGS[key] = learned
    chosen, before, after, flipped = learned
    with torch.no_grad():
        stored.copy_(chosen)
    return _record(layer, settings, before, after, flipped)


def _learn(layer: _Layer, stored: torch.Tensor, w: torch.Tensor, x: torch.Tensor,
           ref: torch.Tensor, call: Any,
           settings: AdaRoundSettings) -> tuple[torch.Tensor, float, float, float]:  # fmt: skip
    """The integers AdaRound chooses for ``layer`` (in ``stored``'s dtype), the reconstruction
    loss before and after, and the share of weights rounded away from nearest."""
    fn, grid = _layer_fn(layer, call), layer.grid
    floor_q = torch.floor(w / grid.scale)
    nearest_w = (stored.float() - grid.zero_point) * grid.scale
    with torch.no_grad():
        before = float(reconstruction_loss(fn(x, nearest_w), ref, -1))
    h = learn_rounding(
        fn, floor_q, w / grid.scale - floor_q, grid.weight, (x, ref), settings, layer.node.name
    )
    chosen = torch.clamp(floor_q + h + grid.zero_point, grid.qmin, grid.qmax)
    with torch.no_grad():
        after = float(reconstruction_loss(fn(x, grid.weight(floor_q + h)), ref, -1))
        flipped = float((chosen != grid.nearest(w)).float().mean())
    return chosen.to(stored.dtype), before, after, flipped


def _record(layer: _Layer, settings: AdaRoundSettings, before: float, after: float,
            flipped: float) -> TransformRecord:  # fmt: skip
    return TransformRecord(
        "adaround",
        (layer.node.name,),
        f"{layer.node.name}: learned rounding ({settings.iterations} iterations), "
        f"{flipped:.1%} of weights rounded away from nearest, reconstruction loss "
        f"{before:.4g} -> {after:.4g}",
        (
            ("iterations", int(settings.iterations)),
            ("loss_before", before),
            ("loss_after", after),
            ("flipped", flipped),
        ),
    )


def adaround(
    converted: GraphModule,
    float_gm: GraphModule,
    data: Any,
    *,
    iterations: int = 2000,
    reg_param: float = 0.01,
    beta_range: tuple[float, float] = (20.0, 2.0),
    warm_start: float = 0.2,
    batch_size: int = 32,
    lr: float = 1e-2,
    seed: int = 0,
    nodes: str | Sequence[str] | None = None,
    progress: bool = True,
) -> GraphModule:
    """AdaRound: each quantized conv / linear's weights rounded up or down as learned, on a copy.

    Args:
        converted: the model ``qviz.convert_pt2e`` returned (not changed).
        float_gm: the float graph module it was prepared from (``qviz.export``'s result).
        data: calibration batches (as ``qviz.calibrate`` takes them); every sample is cached.
        iterations: optimization steps per layer (the paper and AIMET use 10,000 or more).
        reg_param, beta_range, warm_start: the rounding regularizer's weight, its ``beta``
            (annealed from the first to the second) and the share of iterations before it starts.
        batch_size, lr, seed, progress: samples per iteration, Adam's learning rate on ``V``,
            the sample order (deterministic given it), a progress bar over the layers.
        nodes: round only these conv / linear nodes of ``converted`` (a layer a diagnosis
            named; an empty list is refused); None: every quantized one.

    Returns:
        A copy of ``converted``: its int weights each ``floor`` or ``ceil`` of ``w / scale`` (the
        grid unchanged), one ``TransformRecord`` per layer; layers it cannot round: a warning.

    Raises:
        ConfigError: an argument of the wrong type or out of its range, checked first
            (:class:`~qviz.engine.repair.options.AdaRoundOptions`: integers must be integers,
            NaN and infinity are refused), or a model at the wrong stage.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
        >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
        ...     get_symmetric_quantization_config()))
        >>> _ = qviz.calibrate(p, data := [torch.randn(8, 4)], progress=False)
        >>> out = adaround(qviz.convert_pt2e(p), gm, data, iterations=20, progress=False)
        >>> [r.kind for r in out.plan.transforms]
        ['adaround']
    """
    options = AdaRoundOptions(iterations=iterations, reg_param=reg_param, beta_range=beta_range,
                              warm_start=warm_start, batch_size=batch_size, lr=lr, seed=seed,
                              nodes=nodes, progress=progress)  # fmt: skip
    check_stage(converted, Stage.CONVERTED, where="adaround", arg="converted")
    check_stage(float_gm, Stage.FLOAT, where="adaround", arg="float_gm", exported=True)
    check_lineage(float_gm, converted, "adaround(float_gm=...)")  # its own float model
    wanted = _wanted(converted, options.nodes)
    batches = _bound(converted, data)
    out = copy.deepcopy(converted)
    fgm, layers = _layers(out, float_gm, wanted)
    from tqdm.auto import tqdm

    for layer in tqdm(layers, desc="adaround", disable=not options.progress):
        record_transform(out, _round_layer(out, fgm, layer, batches, options))
    return out
