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
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from qviz.engine import distributed
from qviz.engine.graph.inputs import check_inputs, guard_errors
from qviz.engine.graph.stage import Stage, model_stage
from qviz.errors import CalibrationError, ConfigError

__all__ = ["calibrate"]


def _check_prepared(model: nn.Module) -> None:
    stage = model_stage(model)
    if stage is Stage.CONVERTED:
        raise CalibrationError(
            "calibrate got a converted model (quantize/dequantize ops, no observers): there is "
            "nothing left to calibrate; calibrate the model qviz.prepare_pt2e returned, before "
            "qviz.convert_pt2e"
        )
    if stage is Stage.FLOAT:
        raise CalibrationError(
            f"calibrate got a {type(model).__name__} with no observers: it was never prepared; "
            f"run prepared = qviz.prepare_pt2e(qviz.export(model, example_inputs), quantizer) "
            f"and calibrate `prepared`"
        )


def _run(model: nn.Module, batch: Any, index: int) -> None:
    where = f"calibration batch {index}"
    if isinstance(batch, Mapping):
        with guard_errors(where, CalibrationError):
            model(**batch)
        return
    if isinstance(batch, torch.Tensor):
        inputs: tuple[Any, ...] | list[Any] = (batch,)
    elif isinstance(batch, tuple | list):
        inputs = batch
    else:
        raise CalibrationError(
            f"{where} is a {type(batch).__name__}; give tensors, tuples or lists "
            f"of tensors (inputs first, labels after), or dicts of keyword inputs"
        )
    if isinstance(model, GraphModule):
        # (inputs..., labels...): the model takes as many leading items as it has inputs
        inputs = inputs[: sum(1 for n in model.graph.nodes if n.op == "placeholder")]
        check_inputs(model, inputs, where=where, error=CalibrationError)
    with guard_errors(where, CalibrationError):
        model(*inputs)


def _batches(data: Any) -> Iterable[Any]:
    """A single batch (tensor, tuple, dict) becomes one; anything else iterable is the batches."""
    if isinstance(data, torch.Tensor | tuple | Mapping):
        return [data]
    if isinstance(data, Iterable):
        return data
    raise ConfigError(
        f"calibrate needs a DataLoader, an iterable of batches, or one batch; "
        f"got {type(data).__name__}"
    )


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
        model: a prepared model (:func:`qviz.prepare_pt2e`).
        data: a DataLoader or any iterable of batches; a batch is a tensor, a tuple/list whose
            leading items are the model's inputs (labels after them are ignored), or a dict of
            keyword inputs. A single tensor, tuple or dict is taken as one batch.
        max_batches: stop after this many batches.
        progress: show a progress bar (a notebook widget in Jupyter; rank 0's only when
            distributed).
        group: a ``torch.distributed`` process group. When one is given, or the default
            group is initialised, each rank calibrates its shard (``data`` is this rank's
            part; an empty shard is fine) and then every observer merges its statistics
            across the ranks, so that all ranks hold what one process would after all the
            shards (:mod:`qviz.engine.distributed.sharded` says what is exact); every rank must call
            it. ``group=False`` calibrates this process alone.

    Returns:
        ``model``, for chaining.

    Raises:
        CalibrationError: ``model`` has no observers (never prepared, or already converted); a
            batch whose inputs do not match the exported ones (count, dtype, shape), named by
            its index; no batches at all (on any rank); distributed: a rank failed (raised on
            every rank, naming the rank and its error).
        ConfigError: distributed: the ranks' prepared models differ.
    """
    check_max_batches(max_batches)
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
    """Run ``work(show_progress)`` (this process's batches through ``model``; how many ran):
    alone, or as this rank's shard followed by the merge of every observer across the ranks
    (:func:`qviz.engine.distributed.sharded.run_sharded`; the progress bar is rank 0's)."""
    if distributed.active(group):
        rank, _ = distributed.rank_and_size(group)
        distributed.run_sharded(model, functools.partial(work, progress and rank == 0), group)
    elif work(progress) == 0:
        raise CalibrationError(f"{what} got no batches: the data is empty")


def _calibrate_shard(model: nn.Module, data: Any, max_batches: int | None, progress: bool) -> int:
    """Run this process's batches through ``model``; how many it ran."""
    from tqdm.auto import tqdm

    _check_prepared(model)
    batches = _batches(data)
    total = batch_total(batches, max_batches)
    seen = 0
    with torch.no_grad():
        bar = tqdm(batches, total=total, desc="calibrating", disable=not progress)
        for index, batch in enumerate(bar):
            if max_batches is not None and index >= max_batches:
                break
            _run(model, batch, index)
            seen += 1
    return seen
