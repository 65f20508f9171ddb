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

A linear layer of another library is not an ``nn.Linear`` and stays float: Hugging Face GPT-2
projects with ``transformers.pytorch_utils.Conv1D`` (``x @ weight + bias``, weight
``[in, out]``). ``quantize_model`` warns once about every such layer it leaves alone (by class,
with counts and names, and the ``custom_quant_modules`` entry that maps it);
:func:`unquantized_linear_layers` lists them as records; and
``quant_nn.quant_transposed_linear(Conv1D)`` is the quantized class that entry names.

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
import sys
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn
from torch.nn.utils import parametrize

from qviz.engine.tensor import quant_nn
from qviz.engine.tensor.quant_nn.mixin import QuantInputMixin
from qviz.errors import ConfigError

__all__ = [
    "UnquantizedLayer",
    "deactivate",
    "enable",
    "initialize",
    "is_active",
    "quantize_model",
    "unquantized_linear_layers",
]


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

    A custom entry patches the name in that namespace only: a library that imported the class
    into its own module reads it from there (transformers' GPT-2 reads ``Conv1D`` from
    ``transformers.models.gpt2.modeling_gpt2``). Nothing is built yet, so nothing can warn about
    foreign layers here: :func:`unquantized_linear_layers` lists those of the built model.

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
    model is not changed. A custom quantized class must offer ``from_float(layer)``; a custom
    entry's namespace is any object that holds the float class under that name (for
    transformers' GPT-2: ``(transformers.pytorch_utils, "Conv1D",
    quant_nn.quant_transposed_linear(transformers.pytorch_utils.Conv1D))``).

    Linear-like layers left float (see :func:`unquantized_linear_layers`; classes named in
    ``float_module_list`` excepted) are named in one ``UserWarning``, grouped by class, with
    the ``custom_quant_modules`` entry to pass.

    Args:
        model: a float model.
        float_module_list, custom_quant_modules: as for :func:`initialize`.

    Example:
        >>> float_model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU())
        >>> q = quantize_model(float_model)
        >>> [type(m).__name__ for m in q], type(float_model[0]).__name__
        (['QuantConv2d', 'ReLU'], 'Conv2d')
        >>> class Conv1D(torch.nn.Module):   # transformers.pytorch_utils.Conv1D, in short
        ...     def __init__(self, nf, nx):
        ...         super().__init__()
        ...         self.nf, self.nx = nf, nx
        ...         self.weight = torch.nn.Parameter(torch.randn(nx, nf))
        ...         self.bias = torch.nn.Parameter(torch.zeros(nf))
        >>> import types, warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     _ = quantize_model(torch.nn.Sequential(Conv1D(2, 4)))
        >>> message = str(caught[0].message)
        >>> "left 1 linear-like layer float" in message, "quant_transposed_linear(" in message
        (True, True)
        >>> namespace = types.SimpleNamespace(Conv1D=Conv1D)  # GPT-2: transformers.pytorch_utils
        >>> q = quantize_model(torch.nn.Sequential(Conv1D(2, 4)), custom_quant_modules=[
        ...     (namespace, "Conv1D", quant_nn.quant_transposed_linear(Conv1D))])
        >>> type(q[0]).__name__, unquantized_linear_layers(q)
        ('QuantConv1D', ())
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
    kept = {originals.get((id(torch.nn), n), getattr(torch.nn, n)) for n in float_module_list or ()}
    left = [r for r in unquantized_linear_layers(copied) if r.module_class not in kept]
    if left:
        warnings.warn(_left_float_message(left, copied), UserWarning, stacklevel=2)
    return copied


def _replace_children(module: nn.Module, swap: dict[type, type]) -> None:
    for name, child in module.named_children():
        quantized = swap.get(type(child))
        if quantized is not None:
            setattr(module, name, quantized.from_float(child))
        else:
            _replace_children(child, swap)


# -- linear-like layers left float --------------------------------------------------------------
_NOT_MATMUL: tuple[type[nn.Module], ...] = (nn.Embedding, nn.EmbeddingBag)  # 2-D weight, a lookup


@dataclass(frozen=True)
class UnquantizedLayer:
    """A linear-like layer left float: its module path, its class and its weight's shape.

    Example:
        >>> UnquantizedLayer("h.0.attn.c_attn", torch.nn.Linear, (96, 32)).class_name
        'torch.nn.modules.linear.Linear'
    """

    name: str
    module_class: type
    weight_shape: tuple[int, ...]

    @property
    def class_name(self) -> str:
        """The class's module and qualified name."""
        return f"{self.module_class.__module__}.{self.module_class.__qualname__}"


def _own_weight(module: nn.Module) -> torch.Tensor | None:
    if "weight" in module._parameters or "weight" in module._buffers:
        weight = module._parameters.get("weight", module._buffers.get("weight"))
    elif parametrize.is_parametrized(module, "weight"):
        weight = module.weight
    else:
        return None
    lazy = isinstance(weight, nn.parameter.UninitializedTensorMixin)
    return weight if isinstance(weight, torch.Tensor) and not lazy else None


def unquantized_linear_layers(model: nn.Module) -> tuple[UnquantizedLayer, ...]:
    """The layers of ``model`` that look like a matmul with a weight but are not quantized.

    The rule is structural, for any library's classes: a module that registers a 2-D
    ``weight`` itself (a parameter, a buffer or a parametrization; not a child's) and is
    neither a quantized layer (a ``quant_nn`` class) nor a lookup table (``nn.Embedding``,
    ``nn.EmbeddingBag`` and their subclasses). That finds transformers' ``Conv1D`` (weight
    ``[in, out]``), a float ``nn.Linear`` and its subclasses (which ``quantize_model`` leaves
    alone, as they may have their own forward); it skips norms and biases (1-D weights),
    convolutions (3-D and more) and lazy layers not yet built. A module with a 2-D weight that is
    no matmul (another kind of lookup) would be listed too: check the class before mapping it.

    Args:
        model: any model, float or quantized.

    Returns:
        One record per module, in ``named_modules`` order.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4),
        ...                             torch.nn.Linear(4, 2))
        >>> [(r.name, r.module_class.__name__, r.weight_shape)
        ...  for r in unquantized_linear_layers(model)]
        [('2', 'Linear', (2, 4))]
        >>> unquantized_linear_layers(quantize_model(model))
        ()
    """
    records = []
    for name, module in model.named_modules():
        if isinstance(module, (QuantInputMixin, *_NOT_MATMUL)):
            continue
        weight = _own_weight(module)
        if weight is not None and weight.dim() == 2:
            records.append(UnquantizedLayer(name, type(module), tuple(weight.shape)))
    return tuple(records)


def _importable(cls: type) -> bool:
    return getattr(sys.modules.get(cls.__module__), cls.__qualname__, None) is cls


def _mapping_entry(record: UnquantizedLayer, example: nn.Module) -> str:
    cls = record.module_class
    namespace = cls.__module__ if _importable(cls) else f"<namespace holding {cls.__qualname__}>"
    nf, nx = getattr(example, "nf", None), getattr(example, "nx", None)
    if isinstance(nf, int) and isinstance(nx, int) and record.weight_shape == (nx, nf):
        quantized = f"quant_nn.quant_transposed_linear({namespace}.{cls.__name__})"
    else:  # the weight layout is unknown: name what the entry needs
        quantized = f"<a quantized {cls.__name__} with from_float(layer): see quant_nn.QuantMixin>"
    return f"({namespace}, {cls.__name__!r}, {quantized})"


def _left_float_message(left: list[UnquantizedLayer], model: nn.Module) -> str:
    by_class = Counter(r.class_name for r in left)
    n = len(left)
    lines = [
        f"quantize_model left {n} linear-like layer{'s' if n > 1 else ''} float, as "
        + ("their classes are not mapped to quantized ones:" if n > 1 else
           "its class is not mapped to a quantized one:")
    ]  # fmt: skip
    entries = []
    for class_name, count in by_class.items():
        names = [r.name for r in left if r.class_name == class_name]
        shown = ", ".join(names[:3]) + (", ..." if count > 3 else "")
        lines.append(f"  {class_name} x {count}: {shown}")
        first = next(r for r in left if r.class_name == class_name)
        entries.append(_mapping_entry(first, model.get_submodule(first.name)))
    lines.append(
        f"To quantize them pass custom_quant_modules=[{', '.join(entries)}] "
        f"(from qviz.engine import quant_nn); quant_modules.unquantized_linear_layers(model) lists "
        f"them."
    )
    return "\n".join(lines)
