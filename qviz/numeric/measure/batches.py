"""What the numeric suite reads off a batch and a model output: the batch size, the output's
leaves, and the user's metric checked.

What a batch is, and how it binds to a model (its inputs, and the target the user's metric
reads), is decided in one place for every entry point: :mod:`qviz.engine.graph.inputs`.

A model output is flattened here and nowhere else (:func:`output_leaves`): a tensor, or tuples,
lists, dicts and dataclasses of them, nested; a Hugging Face ``ModelOutput`` is a dict (and a
dataclass) whose unset fields are left out. Every comparison of two outputs (``compare``'s
output SQNR, ``sensitivity``, ``search_precision``, ``compare_lowered``) pairs their
floating-point leaves by path (:func:`output_pairs`).

Example:
    >>> import torch
    >>> batch_size((torch.ones(2, 3),)), len(flat_tensors([torch.ones(1), (torch.ones(2),)]))
    (2, 2)
    >>> [path for path, _ in output_leaves({"logits": torch.ones(1), "ids": (torch.ones(1),)})]
    ['output.logits', 'output.ids[0]']
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

import torch

from qviz.engine.user_calls import call_user
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
        ConfigError: the metric raised, or returned something that is not a number or a
            one-element tensor, naming ``where`` (e.g. ``"compare: batch 3"``), the metric and
            what it raised or returned (:func:`qviz.engine.user_calls.call_user`).

    Example:
        >>> metric_value(lambda f, q, t: torch.tensor(0.5), 1, 1, None, "batch 0")
        0.5
    """
    if metric is None:
        return None
    return call_user(
        metric, float_out, quant_out, target, role="metric", where=where,
        signature="metric(float_out, quant_out, target)", convert=_number,
        expected="a finite number (a float or a one-element tensor) per batch, e.g. "
        "(quant_out.argmax(1) == target).float().mean().item()",
    )  # fmt: skip


def _number(value: Any) -> float:
    """A metric's value as a float; TypeError when it is not a number or one-element tensor,
    ValueError when it is NaN or infinite (a figure no comparison can rank)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        number = float(value.detach())
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
    else:
        raise TypeError(f"not a number: {type(value).__name__}")
    if not math.isfinite(number):
        raise ValueError(f"not finite: {number}")
    return number


def batch_size(inputs: tuple[Any, ...]) -> int:
    """The first dimension of the first non-scalar tensor input (1 when there is none).

    Example:
        >>> batch_size((torch.ones(3, 2),)), batch_size((2.0,))
        (3, 1)
    """
    first = next((x for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0), None)
    return int(first.shape[0]) if first is not None else 1


def output_leaves(out: Any, path: str = "output") -> list[tuple[str, Any]]:
    """Every leaf of a model output with its path, in the order ``torch.export`` flattens it.

    Tuples and lists (``[i]``), dicts (``.key``; a Hugging Face ``ModelOutput`` is one, holding
    its set fields only) and dataclasses (``.field``) are opened, nested; None is no leaf (an
    unset field); anything else (a tensor, a number, an object) is a leaf.

    Example:
        >>> out = {"logits": torch.ones(2), "past": ((torch.ones(1), torch.ones(1)),), "n": 3}
        >>> [path for path, leaf in output_leaves(out)]
        ['output.logits', 'output.past[0][0]', 'output.past[0][1]', 'output.n']
    """
    if out is None:
        return []
    if isinstance(out, torch.Tensor):
        return [(path, out)]
    if isinstance(out, Mapping):
        items = [(_key(path, k), v) for k, v in out.items()]
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        items = [(f"{path}.{f.name}", getattr(out, f.name)) for f in dataclasses.fields(out)]
    elif isinstance(out, list | tuple):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(out)]
    else:
        return [(path, out)]
    return [leaf for sub, value in items for leaf in output_leaves(value, sub)]


def _key(path: str, key: Any) -> str:
    return f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else f"{path}[{key!r}]"


def flat_tensors(out: Any) -> list[torch.Tensor]:
    """Every tensor of a model output (:func:`output_leaves`), in order.

    Example:
        >>> [t.shape[0] for t in flat_tensors((torch.ones(1), [torch.ones(2), "x"]))]
        [1, 2]
    """
    return [leaf for _, leaf in output_leaves(out) if isinstance(leaf, torch.Tensor)]


def output_pairs(
    reference: Any, test: Any, where: str, *, by_position: bool = False
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(path, reference leaf, test leaf)`` for each floating-point tensor of ``reference``
    (integer and bool leaves, token ids or masks, are not measured in dB), paired by path.

    Args:
        reference, test: two outputs of one model (the float model's and a quantized one's).
        where: what an error starts with (``"compare: batch 3"``).
        by_position: ``test`` is the same leaves flattened (a lowered program returns them as
            a tuple): paired in order, named by ``reference``'s paths.

    Raises:
        ConfigError: the outputs do not have the same leaves, or a leaf's shape differs.

    Example:
        >>> ref = {"logits": torch.ones(2, 3), "ids": torch.ones(2, dtype=torch.long)}
        >>> [p for p, _, _ in output_pairs(ref, (torch.ones(2, 3), torch.ones(2)), "b",
        ...                               by_position=True)]
        ['output.logits']
    """
    refs = output_leaves(reference)
    tests = output_leaves(test)
    if by_position and len(tests) == len(refs):
        tests = [(path, leaf) for (path, _), (_, leaf) in zip(refs, tests, strict=True)]
    if [p for p, _ in refs] != [p for p, _ in tests]:
        raise ConfigError(
            f"{where}: the outputs do not have the same leaves ({_names(refs)} against "
            f"{_names(tests)}); compare outputs of the same model"
        )
    pairs = []
    for (path, r), (_, t) in zip(refs, tests, strict=True):
        if not isinstance(r, torch.Tensor) or not r.is_floating_point():
            continue
        if not isinstance(t, torch.Tensor) or t.shape != r.shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ConfigError(
                f"{where}: {path} is {tuple(r.shape)} in the reference but {got} in the "
                f"output compared with it; compare outputs of the same model"
            )
        pairs.append((path, r, t))
    return pairs


def _names(leaves: list[tuple[str, Any]]) -> str:
    names = [p for p, _ in leaves]
    return f"{names[:6]}{' ...' if len(names) > 6 else ''}"


def describe_leaves(out: Any, most: int = 4) -> str:
    """The leaves of an output as ``path (dtype or type)``, for a message.

    Example:
        >>> describe_leaves({"ids": torch.ones(2, dtype=torch.long)})
        'output.ids (torch.int64)'
    """
    leaves = output_leaves(out)
    text = ", ".join(
        f"{p} ({leaf.dtype if isinstance(leaf, torch.Tensor) else type(leaf).__name__})"
        for p, leaf in leaves[:most]
    )
    return (text + (" ..." if len(leaves) > most else "")) or f"{type(out).__name__}, no leaf"
