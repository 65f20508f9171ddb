"""Check a batch against the inputs a captured graph was exported with, before running it.

A batch of the wrong dtype or shape fails deep inside the model (``Input type (long int) and
bias type (float) should be the same``) or in torch.export's guard (``Guard failed:
x.size()[1] == 3``). :func:`check_inputs` compares each input with its placeholder's example
value first (dtype, number of dimensions, every static dimension; dynamic dimensions take any
size) and names the batch, the input and the fix; :func:`guard_errors` turns the guards that
remain (a dynamic dimension's range) into the same kind of error. ``qviz.calibrate``, the
numeric suite, the dashboard and ``qviz.data.evaluate`` all check batches here.

Example:
    >>> import torch, qviz
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),), dynamic_batch=True)
    >>> check_inputs(gm, (torch.randn(3, 4),), where="batch 0")   # any batch size: fine
    >>> check_inputs(gm, (torch.randn(3, 5),), where="batch 1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    qviz.errors.ConfigError: batch 1: input 0 (...) has shape (3, 5) but the model was exported \
for (*, 4) (* = any size); give inputs of that shape, or export with dynamic_shapes for the \
dimensions that vary
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.fx import GraphModule

from qviz.errors import ConfigError, QvizError

__all__ = ["check_inputs", "guard_errors"]


def _expected(gm: GraphModule) -> list[tuple[str, Any]]:
    """``(placeholder name, example value)`` of each input, in order."""
    return [(n.name, n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]


def _pattern(shape: Sequence[Any]) -> str:
    dims = ["*" if isinstance(d, torch.SymInt) else str(int(d)) for d in shape]
    return f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"


def _shape_fits(shape: Sequence[Any], got: torch.Size) -> bool:
    if len(shape) != len(got):
        return False
    return all(isinstance(d, torch.SymInt) or int(d) == g for d, g in zip(shape, got, strict=True))


def _problem(name: str, i: int, expected: Any, value: Any) -> str | None:
    label = f"input {i} ({name!r})"
    if not isinstance(expected, torch.Tensor):
        return None  # a non-tensor input (a number, None): the model checks it itself
    if not isinstance(value, torch.Tensor):
        return (
            f"{label} is a {type(value).__name__} but the model was exported with a "
            f"{expected.dtype} tensor; give a tensor"
        )
    if value.dtype != expected.dtype:
        return (
            f"{label} is {value.dtype} but the model was exported with {expected.dtype}; "
            f"convert the batch (e.g. x.to({expected.dtype})) or export with inputs of that dtype"
        )
    if not _shape_fits(expected.shape, value.shape):
        fix = (
            "give inputs of that shape, or export with dynamic_shapes for the dimensions that vary"
        )
        if _shape_fits(expected.shape[1:], value.shape[1:]):  # only the batch size differs
            fix = (
                "export with dynamic_batch=True for any batch size, or drop the short last "
                "batch (DataLoader(..., drop_last=True))"
            )
        return (
            f"{label} has shape {tuple(value.shape)} but the model was exported for "
            f"{_pattern(expected.shape)} (* = any size); {fix}"
        )
    return None


def check_inputs(
    gm: GraphModule,
    inputs: Sequence[Any],
    *,
    where: str,
    error: type[QvizError] = ConfigError,
) -> None:
    """Raise ``error`` if ``inputs`` cannot run through ``gm`` as exported.

    Args:
        gm: a graph captured by ``qviz.export`` (float, prepared or converted).
        inputs: the positional inputs of one batch.
        where: what the message starts with, e.g. ``"calibration batch 3"``.
        error: the QvizError subclass to raise (CalibrationError for calibration).
    """
    expected = _expected(gm)
    if len(inputs) != len(expected):
        names = [name for name, _ in expected]
        raise error(
            f"{where}: {len(inputs)} inputs for a model that takes {len(expected)} {names}; "
            f"give (inputs..., target) batches with the inputs first"
        )
    for i, ((name, example), value) in enumerate(zip(expected, inputs, strict=True)):
        problem = _problem(name, i, example, value)
        if problem is not None:
            raise error(f"{where}: {problem}")


@contextlib.contextmanager
def guard_errors(where: str, error: type[QvizError] = ConfigError) -> Iterator[None]:
    """Turn torch.export's input guard failures inside the block into ``error``."""
    try:
        yield
    except AssertionError as exc:
        if "Guard failed" not in str(exc):
            raise
        raise error(
            f"{where} does not fit the shapes the model was exported with ({exc}); export with "
            f"dynamic_shapes (e.g. dynamic_batch=True), or drop the short last batch "
            f"(DataLoader(..., drop_last=True))"
        ) from exc
