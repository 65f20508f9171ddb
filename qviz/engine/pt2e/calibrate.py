"""calibrate: run data through a prepared model so its observers see it.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> batches = [(torch.randn(8, 4), torch.zeros(8)) for _ in range(3)]  # (inputs, labels)
    >>> qviz.calibrate(prepared, batches, progress=False) is prepared
    True
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from qviz.engine import distributed
from qviz.engine.graph.inputs import batches_of, bind_batch, call_model
from qviz.engine.graph.stage import Stage, check_stage, model_stage
from qviz.engine.pt2e.plan import plan_of
from qviz.errors import CalibrationError, ConfigError


def _check_observed(model: Any) -> None:
    """Refuse a model prepare_pt2e returned without a single observer, saying why: its
    quantizer annotated nothing (the plan lists each op left in float and the reason)."""
    plan = plan_of(model) if isinstance(model, nn.Module) else None
    if plan is None or plan.groups or model_stage(model) is not Stage.FLOAT:
        return
    shown = [
        f"{f.node} ({f.op}): {getattr(f.reason, 'value', f.reason)}"
        + (f" ({f.detail})" if f.detail else "")
        for f in plan.float_nodes[:6]
    ]
    more = f" and {len(plan.float_nodes) - 6} more" if len(plan.float_nodes) > 6 else ""
    why = "; ".join(shown) + more if shown else "no quantizable op"
    raise ConfigError(
        f"calibrate: model was prepared, but its quantizer annotated nothing, so "
        f"qviz.prepare_pt2e inserted no observer and there is nothing to calibrate. Why each op "
        f"stayed in float (prepared.plan.float_nodes): {why}. Fix the quantizer: its annotate() "
        f"must set node.meta['quantization_annotation'] on the ops to quantize (check its "
        f"set_global / set_module_name / set_object_type configuration), then prepare again"
    )


def _run(model: nn.Module, batch: Any, index: int) -> None:
    where = f"calibration batch {index}"
    call_model(model, bind_batch(model, batch, where), where)


def calibrate(
    model: nn.Module,
    data: Any,
    *,
    max_batches: int | None = None,
    progress: bool = True,
    group: Any = None,
) -> nn.Module:
    """Run ``data`` through ``model`` without gradients so that its observers collect statistics.

    Args:
        model: a prepared model (:func:`qviz.prepare_pt2e`), calibrated or not: the one stage
            it takes (:func:`qviz.engine.graph.stage.check_stage`).
        data: a DataLoader or any iterable of batches; a batch is a tensor, a tuple/list whose
            leading items are the model's inputs (labels after them are ignored), or a dict of
            inputs by name. A single tensor, tuple or dict is taken as one batch
            (:mod:`qviz.engine.graph.inputs` has the rule, the same for every entry point).
        max_batches: stop after this many batches.
        progress: show a progress bar (a notebook widget in Jupyter; rank 0's only when
            distributed).
        group: a ``torch.distributed`` process group. When one is given, or the default
            group is initialised, each rank calibrates its shard (``data`` is this rank's
            part; an empty shard is fine) and then every observer merges its statistics
            across the ranks, so that all ranks hold the same statistics: one process's over
            all the shards, bit for bit, for min / max and OrderFreeHistogramObserver
            (:mod:`qviz.engine.distributed.sharded` states the guarantee per observer kind);
            every rank must call it. ``group=False`` calibrates this process alone; anything
            but None, False or a ``ProcessGroup`` is a ConfigError.

    Returns:
        ``model``, for chaining.

    Raises:
        ConfigError: ``model`` is not prepared (float, converted or quant_nn: checked before
            anything runs); a bad ``max_batches`` or ``group``; a batch whose inputs do not
            match the exported ones (count, dtype, shape), named by its index; distributed:
            the ranks' prepared models differ, or a rank is in another entry point.
        CalibrationError: no batches at all (on any rank).

        Distributed, whatever one rank raises (a bad argument included) is raised on every
        rank at once, naming that rank and its error, as the same class (its own when it is a
        QvizError, else CalibrationError): no rank waits for one that failed.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
        >>> gm = qviz.export(model, (torch.randn(8, 4),))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> prepared = qviz.prepare_pt2e(gm, q)
        >>> batches = [(torch.randn(8, 4), torch.zeros(8)) for _ in range(3)]  # (inputs, labels)
        >>> qviz.calibrate(prepared, batches, progress=False) is prepared
        True
        >>> prepared.activation_post_process_0.num_batches
        3
    """
    work = functools.partial(_calibrate_shard, model, data, max_batches)
    run_calibration(model, work, progress, group, "calibrate")
    return model


def check_max_batches(max_batches: Any) -> None:
    """``max_batches`` is a positive int or None, else a ConfigError."""
    if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
        raise ConfigError(f"max_batches must be a positive int or None, got {max_batches!r}")


def batch_total(batches: Any, max_batches: int | None) -> int | None:
    """How many batches a progress bar over ``batches`` will see (None: unknown)."""
    total = len(batches) if hasattr(batches, "__len__") else None
    if max_batches is not None:
        total = min(total, max_batches) if total is not None else max_batches
    return total


def run_calibration(
    model: nn.Module, work: Callable[[bool], int], progress: bool, group: Any, what: str
) -> None:
    """Run ``work(show_progress)`` (this process's argument checks, then its batches through
    ``model``; how many ran): alone, or as this rank's shard followed by the merge of every
    observer across the ranks, on the sharded path that reports any rank's error on every rank
    (:func:`qviz.engine.distributed.sharded.calibrate_sharded`; the progress bar is rank 0's)."""
    seen = distributed.calibrate_sharded(
        model, lambda shard: work(progress and shard.rank == 0), group, what
    )
    if seen == 0:
        raise CalibrationError(f"{what} got no batches: the data is empty")


def _calibrate_shard(model: nn.Module, data: Any, max_batches: int | None, progress: bool) -> int:
    """Check the arguments, then run this process's batches through ``model``; how many ran."""
    from tqdm.auto import tqdm

    check_max_batches(max_batches)
    _check_observed(model)
    check_stage(model, Stage.PREPARED, where="calibrate")
    batches = batches_of(data, "calibrate")
    total = batch_total(batches, max_batches)
    seen = 0
    with torch.no_grad():
        # islice, not a break: a notebook bar left by a break is drawn red, as if it failed
        wanted = itertools.islice(batches, max_batches)
        for index, batch in enumerate(
            tqdm(wanted, total=total, desc="calibrating", disable=not progress)
        ):
            _run(model, batch, index)
            seen += 1
    return seen
