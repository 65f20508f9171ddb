"""What the numeric suite reads off a batch and a model output: the batch size, the output's
tensors, and the user's metric checked.

What a batch is, and how it binds to a model (its inputs, and the target the user's metric
reads), is decided in one place for every entry point: :mod:`qviz.engine.graph.inputs`.

Example:
    >>> import torch
    >>> batch_size((torch.ones(2, 3),)), len(flat_tensors([torch.ones(1), (torch.ones(2),)]))
    (2, 2)
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from qviz.errors import ConfigError


def check_metric(metric: Any) -> None:
    """Raise ConfigError unless ``metric`` is None or a function (float_out, quant_out, target)."""
    if metric is not None and not callable(metric):
        raise ConfigError(
            f"metric must be a function (float_out, quant_out, target), got {metric!r}"
        )


def metric_value(metric: Any, float_out: Any, quant_out: Any, target: Any, where: str) -> Any:
    """``metric(float_out, quant_out, target)`` as a float (None when there is no metric).

    Raises:
        ConfigError: the metric returned something that is not a number or a one-element
            tensor, naming ``where`` (e.g. ``"compare: batch 3"``) and what it returned.

    Example:
        >>> metric_value(lambda f, q, t: torch.tensor(0.5), 1, 1, None, "batch 0")
        0.5
    """
    if metric is None:
        return None
    value = metric(float_out, quant_out, target)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(
        f"{where}: the metric returned {type(value).__name__} {value!r:.60}; metric(float_out, "
        f"quant_out, target) must return a number (a float or a one-element tensor) per batch, "
        f"e.g. (quant_out.argmax(1) == target).float().mean().item()"
    )


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
