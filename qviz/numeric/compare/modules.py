"""``compare`` for the module-level flow: each quant_nn layer against its float twin.

A quant_nn model from :func:`qviz.engine.tensor.quant_modules.quantize_model` keeps the float
model's
module names, so each quantized layer (a module holding an enabled TensorQuantizer) is matched
with the float model's module of the same name. Both models run on the same batches, in eval
mode (their modes are restored afterwards), with forward hooks on the matched layers:

* **cumulative** error: the quantized layer's output in the quantized model against the float
  layer's output (everything upstream included);
* **local** error: the quantized layer run again on the *float* layer's inputs, against the
  float output: only what quantizing this layer's input and weight costs;
* **weight_sqnr**: the weight quantizer's output against the float weight;
* the grid columns (``float_min/max``, ``grid_min/max``, ``clipped``, ``rmse_scale``) measure
  the float layer's *input* against the layer's input quantizer (per tensor, with an amax):
  a quant_nn layer quantizes its inputs, not its output.

The table is the :class:`~qviz.numeric.NumericReport` of the PT2E comparison: ``node``
and ``module`` are the layer's module path (``conv1.0``; a second call of the same layer is
``conv1.0@1``), ``op`` its class, ``handle`` is NaN.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.tensor.quant_modules import quantize_model
    >>> torch.manual_seed(0) and None
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    >>> data = [torch.randn(16, 8) for _ in range(4)]
    >>> quantized = quantize_model(model)
    >>> _ = qviz.calibrate_quantizers(quantized, data, progress=False)
    >>> report = compare_modules(model, quantized, data, progress=False)
    >>> list(report.df["node"]), list(report.df["op"])
    (['0', '2'], ['QuantLinear', 'QuantLinear'])
    >>> bool((report.df["local_sqnr"] > 30).all()), report.output_sqnr > 30
    (True, True)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from qviz.engine import distributed
from qviz.engine.graph.inputs import batch_errors, batches_of, bind_batch, check_finite
from qviz.engine.graph.stage import Stage, check_stage, model_stage
from qviz.engine.qparams import quant_range, symmetric_scale
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import ConfigError
from qviz.numeric.compare.report import NumericReport
from qviz.numeric.measure.batches import batch_size, check_metric, flat_tensors, metric_value
from qviz.numeric.measure.streaming import GridStats, PairStats
from qviz.numeric.measure.totals import OutputTotals, single


def is_quant_nn_model(model: Any) -> bool:
    """A module (not an exported graph) holding TensorQuantizers: a quant_nn model.

    Example:
        >>> from qviz.engine import quant_nn
        >>> is_quant_nn_model(quant_nn.QuantLinear(2, 2)), is_quant_nn_model(nn.Linear(2, 2))
        (True, False)
    """
    return isinstance(model, nn.Module) and model_stage(model) is Stage.QUANT_NN


@dataclass(kw_only=True)
class _Layer:
    """One matched layer and what is measured on it (per call of the layer)."""

    name: str
    float_layer: nn.Module
    quant_layer: nn.Module
    cumulative: dict[int, PairStats] = field(default_factory=dict)
    local: dict[int, PairStats] = field(default_factory=dict)
    grid: dict[int, GridStats] = field(default_factory=dict)


def _quantizes(tq: TensorQuantizer) -> bool:
    facts = tq.facts()
    return not facts["disabled"] and bool(facts["quant"])


def _enabled(layer: nn.Module) -> list[TensorQuantizer]:
    return [
        m for name, m in layer.named_modules() if isinstance(m, TensorQuantizer) and _quantizes(m)
    ]


def _quantized_layers(quant_model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules whose own (not nested layers') TensorQuantizers quantize: the quantized layers."""
    layers = []
    for name, module in quant_model.named_modules():
        if isinstance(module, TensorQuantizer):
            continue
        own = [
            m
            for m in module.children()
            if isinstance(m, TensorQuantizer)
            or (isinstance(m, nn.ModuleList) and any(isinstance(q, TensorQuantizer) for q in m))
        ]
        if own and _enabled(module):
            layers.append((name, module))
    return layers


def _match(float_model: nn.Module, quant_model: nn.Module) -> list[_Layer]:
    layers = []
    for name, quant_layer in _quantized_layers(quant_model):
        try:
            twin = float_model.get_submodule(name)
        except AttributeError:
            raise ConfigError(
                f"float_model has no module {name!r} to compare the quantized "
                f"{type(quant_layer).__name__} {name!r} with: pass the float model that "
                f"quantize_model(float_model) copied (it keeps the module names)"
            ) from None
        if any(isinstance(m, TensorQuantizer) for m in twin.modules()):
            raise ConfigError(
                f"float_model's {name!r} is a {type(twin).__name__} with TensorQuantizers: "
                f"pass the float model as float_model and its quant_nn copy as quantized_model"
            )
        layers.append(
            _Layer(
                name=name or type(quant_model).__name__, float_layer=twin, quant_layer=quant_layer
            )
        )
    if not layers:
        raise ConfigError(
            f"the {type(quant_model).__name__} has no quantized layer (no enabled "
            f"TensorQuantizer): swap its layers with quant_modules.quantize_model(model)"
        )
    return layers


def _check_not_calibrating(quant_model: nn.Module) -> None:
    calibrating = [
        n
        for n, m in quant_model.named_modules()
        if isinstance(m, TensorQuantizer) and m.facts()["calib"]
    ]
    if calibrating:
        raise ConfigError(
            f"these TensorQuantizers are still calibrating (compare would feed their "
            f"calibrators): {calibrating[:5]}{' ...' if len(calibrating) > 5 else ''}; finish "
            f"calibration first (qviz.calibrate_quantizers does, or call disable_calib())"
        )


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_clone(v) for v in value)
    return value


def _update(stats: PairStats, layer: str, reference: Any, test: Any) -> None:
    refs, tests = flat_tensors(reference), flat_tensors(test)
    if len(refs) != len(tests) or any(
        r.shape != t.shape for r, t in zip(refs, tests, strict=False)
    ):
        raise ConfigError(
            f"{layer}: the quantized layer's output does not match the float layer's "
            f"(shapes {[tuple(r.shape) for r in refs]} vs {[tuple(t.shape) for t in tests]}); "
            f"pass the float model the quant_nn model was made from"
        )
    for r, t in zip(refs, tests, strict=True):
        stats.update(r, t)


def _input_grid(layer: nn.Module) -> GridStats | None:
    """The grid of the layer's input quantizer, when it is per tensor with an amax."""
    tq = getattr(layer, "_input_quantizer", None)
    if not isinstance(tq, TensorQuantizer) or not _quantizes(tq):
        return None
    if tq.amax is None or tq.amax.numel() != 1 or not tq.fake_quant:
        return None
    d = tq.quant_desc
    amax = float(tq.amax) * (d.scale_amax or 1.0)
    qmin, qmax = quant_range(d.num_bits, unsigned=d.unsigned, narrow_range=d.narrow_range)
    scale = float(symmetric_scale(amax, num_bits=d.num_bits, unsigned=d.unsigned))
    return (
        GridStats(scale=scale, zero_point=0, quant_min=qmin, quant_max=qmax) if scale > 0 else None
    )


class _Hooks:
    """Forward hooks that record the float layers' calls and measure the quantized ones."""

    def __init__(self, layers: list[_Layer]) -> None:
        self.layers = layers
        self.floats: dict[tuple[str, int], tuple[Any, Any]] = {}
        self.calls: dict[str, int] = {}
        self.busy = False  # the local re-run of a quantized layer must not measure itself
        self.order: dict[tuple[str, int], None] = {}

    def _call_index(self, name: str) -> int:
        index = self.calls.get(name, 0)
        self.calls[name] = index + 1
        return index

    def float_hook(self, layer: _Layer) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            index = self._call_index(layer.name)
            self.floats[(layer.name, index)] = (_clone(args), _clone(output))

        return hook

    def quant_hook(self, layer: _Layer) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if self.busy:
                return
            index = self._call_index(layer.name)
            recorded = self.floats.get((layer.name, index))
            if recorded is None:  # the float model called this layer fewer times
                return
            self.order[(layer.name, index)] = None
            float_args, float_out = recorded
            label = _row_name(layer.name, index)
            _update(layer.cumulative.setdefault(index, PairStats()), label, float_out, output)
            self.busy = True
            try:
                local_out = module(*float_args)
            finally:
                self.busy = False
            _update(layer.local.setdefault(index, PairStats()), label, float_out, local_out)
            grid = layer.grid.get(index) or _input_grid(module)
            if grid is not None and float_args and isinstance(float_args[0], torch.Tensor):
                layer.grid[index] = grid
                grid.update(float_args[0])

        return hook

    def new_batch(self) -> None:
        self.floats.clear()
        self.calls.clear()

    @contextlib.contextmanager
    def installed(self, on: str) -> Iterator[None]:
        handles = [
            (layer.float_layer if on == "float" else layer.quant_layer).register_forward_hook(
                self.float_hook(layer) if on == "float" else self.quant_hook(layer)
            )
            for layer in self.layers
        ]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def _row_name(name: str, index: int) -> str:
    return name if index == 0 else f"{name}@{index}"


@contextlib.contextmanager
def _eval_mode(*models: nn.Module) -> Iterator[None]:
    modes = [[(m, m.training) for m in model.modules()] for model in models]
    for model in models:
        model.eval()
    try:
        yield
    finally:
        for saved in modes:
            for m, training in saved:
                m.training = training


def _weight_sqnr(layer: _Layer) -> float:
    wq = getattr(layer.quant_layer, "_weight_quantizer", None)
    weight = getattr(layer.quant_layer, "weight", None)
    ref = getattr(layer.float_layer, "weight", None)
    if not isinstance(wq, TensorQuantizer) or not isinstance(weight, torch.Tensor):
        return math.nan
    if not isinstance(ref, torch.Tensor) or ref.shape != weight.shape:
        return math.nan
    stats = PairStats()
    with torch.no_grad():
        stats.update(ref, wq(weight))
    return stats.sqnr


def _table(layers: list[_Layer], order: list[tuple[str, int]]) -> list[dict[str, Any]]:
    by_name = {layer.name: layer for layer in layers}
    rows = []
    for name, index in order:
        layer = by_name[name]
        cumulative, local = layer.cumulative[index], layer.local[index]
        grid = layer.grid.get(index)
        nan = math.nan
        rows.append({
            "node": _row_name(name, index), "op": type(layer.quant_layer).__name__,
            "module": name, "local_sqnr": local.sqnr if local.count else nan,
            "cumulative_sqnr": cumulative.sqnr if cumulative.count else nan,
            "cumulative_mse": cumulative.mse,
            "cumulative_cosine": cumulative.cosine if cumulative.count else nan,
            "cumulative_max_abs_err": cumulative.max_abs if cumulative.count else nan,
            "local_mse": local.mse, "weight_sqnr": _weight_sqnr(layer),
            "float_min": grid.low if grid is not None and grid.count else nan,
            "float_max": grid.high if grid is not None and grid.count else nan,
            "grid_min": grid.grid_min if grid is not None else nan,
            "grid_max": grid.grid_max if grid is not None else nan,
            "clipped": grid.clipped if grid is not None else nan,
            "rmse_scale": grid.rmse_scale if grid is not None else nan,
        })  # fmt: skip
    return rows


def compare_modules(
    float_model: nn.Module,
    quantized_model: nn.Module,
    data: Any,
    *,
    metric: Callable[[Any, Any, Any], float] | None = None,
    progress: bool = True,
    group: Any = False,
) -> NumericReport:
    """Compare every quantized layer of a quant_nn model with the float model's layer.

    Called by :func:`qviz.numeric.compare` when ``quantized_model`` holds TensorQuantizers.

    Args:
        float_model: the float ``nn.Module`` that :func:`quantize_model` copied (float).
        quantized_model: its quant_nn copy, calibrated (quant_nn). Both stages are checked
            before either model runs.
        data: batches (tensors, ``(inputs..., target)`` tuples, dicts, a DataLoader): a tuple
            binds to ``forward``'s required parameters and the items after them are the target,
            so optional parameters (a Hugging Face model's ``attention_mask=None``) stay unset
            unless a dict names them (:mod:`qviz.engine.graph.inputs`).
        metric: optional ``metric(float_out, quant_out, target) -> float`` per batch.
        progress: show a progress bar over the batches.
        group: as for :func:`qviz.numeric.compare`: each rank measures its shard and the
            statistics merge once, exactly (``False``: this process alone).

    Returns:
        A :class:`~qviz.numeric.NumericReport`, one row per call of a quantized layer,
        in the order the quantized model calls them.

    Raises:
        ConfigError: a model at the wrong stage, no quantized layer, a layer the float model
            lacks (or that is itself quantized), quantizers still calibrating, outputs that do
            not match, a batch that does not bind (named), or no data.
    """

    def work(shard: distributed.Shard) -> tuple[list[_Layer], OutputTotals, list]:
        _check_models(float_model, quantized_model, metric)
        layers = _match(float_model, quantized_model)
        hooks = _Hooks(layers)
        with _eval_mode(float_model, quantized_model), torch.no_grad():
            totals = _run(
                float_model, quantized_model, hooks, data, metric,
                progress and shard.rank == 0, empty_ok=shard.distributed,
            )  # fmt: skip
        return layers, totals, list(hooks.order)

    def share(result: tuple[list[_Layer], OutputTotals, list]) -> tuple[dict, list, OutputTotals]:
        layers, totals, order = result
        stats = {layer.name: (layer.cumulative, layer.local, layer.grid) for layer in layers}
        return stats, order, totals

    # each rank measures its shard; one exchange; every rank merges (exact sums)
    out = distributed.sharded(work, group, "compare", share=share)
    layers, totals, _ = out.result
    order: dict[tuple[str, int], None] = {}
    for _, their_order, _ in out.shared:  # every rank's calls, in rank order
        order.update(dict.fromkeys(map(tuple, their_order)))
    for stats, _, their_totals in out.others:
        _merge_stats(layers, stats)
        totals.merge(their_totals)
    if totals.count == 0:
        raise ConfigError("compare got no batches on any rank: every shard is empty")
    report = NumericReport.from_table(_table(layers, list(order)), **totals.figures())
    return report.measured(quantized_model, float_model)


def _check_models(float_model: Any, quantized_model: Any, metric: Any) -> None:
    """The arguments compare_modules takes, checked before either model runs."""
    check_stage(quantized_model, Stage.QUANT_NN, where="compare", arg="quantized_model")
    check_stage(float_model, Stage.FLOAT, where="compare", arg="float_model")
    if isinstance(float_model, GraphModule):
        raise ConfigError(
            f"to compare a quant_nn model, float_model must be the float nn.Module it was made "
            f"from (matched by module name), got {type(float_model).__name__}"
        )
    check_metric(metric)
    _check_not_calibrating(quantized_model)


def _merge_stats(layers: list[_Layer], stats: dict[str, tuple]) -> None:
    """Another rank's per-call statistics added into ``layers``' (exact sums)."""
    by_name = {layer.name: layer for layer in layers}
    for name, kinds in stats.items():
        layer = by_name[name]
        for mine, theirs in zip((layer.cumulative, layer.local, layer.grid), kinds, strict=True):
            for index, value in theirs.items():
                if index in mine:
                    mine[index].merge(value)
                else:
                    mine[index] = value


def _run(
    float_model: nn.Module,
    quantized_model: nn.Module,
    hooks: _Hooks,
    data: Any,
    metric: Callable[[Any, Any, Any], float] | None,
    progress: bool,
    empty_ok: bool = False,
) -> OutputTotals:
    """Run both models on every batch (hooks measuring); the model-level sums."""
    from qviz.numeric.measure.progress import progress_bar

    totals = OutputTotals.for_metric(metric)
    for index, batch in enumerate(progress_bar(batches_of(data, "compare"), progress, "compare")):
        where = f"compare: batch {index}"
        check_finite(batch, where)  # a NaN input is named, not measured
        bound = bind_batch(quantized_model, batch, where)
        hooks.new_batch()
        with batch_errors(where), hooks.installed("float"):
            float_out = float_model(*bound.args, **bound.kwargs)
        hooks.calls.clear()
        with batch_errors(where), hooks.installed("quant"):
            quant_out = quantized_model(*bound.args, **bound.kwargs)
        value = metric_value(metric, single(float_out), single(quant_out), bound.target, where)
        size = batch_size((*bound.args, *bound.kwargs.values()))
        totals.add(float_out, quant_out, size, value, where)
    if totals.count == 0 and not empty_ok:
        raise ConfigError("compare needs at least one batch of data")
    return totals
