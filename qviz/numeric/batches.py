"""Batches for the numeric suite: the model's inputs, and the target the user's metric reads.

A batch is a tensor (the only input), or a tuple/list whose leading items are the model's inputs
and whose next item (if any) is the target, as a ``(images, labels)`` DataLoader gives.

Example:
    >>> import torch
    >>> inputs, target = split_batch((torch.ones(2, 3), torch.tensor([0, 1])), None, 0, "compare")
    >>> len(inputs), target.tolist()
    (1, [0, 1])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.fx import GraphModule

from qviz.engine.graph.inputs import check_inputs
from qviz.errors import ConfigError

__all__ = [
    "batch_size",
    "batches_of",
    "check_metric",
    "checked_batches",
    "flat_tensors",
    "num_inputs",
    "split_batch",
]


def batches_of(data: Any, where: str) -> Iterable[Any]:
    """A single tensor or tuple is one batch; any other iterable is the batches."""
    if isinstance(data, torch.Tensor | tuple):
        return [data]
    if isinstance(data, Iterable) and not isinstance(data, str | bytes | dict):
        return data
    raise ConfigError(
        f"{where} needs a DataLoader, an iterable of batches, or one batch; "
        f"got {type(data).__name__}"
    )


def check_metric(metric: Any) -> None:
    """Raise ConfigError unless ``metric`` is None or a function (float_out, quant_out, target)."""
    if metric is not None and not callable(metric):
        raise ConfigError(
            f"metric must be a function (float_out, quant_out, target), got {metric!r}"
        )


def split_batch(batch: Any, model: Any, index: int, where: str) -> tuple[tuple[Any, ...], Any]:
    """``(inputs, target)`` of one batch, its inputs checked against ``model``'s exported ones.

    ``target`` is None when the batch has none. For a graph module the inputs must match what
    it was exported with (count, dtype, static dimensions), else a ConfigError names ``where``,
    the batch and the input (:func:`qviz.engine.graph.inputs.check_inputs`).
    """
    graph = model if isinstance(model, GraphModule) else None
    n_inputs = num_inputs(graph) if graph is not None else 1
    if isinstance(batch, torch.Tensor):
        inputs, target = (batch,), None
    elif isinstance(batch, tuple | list):
        if len(batch) < n_inputs:
            raise ConfigError(
                f"{where}: batch {index} has {len(batch)} items but the model takes {n_inputs} "
                f"inputs; give (inputs..., target) tuples"
            )
        rest = batch[n_inputs:]
        target = rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)
        inputs = tuple(batch[:n_inputs])
    else:
        raise ConfigError(
            f"{where}: batch {index} is a {type(batch).__name__}; give tensors or "
            f"(inputs..., target) tuples"
        )
    if graph is not None:
        check_inputs(graph, inputs, where=f"{where}: batch {index}")
    return inputs, target


def checked_batches(data: Any, model: Any, where: str) -> list[Any]:
    """The batches of ``data`` as a list, each checked with :func:`split_batch` first."""
    batches = list(batches_of(data, where))
    for index, batch in enumerate(batches):
        split_batch(batch, model, index, where)
    return batches


def num_inputs(gm: Any) -> int:
    """How many inputs a graph module takes (its placeholders)."""
    return sum(1 for n in gm.graph.nodes if n.op == "placeholder")


def batch_size(inputs: tuple[Any, ...]) -> int:
    """The first dimension of the first non-scalar tensor input (1 when there is none).

    Example:
        >>> batch_size((torch.ones(3, 2),)), batch_size((2.0,))
        (3, 1)
    """
    first = next((x for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)
    return int(first.shape[0]) if first is not None else 1


def flat_tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor of a model output (nested tuples and lists), in order.

    Example:
        >>> [t.shape[0] for t in flat_tensors((torch.ones(1), [torch.ones(2), "x"]))]
        [1, 2]
    """
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [t for o in out for t in flat_tensors(o)]
    return []
