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

from typing import Any

import torch

from qviz.errors import ConfigError


def check_metric(metric: Any) -> None:
    """Raise ConfigError unless ``metric`` is None or a function (float_out, quant_out, target)."""
    if metric is not None and not callable(metric):
        raise ConfigError(
            f"metric must be a function (float_out, quant_out, target), got {metric!r}"
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
