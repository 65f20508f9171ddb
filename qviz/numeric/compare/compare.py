"""``compare``: each quantized operator against its float counterpart, cumulative and local.

Both models run on the same batches. Operators are matched by the debug handle the engine puts
on every operator at export and keeps through prepare and convert
(:mod:`qviz.engine.graph.debug_handles`), so a conv with a folded BatchNorm is compared with the
float BatchNorm's output, and every call of a reused module is its own row.

For one batch:

1. the float model runs and a *copy* of each operator's output is kept (a later in-place op, like
   ``relu_``, cannot change what was recorded);
2. the quantized model runs; at each operator of the plan
   * **cumulative** error: its output as the next operator sees it (after its output
     quantize/dequantize, when it has one) against the float output; the error inherited from
     every layer before is in it;
   * **local** error: the same quantized computation fed the *float* model's inputs: each input's
     quantize/dequantize chain is replayed on the float producer's output, the weights stay
     quantized, and the output goes through the operator's own quantize/dequantize. Only the
     error made at this operator is left;
   * the float output against the output's quantization grid (range, clipped share, rounding
     error in steps);
3. the statistics are added to running sums and the batch's tensors are dropped.

A quant_nn model (TensorQuantizers inside, from ``quantize_model``) is compared layer by layer
with the float model it was copied from, matched by module name, giving the same table
(:mod:`qviz.numeric.compare.modules`).

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> torch.manual_seed(0) and None
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    >>> data = [torch.randn(16, 8) for _ in range(4)]
    >>> gm = qviz.export(model, (data[0],))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> quantized = qviz.convert_pt2e(qviz.calibrate(prepared, data, progress=False))
    >>> report = compare(gm, quantized, data, progress=False)
    >>> list(report.df["node"])
    ['linear', 'relu', 'linear_1']
    >>> bool((report.df["local_sqnr"] > 30).all()), report.output_sqnr > 30
    (True, True)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from qviz.engine import distributed
from qviz.engine.compat import quantized_decomposed
from qviz.engine.graph.debug_handles import assign_handles, float_handle, handle
from qviz.engine.graph.fingerprint import check_lineage
from qviz.engine.graph.inputs import batches_of, bind_batch, check_finite
from qviz.engine.graph.node_data import op_name
from qviz.engine.graph.stage import Stage, check_stage, model_stage
from qviz.engine.pt2e.passes.bn_fold import fused_conv_bn_params
from qviz.engine.pt2e.plan import plan_of
from qviz.errors import ConfigError
from qviz.numeric.compare.modules import compare_modules
from qviz.numeric.compare.report import NumericReport
from qviz.numeric.compare.runs import (
    FloatRun,
    QuantRun,
    Row,
    changes_values,
    fusable_quantizes,
    output_probe,
    qdq_ops,
)
from qviz.numeric.measure.batches import batch_size, check_metric, metric_value
from qviz.numeric.measure.slices import SliceStats
from qviz.numeric.measure.streaming import GridStats, PairStats
from qviz.numeric.measure.totals import OutputTotals, single


def _plan_ops(model: GraphModule) -> list[str]:
    plan = plan_of(model)
    if plan is None:
        raise ConfigError(
            f"compare needs the quantized model from qviz.convert_pt2e (it carries .plan), got "
            f"{type(model).__name__} without a plan (for a quant_nn model, pass the module "
            f"itself, not its export)"
        )
    names: dict[str, None] = {}
    for record in plan.tensors:
        ref = record.tensor
        names[ref.consumer if ref.consumer is not None else ref.producer] = None
    return list(names)


def float_graph_of(float_model: Any, example: tuple[Any, ...]) -> GraphModule:
    """The float graph module with debug handles: as given, numbered on a copy, or exported."""
    if isinstance(float_model, GraphModule):
        has = any(handle(n) is not None for n in float_model.graph.nodes)
        return float_model if has else assign_handles(copy.deepcopy(float_model))
    if isinstance(float_model, torch.nn.Module):
        from qviz.engine.graph.capture import export

        return export(float_model, example, dynamic_batch=True)
    raise ConfigError(
        f"float_model must be the float nn.Module or the graph module qviz.export returned, got "
        f"{type(float_model).__name__}"
    )


def _check_match(row: Row, float_nodes: dict[int, Node]) -> None:
    twin = float_nodes.get(row.ref)
    n = row.node
    if twin is None:
        raise ConfigError(
            f"{n.format_node()}: the float model has no operator with debug handle {row.ref}; "
            f"pass the graph module you quantized (the result of qviz.export) as float_model"
        )
    if handle(n) == row.ref and twin.target != n.target:
        raise ConfigError(
            f"the float model does not match the quantized one: debug handle {row.ref} is "
            f"{twin.format_node()} in float but {n.format_node()} quantized; pass the graph "
            f"module you quantized (the result of qviz.export) as float_model"
        )


def _weight_sqnr(row: Row, fgm: GraphModule, qgm: GraphModule, twin: Node) -> float:
    """SQNR of the dequantized weight against the float weight (BatchNorm folded in if it was)."""
    n = row.node
    if len(n.args) < 2 or not isinstance(n.args[1], Node) or not isinstance(twin.args[1], Node):
        return math.nan
    from qviz.engine.graph.get_attr import get_attr_value

    w_float = get_attr_value(fgm, twin.args[1], default=None)
    if w_float is None:
        return math.nan
    bn = _folded_bn(fgm, row.ref)
    if bn is not None and bn is not twin:
        w_float = fused_conv_bn_params(fgm, twin, bn)[0]
    w_quant = _evaluate_constant(qgm, n.args[1])
    if w_quant is None or w_quant.shape != w_float.shape:
        return math.nan
    stats = PairStats()
    stats.update(w_float, w_quant)
    return stats.sqnr


def _folded_bn(fgm: GraphModule, ref: int) -> Node | None:
    node = next((n for n in fgm.graph.nodes if handle(n) == ref), None)
    if node is not None and node.target is not None and "batch_norm" not in str(node.target):
        node = node.args[0] if node.args and isinstance(node.args[0], Node) else None
    if node is not None and "batch_norm" in str(node.target):
        return node
    return None


def _evaluate_constant(gm: GraphModule, node: Node) -> torch.Tensor | None:
    """Evaluate a chain of ops over constants only (``dequantize(int8 weight, ...)``)."""
    from qviz.engine.graph.get_attr import get_attr_value

    if node.op == "get_attr":
        return get_attr_value(gm, node, default=None)
    if node.op != "call_function":
        return None
    try:
        args = map_arg(node.args, lambda a: _required(_evaluate_constant(gm, a), a))
        kwargs = map_arg(node.kwargs, lambda a: _required(_evaluate_constant(gm, a), a))
    except LookupError:
        return None
    with torch.no_grad():
        return node.target(*args, **kwargs)


def _required(value: Any, node: Node) -> Any:
    if value is None:
        raise LookupError(node.name)
    return value


def _rows(qgm: GraphModule, fgm: GraphModule) -> list[Row]:
    quantize_ops, dequantize_ops = qdq_ops()
    planned = set(_plan_ops(qgm))
    float_nodes = {handle(n): n for n in fgm.graph.nodes if handle(n) is not None}
    rows = []
    for n in qgm.graph.nodes:  # graph order
        if n.name not in planned or n.op != "call_function" or float_handle(n) is None:
            continue
        probe, q = output_probe(n, quantize_ops, dequantize_ops)
        row = Row(node=n, ref=float_handle(n), probe=probe, grid_q=q)
        row.slices.channels_first = "conv" in op_name(n)
        _check_match(row, float_nodes)
        if q is not None and q.target == quantized_decomposed().quantize_per_tensor.default:
            scale, zp, qmin, qmax = q.args[1:5]
            row.grid = GridStats(
                scale=float(scale), zero_point=int(zp), quant_min=int(qmin), quant_max=int(qmax)
            )
        own = handle(n)
        twin = float_nodes.get(own if own is not None else row.ref)
        if twin is not None:
            row.weight_sqnr = _weight_sqnr(row, fgm, qgm, twin)
        rows.append(row)
    if not rows:
        bodies = getattr(plan_of(qgm), "loop_bodies", ())
        if bodies:
            raise ConfigError(
                f"the quantized operators of this model are all inside loop bodies ({bodies}); "
                f"compare reads the top-level graph only: compare a loop body's operators by "
                f"exporting the loop's step as a model of its own"
            )
        raise ConfigError(
            "the quantized model has no quantized operator with a debug handle to compare: pass "
            "a model from qviz.convert_pt2e, prepared from a graph module of qviz.export"
        )
    return rows


def compare(
    float_model: Any,
    quantized_model: GraphModule | torch.nn.Module,
    data: Any,
    *,
    metric: Callable[[Any, Any, Any], float] | None = None,
    progress: bool = True,
    group: Any = None,
) -> NumericReport:
    """Compare every quantized operator with its float counterpart over ``data``.

    Args:
        float_model: the graph module you quantized (from :func:`qviz.export`), or the float
            ``nn.Module`` (exported on the first batch; for a quant_nn model, the one it copied).
        quantized_model: the model from :func:`qviz.convert_pt2e`, or a calibrated quant_nn
            model (each quantized layer against the float layer of the same name).
        data: batches as for :func:`qviz.calibrate` (tensors, ``(inputs..., target)`` tuples,
            dicts, a DataLoader, or one batch); the items after the inputs are the target.
        metric: optional ``metric(float_out, quant_out, target) -> float``, batch-weighted.
        progress: show a progress bar over the batches (rank 0's only when distributed).
        group: a process group (or the default one): ``data`` is this rank's shard, and every
            rank's report is one process's over all shards, bit for bit. False: this one alone.

    Returns:
        A :class:`~qviz.numeric.compare.report.NumericReport`: a row per quantized operator in graph
        order (SQNR, MSE, cosine, errors, clipping, slices), the outputs' SQNR and the metric.

    Raises:
        ConfigError: a model at the wrong stage (checked first), without a plan or handles,
            models that do not match, or a batch that does not bind (named).

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> gm = qviz.export(torch.nn.Linear(4, 4).eval(), (torch.randn(8, 4),))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> data = [torch.randn(8, 4) for _ in range(2)]
        >>> quantized = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), data,
        ...                               progress=False))
        >>> compare(gm, quantized, data, progress=False).worst(1)["node"].tolist()
        ['linear']
    """
    if isinstance(quantized_model, torch.nn.Module) and model_stage(quantized_model) is (
        Stage.QUANT_NN
    ):
        return compare_modules(
            float_model, quantized_model, data, metric=metric, progress=progress, group=group
        )

    def work(shard: distributed.Shard) -> tuple[list[Row], _Measured]:
        _check_models(float_model, quantized_model)
        check_metric(metric)
        return _measure_shard(float_model, quantized_model, data, metric, progress, shard)

    # each rank measures its shard; one exchange; every rank merges in rank order (exact sums)
    out = distributed.sharded(work, group, "compare", share=lambda result: result[1])
    rows, measured = out.result
    for part in out.others:
        measured.merge(part)
    return _report(rows, measured).measured(quantized_model, float_model)


def _check_models(
    float_model: Any,
    quantized_model: Any,
    where: str = "compare",
    arg: str = "quantized_model",
    stages: tuple[Stage, ...] = (Stage.CONVERTED, Stage.QUANT_NN),
) -> Stage:
    """The stages ``where`` takes, checked before either model runs: the quantized model's."""
    stage = check_stage(quantized_model, stages, where=where, arg=arg)
    check_stage(float_model, Stage.FLOAT, where=where, arg="float_model")
    check_lineage(float_model, quantized_model, where)  # another model's float: refused
    return stage


def _needed(rows: list[Row]) -> set[int]:
    """Float handles to keep: each row's reference and the producers of its inputs."""
    quantize_ops, dequantize_ops = qdq_ops()
    qdq = quantize_ops | dequantize_ops
    wanted = {r.ref for r in rows}
    for r in rows:
        for arg in r.node.all_input_nodes:
            while arg.op == "call_function" and arg.target in qdq:
                arg = arg.args[0]
            ref = float_handle(arg) if arg.op == "call_function" else None
            if ref is not None:
                wanted.add(ref)
    return wanted


def _chain_first(first: Any, rest: Iterable[Any]) -> Iterable[Any]:
    yield first
    yield from rest


@dataclass
class _Measured:
    """What one process measured: the rows' statistics and the model-level totals (picklable)."""

    stats: list[tuple[PairStats, PairStats | None, GridStats | None, SliceStats]]
    totals: OutputTotals
    nodes: tuple[str, ...]  # the rows' node names: ranks must measure the same operators

    def merge(self, other: _Measured) -> None:
        if other.nodes != self.nodes:
            raise ConfigError(
                f"the ranks compared different graphs ({len(self.nodes)} vs {len(other.nodes)} "
                f"operators): every rank must compare the same float and quantized models"
            )
        for mine, theirs in zip(self.stats, other.stats, strict=True):
            for a, b in zip(mine, theirs, strict=True):
                if a is not None and b is not None:
                    a.merge(b)
        self.totals.merge(other.totals)


def _report(rows: list[Row], measured: _Measured) -> NumericReport:
    return NumericReport.from_rows(rows, **measured.totals.figures())


def compare_each(
    float_model: Any,
    quantized_models: Iterable[GraphModule],
    data: Any,
    *,
    metric: Callable[[Any, Any, Any], float] | None = None,
    progress: bool = True,
) -> list[NumericReport]:
    """:func:`compare` for several quantized models of one float model, the float model run once
    per batch for all of them.

    Each report equals ``compare(float_model, quantized, data, metric=metric)`` bit for bit;
    the float model's outputs for a batch are measured against every quantized model before
    the next batch is read, so the time is one float forward per batch instead of one per
    model, and one batch of float activations is alive at a time.

    Args:
        float_model: as for :func:`compare`.
        quantized_models: models from :func:`qviz.convert_pt2e` of that float model (all are
            alive at once: give converted models, whose weights are integers).
        data: batches as for :func:`compare`.
        metric: optional ``metric(float_out, quant_out, target) -> float``, batch-weighted.
        progress: show a progress bar over the batches.

    Returns:
        One :class:`~qviz.numeric.compare.report.NumericReport` per quantized model, in order.

    Raises:
        ConfigError: no quantized model, one at the wrong stage or of another float model
            (checked before anything runs), or a batch that does not bind (named).

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> gm = qviz.export(torch.nn.Linear(4, 4).eval(), (torch.randn(8, 4),))
        >>> data = [torch.randn(8, 4) for _ in range(2)]
        >>> def quantized(per_channel):
        ...     q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(per_channel))
        ...     return qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), data,
        ...                                             progress=False))
        >>> reports = compare_each(gm, [quantized(False), quantized(True)], data, progress=False)
        >>> [r.df["node"].tolist() for r in reports]
        [['linear'], ['linear']]
    """
    models = list(quantized_models)
    if not models:
        raise ConfigError("compare_each needs at least one quantized model")
    for index, model in enumerate(models):
        _check_models(float_model, model, "compare_each", f"quantized_models[{index}]",
                      (Stage.CONVERTED,))  # fmt: skip
    check_metric(metric)
    batches = iter(batches_of(data, "compare_each"))
    first = next(batches, None)
    if first is None:
        raise ConfigError("compare_each needs at least one batch of data")
    fgm = float_graph_of(float_model, bind_batch(models[0], first, "compare_each: batch 0").args)
    rows_each = [_rows(q, fgm) for q in models]
    measured = _measure(fgm, list(zip(models, rows_each, strict=True)),
                        _chain_first(first, batches), metric, progress)  # fmt: skip
    return [
        _report(rows, m).measured(q, float_model)
        for q, rows, m in zip(models, rows_each, measured, strict=True)
    ]


def _measure_shard(
    float_model: Any, qgm: Any, data: Any, metric: Any, progress: bool, shard: distributed.Shard
) -> tuple[list[Row], _Measured]:
    """This process's rows and what it measured on its batches (an empty shard is fine when
    distributed and ``float_model`` is the exported graph; alone, no data is an error)."""
    batches = iter(batches_of(data, "compare"))
    first = next(batches, None)
    if first is None and not shard.distributed:
        raise ConfigError("compare needs at least one batch of data")
    if first is None and not isinstance(float_model, GraphModule):
        raise ConfigError(
            "this rank's shard is empty and float_model is an nn.Module, which compare "
            "exports on the first batch: pass the graph module qviz.export returned"
        )
    example = () if first is None else bind_batch(qgm, first, "compare: batch 0").args
    fgm = float_graph_of(float_model, example)
    rows = _rows(qgm, fgm)
    mine = () if first is None else _chain_first(first, batches)
    measured = _measure(fgm, [(qgm, rows)], mine, metric, progress and shard.rank == 0)
    return rows, measured[0]


def _measure(fgm, models, batches, metric, progress) -> list[_Measured]:
    """Each ``(quantized model, rows)`` of ``models`` measured on every batch; the float model
    runs once per batch, its kept outputs read (never changed) by every quantized run."""
    wanted = set().union(*(_needed(rows) for _, rows in models))
    float_handles = {n: h for n in fgm.graph.nodes if (h := handle(n)) is not None}
    totals = [OutputTotals.for_metric(metric) for _ in models]
    fused = [fusable_quantizes(qgm) for qgm, _ in models]
    copy_outputs = changes_values(fgm)  # kept outputs are copied only if an op could write
    from qviz.numeric.measure.progress import progress_bar

    with torch.no_grad():
        for index, batch in enumerate(progress_bar(batches, progress, "compare")):
            where = f"compare: batch {index}"
            check_finite(batch, where)  # a NaN input is named, not measured
            bound = bind_batch(models[0][0], batch, where)
            float_run = FloatRun(fgm, float_handles, wanted, copy_outputs)
            float_out = float_run.run(*bound.args)
            size = batch_size(bound.args)
            for (qgm, rows), total, exact in zip(models, totals, fused, strict=True):
                quant_out = QuantRun(qgm, rows, float_run.outputs, exact).run(*bound.args)
                value = metric_value(metric, single(float_out), single(quant_out), bound.target,
                                     where)  # fmt: skip
                total.add(float_out, quant_out, size, value, where)
            del float_run
    return [
        _Measured(
            [(r.cumulative, r.local, r.grid, r.slices) for r in rows],
            total,
            tuple(r.node.name for r in rows),
        )
        for (_, rows), total in zip(models, totals, strict=True)
    ]
