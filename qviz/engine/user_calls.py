"""Calling the user's own code (a metric, a loss function): THE guard every such call goes
through.

A callable the user hands in runs deep inside a loop over batches; when it raises, or returns
something the loop cannot use (a string for a metric, a float for a loss to backpropagate), the
traceback would point into qviz and the message would not say which callable, on which batch.
:func:`call_user` calls it and turns both into a :class:`~qviz.errors.ConfigError` naming the
callable, where it was called (``"compare: batch 3"``) and the original error, which stays
chained as ``__cause__``.

Example:
    >>> def metric(float_out, quant_out, target):
    ...     return 1 / 0
    >>> call_user(metric, 1, 2, None, role="metric", where="compare: batch 3",
    ...           signature="metric(float_out, quant_out, target)")
    Traceback (most recent call last):
    ...
    qviz.errors.ConfigError: compare: batch 3: the metric metric raised ZeroDivisionError: division by zero; it is called as metric(float_out, quant_out, target): fix the metric, or what it is given
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from qviz.errors import ConfigError

T = TypeVar("T")


def callable_name(fn: Any) -> str:
    """How a message names a user's callable: its qualified name (``my_metric``,
    ``run.<locals>.<lambda>``), or its class for an object with ``__call__``.

    Example:
        >>> import torch
        >>> callable_name(len), callable_name(torch.nn.MSELoss())
        ('len', 'MSELoss instance')
    """
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if isinstance(name, str) and name:
        return name
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and inner is not fn:
        return f"partial({callable_name(inner)})"
    return f"{type(fn).__name__} instance"


def call_user(
    fn: Callable[..., Any],
    *args: Any,
    role: str,
    where: str,
    signature: str,
    convert: Callable[[Any], T] | None = None,
    expected: str = "",
) -> T | Any:
    """``fn(*args)``, its result passed through ``convert``; either failing is a ConfigError.

    Args:
        fn: the user's callable.
        *args: what it is called with.
        role: what the user passed it as (``"metric"``, ``"loss_fn"``), named by the message.
        where: the call site, with the batch when there is one (``"compare: batch 3"``).
        signature: how it is called (``"metric(float_out, quant_out, target)"``).
        convert: turns the returned value into what the caller uses (a float), raising
            TypeError or ValueError when it cannot; None: the value as it is.
        expected: what ``fn`` must return, for the message (``"a number"``).

    Raises:
        ConfigError: ``fn`` raised (any Exception, a QvizError of its own included), or
            ``convert`` refused its value; the original error is the ``__cause__``.

    Example:
        >>> call_user(lambda x: x + 1, 1, role="metric", where="batch 0", signature="f(x)")
        2
        >>> call_user(lambda x: "high", 1, role="metric", where="compare: batch 0",
        ...           signature="metric(x)", convert=float, expected="a number")
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: compare: batch 0: the metric returned str 'high'; metric(x) must return a number (the metric given: <lambda>)
    """  # noqa: E501
    name = callable_name(fn)
    try:
        value = fn(*args)
    except Exception as exc:
        raise ConfigError(
            f"{where}: the {role} {name} raised {type(exc).__name__}: {exc}; it is called as "
            f"{signature}: fix the {role}, or what it is given"
        ) from exc
    if convert is None:
        return value
    try:
        return convert(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{where}: the {role} returned {type(value).__name__} {value!r:.60}; {signature} "
            f"must return {expected or 'something else'} (the {role} given: {name})"
        ) from exc
