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

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from qviz.errors import CalibrationError, ConfigError

__all__ = ["calibrate"]


def _num_inputs(model: nn.Module) -> int | None:
    if isinstance(model, GraphModule):
        return sum(1 for n in model.graph.nodes if n.op == "placeholder")
    return None


def _run(model: nn.Module, batch: Any, n_inputs: int | None, index: int) -> None:
    if isinstance(batch, torch.Tensor):
        model(batch)
    elif isinstance(batch, Mapping):
        model(**batch)
    elif isinstance(batch, tuple | list):
        # (inputs..., labels...): the model takes as many leading items as it has inputs
        model(*batch[: n_inputs if n_inputs is not None else len(batch)])
    else:
        raise CalibrationError(
            f"calibration batch {index} is a {type(batch).__name__}; give tensors, tuples or lists "
            f"of tensors (inputs first, labels after), or dicts of keyword inputs"
        )


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
    model: nn.Module, data: Any, *, max_batches: int | None = None, progress: bool = True
) -> nn.Module:
    """Run ``data`` through ``model`` without gradients so that its observers collect statistics.

    Args:
        model: a prepared model (:func:`qviz.prepare_pt2e`).
        data: a DataLoader or any iterable of batches; a batch is a tensor, a tuple/list whose
            leading items are the model's inputs (labels after them are ignored), or a dict of
            keyword inputs. A single tensor, tuple or dict is taken as one batch.
        max_batches: stop after this many batches.
        progress: show a progress bar (a notebook widget in Jupyter).

    Returns:
        ``model``, for chaining.
    """
    from tqdm.auto import tqdm

    if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
        raise ConfigError(f"max_batches must be a positive int or None, got {max_batches!r}")
    batches = _batches(data)
    total = len(batches) if hasattr(batches, "__len__") else None
    if max_batches is not None:
        total = min(total, max_batches) if total is not None else max_batches
    n_inputs = _num_inputs(model)
    seen = 0
    with torch.no_grad():
        bar = tqdm(batches, total=total, desc="calibrating", disable=not progress)
        for index, batch in enumerate(bar):
            if max_batches is not None and index >= max_batches:
                break
            try:
                _run(model, batch, n_inputs, index)
            except AssertionError as exc:  # torch.export's shape guards
                if "Guard failed" not in str(exc):
                    raise
                raise CalibrationError(
                    f"calibration batch {index} does not fit the shapes the model was exported "
                    f"with ({exc}); export with dynamic_shapes (e.g. a dynamic batch dimension), "
                    f"or drop the short last batch (DataLoader(..., drop_last=True))"
                ) from exc
            seen += 1
    if seen == 0:
        raise CalibrationError("calibrate got no batches: the data is empty")
    return model
