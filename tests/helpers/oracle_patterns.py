"""The reference oracle's pattern graphs, traced once per test process.

torchao's PT2E passes (QAT conv-BN folding in its ``convert_pt2e``, the reference representation)
trace each of their match and replacement patterns with ``torch.export`` every time they run:
108 strict exports, about 37 s, for one QAT conv-BN model on a 2-core AVX2 EPYC, where the
tests' own models take well under a second. A pattern's graph depends only on the pattern's
code, the values it closes over and the example inputs' shapes and dtypes, so the tests keep
the first trace of each and hand torchao a deep copy (its passes edit the graphs they get).
What torchao computes from them is unchanged; only the repeated tracing is saved.

Example:
    >>> import torch
    >>> calls = []
    >>> def trace(pattern, example_inputs, is_cuda=False, **kwargs):
    ...     calls.append(1)
    ...     return torch.fx.symbolic_trace(pattern)
    >>> memo = PatternMemo(trace)
    >>> def double(x):
    ...     return x * 2
    >>> a = memo(double, (torch.zeros(2),))
    >>> b = memo(double, (torch.ones(2),))  # same shape and dtype: the graph is reused
    >>> len(calls), a is not b
    (1, True)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable
from typing import Any

import torch


def _value_key(value: Any) -> Hashable:
    """What a pattern's trace can depend on: a tensor's metadata, any other value itself."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type, value.requires_grad)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_value_key(v) for v in value))
    hash(value)  # an unhashable value: the caller traces without the memo
    return ("value", type(value).__name__, value)


def _function_key(fn: Any) -> Hashable:
    """A function by its code and the values it closes over (torchao builds a new closure for
    every pattern it traces)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError("not a plain function")
    cells = tuple(_value_key(c.cell_contents) for c in (fn.__closure__ or ()))
    defaults = tuple(_value_key(d) for d in (fn.__defaults__ or ()))
    return code, cells, defaults


def _callable_key(pattern: Any) -> Hashable:
    """A plain function, or a module that only wraps one (torchao's ``WrapperModule``)."""
    if isinstance(pattern, torch.nn.Module):
        state = set(vars(pattern)) - {"training", "fn"}
        held = [*pattern.parameters(), *pattern.buffers(), *pattern.children()]
        if held or not hasattr(pattern, "fn") or any(not k.startswith("_") for k in state):
            raise TypeError("a module that holds more than a function")
        return type(pattern), pattern.training, _function_key(pattern.fn)
    return _function_key(pattern)


def _pattern_key(pattern: Callable, example_inputs: tuple, args: tuple, kwargs: dict) -> Hashable:
    return (
        _callable_key(pattern),
        _value_key(tuple(example_inputs)),
        _value_key(args),
        tuple(sorted((k, _value_key(v)) for k, v in kwargs.items())),
    )


class PatternMemo:
    """Wraps torchao's ``_get_aten_graph_module_for_pattern``: one trace per distinct pattern."""

    def __init__(self, trace: Callable[..., Any]) -> None:
        self.trace = trace
        self.graphs: dict[Hashable, Any] = {}

    def __call__(self, pattern: Callable, example_inputs: tuple, *args: Any, **kwargs: Any) -> Any:
        """torchao's own arguments, passed through (``is_cuda`` and whatever a later torchao
        adds are part of the key)."""
        try:
            key = _pattern_key(pattern, example_inputs, args, kwargs)
        except (TypeError, ValueError):  # unhashable or not a function: trace every time
            return self.trace(pattern, example_inputs, *args, **kwargs)
        if key not in self.graphs:
            self.graphs[key] = self.trace(pattern, example_inputs, *args, **kwargs)
        return copy.deepcopy(self.graphs[key])


#: The torchao modules that hold the tracing function under its own name.
TRACING_MODULES = (
    "torchao.quantization.pt2e.utils",
    "torchao.quantization.pt2e.qat_utils",
    "torchao.quantization.pt2e.reference_representation_rewrite",
)
NAME = "_get_aten_graph_module_for_pattern"


def install(monkeypatch: Any) -> PatternMemo | None:
    """Route every torchao module's pattern tracing through one memo; None where this torchao
    has no such function (not installed, or another layout): the tests then trace as torchao
    does, only slower."""
    import importlib

    modules = []
    for name in TRACING_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    original = getattr(modules[0], NAME, None) if modules else None
    if not callable(original):
        return None
    memo = PatternMemo(original)
    for module in modules:
        if getattr(module, NAME, None) is original:
            monkeypatch.setattr(module, NAME, memo)
    return memo
