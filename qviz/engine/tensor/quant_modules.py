"""One-line instrumentation: build a model with quantized layers, or swap them into a built one.

``initialize()`` makes ``torch.nn.Conv2d(...)`` (and every other layer
:mod:`qviz.engine.tensor.quant_nn`
quantizes) construct the quantized version until ``deactivate()``, so a model zoo's constructor
builds a quantized model unchanged; ``enable()`` does the same for a ``with`` block.
``quantize_model(model)`` is for a model that is already built: it returns a copy whose layers
are the quantized versions, with the same weights.

Only the names in the ``torch.nn`` namespace are patched (what model code calls as
``nn.Conv2d``); every patched name is the original again after ``deactivate()``, after the
``with`` block, and after an exception inside it. Calling ``initialize()`` again replaces the
first call's choice instead of stacking on it.

Example:
    >>> import torch
    >>> from qviz.engine import quant_nn
    >>> with enable():
    ...     conv = torch.nn.Conv2d(1, 2, 3)
    >>> type(conv).__name__, torch.nn.Conv2d.__name__
    ('QuantConv2d', 'Conv2d')
    >>> model = quantize_model(torch.nn.Sequential(torch.nn.Linear(4, 2)))
    >>> type(model[0]) is quant_nn.QuantLinear
    True
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from qviz.engine.tensor import quant_nn
from qviz.errors import ConfigError

__all__ = ["deactivate", "enable", "initialize", "is_active", "quantize_model"]


@dataclass(frozen=True)
class _Patch:
    namespace: ModuleType
    name: str
    original: type
    quantized: type


_active: list[_Patch] = []  # what initialize() patched, to be restored by deactivate()


def _default_map() -> list[tuple[ModuleType, str, type]]:
    return [(torch.nn, f.__name__, q) for f, q in quant_nn.QUANT_MODULES.items()]


def _check_custom(custom: Iterable) -> list[tuple[ModuleType, str, type]]:
    out = []
    for entry in custom:
        if not (isinstance(entry, tuple | list) and len(entry) == 3):
            raise ConfigError(
                f"custom_quant_modules entries are (namespace, name, quantized class) tuples, "
                f"e.g. (torch.nn, 'Linear', MyQuantLinear); got {entry!r}"
            )
        namespace, name, quantized = entry
        if not isinstance(name, str) or not hasattr(namespace, name):
            raise ConfigError(f"custom_quant_modules: {namespace!r} has no attribute {name!r}")
        if not (isinstance(quantized, type) and issubclass(quantized, nn.Module)):
            raise ConfigError(
                f"custom_quant_modules: the replacement for {name!r} must be an nn.Module "
                f"class, got {quantized!r}"
            )
        out.append((namespace, name, quantized))
    return out


def _plan(
    float_module_list: Sequence[str] | None, custom_quant_modules: Iterable | None
) -> list[tuple[ModuleType, str, type]]:
    entries = _default_map()
    known = {name for _, name, _ in entries}
    if isinstance(float_module_list, str):
        raise ConfigError(
            f"float_module_list takes a list of layer names: pass [{float_module_list!r}], not "
            f"{float_module_list!r} (a string would be read letter by letter)"
        )
    keep_float = list(float_module_list or ())
    unknown = [n for n in keep_float if n not in known]
    if unknown:
        raise ConfigError(
            f"float_module_list names {unknown}, which quant_modules does not replace; "
            f"names it replaces: {sorted(known)}"
        )
    custom = _check_custom(custom_quant_modules or ())
    overridden = {(id(ns), name) for ns, name, _ in custom}
    entries = [e for e in entries if e[1] not in keep_float and (id(e[0]), e[1]) not in overridden]
    return entries + custom


def initialize(
    float_module_list: Sequence[str] | None = None,
    custom_quant_modules: Iterable[tuple[ModuleType, str, type]] | None = None,
) -> None:
    """Make the ``torch.nn`` layers construct their quantized versions until :func:`deactivate`.

    Args:
        float_module_list: names of layers to keep float, e.g. ``["Linear"]``.
        custom_quant_modules: extra or replacement ``(namespace, name, quantized class)``
            entries, e.g. ``[(torch.nn, "Linear", MyQuantLinear)]``.

    Raises:
        ConfigError: a name that is not replaced, or a malformed custom entry.

    Example:
        >>> initialize(float_module_list=["Linear"])
        >>> type(torch.nn.Conv1d(1, 1, 1)).__name__, type(torch.nn.Linear(1, 1)).__name__
        ('QuantConv1d', 'Linear')
        >>> deactivate()
    """
    plan = _plan(float_module_list, custom_quant_modules)  # validate before touching anything
    deactivate()
    for namespace, name, quantized in plan:
        _active.append(_Patch(namespace, name, getattr(namespace, name), quantized))
        setattr(namespace, name, quantized)


def deactivate() -> None:
    """Put back every name :func:`initialize` replaced (nothing happens when none is).

    Example:
        >>> initialize(); deactivate()
        >>> torch.nn.Linear.__module__
        'torch.nn.modules.linear'
    """
    while _active:
        patch = _active.pop()
        setattr(patch.namespace, patch.name, patch.original)


def is_active() -> bool:
    """Whether :func:`initialize` is in effect.

    Example:
        >>> is_active()
        False
    """
    return bool(_active)


@contextlib.contextmanager
def enable(
    float_module_list: Sequence[str] | None = None,
    custom_quant_modules: Iterable[tuple[ModuleType, str, type]] | None = None,
) -> Iterator[None]:
    """:func:`initialize` for a ``with`` block; what was in effect before comes back after it,
    also when the block raises.

    Example:
        >>> with enable():
        ...     layer = torch.nn.MaxPool2d(2)
        >>> type(layer).__name__, is_active()
        ('QuantMaxPool2d', False)
    """
    before = [(p.namespace, p.name, p.quantized) for p in _active]
    initialize(float_module_list, custom_quant_modules)
    try:
        yield
    finally:
        deactivate()
        for namespace, name, quantized in before:
            _active.append(_Patch(namespace, name, getattr(namespace, name), quantized))
            setattr(namespace, name, quantized)


def quantize_model(
    model: nn.Module,
    float_module_list: Sequence[str] | None = None,
    custom_quant_modules: Iterable[tuple[ModuleType, str, type]] | None = None,
) -> nn.Module:
    """A copy of ``model`` whose layers are their quantized versions, with the same weights.

    A layer is replaced when its type is exactly one that :func:`initialize` would replace
    (a user's subclass of ``nn.Conv2d`` keeps its own forward and is left alone). The float
    model is not changed. A custom quantized class must offer ``from_float(layer)``.

    Args:
        model: a float model.
        float_module_list, custom_quant_modules: as for :func:`initialize`.

    Example:
        >>> float_model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU())
        >>> q = quantize_model(float_model)
        >>> [type(m).__name__ for m in q], type(float_model[0]).__name__
        (['QuantConv2d', 'ReLU'], 'Conv2d')
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"quantize_model needs an nn.Module, got {type(model).__name__}")
    if _active:  # the originals, also while initialize() is in effect
        swap = {p.original: p.quantized for p in _active}
        originals = {(id(p.namespace), p.name): p.original for p in _active}
    else:
        swap, originals = {}, {}
    for namespace, name, quantized in _plan(float_module_list, custom_quant_modules):
        swap[originals.get((id(namespace), name), getattr(namespace, name))] = quantized
    swap = {f: q for f, q in swap.items() if f is not q}
    missing = {q.__name__ for q in swap.values() if not hasattr(q, "from_float")}
    if missing:
        raise ConfigError(
            f"quantize_model needs a from_float(layer) classmethod on {sorted(missing)}"
        )
    copied = copy.deepcopy(model)
    _replace_children(copied, swap)
    return copied


def _replace_children(module: nn.Module, swap: dict[type, type]) -> None:
    for name, child in module.named_children():
        quantized = swap.get(type(child))
        if quantized is not None:
            setattr(module, name, quantized.from_float(child))
        else:
            _replace_children(child, swap)
