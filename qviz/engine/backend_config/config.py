"""A backend declared as data: which patterns it runs quantized, with which dtypes.

:class:`BackendPatternConfig` describes one pattern (a module class such as ``nn.Linear``, a
function such as ``F.linear`` or ``torch.add``, or a fused tuple such as
``(nn.Conv2d, nn.ReLU)`` in forward order) with its observation type, its DTypeConfigs and, for
eager-mode fusion, its root / fused / QAT / reference modules and fuser method.
:class:`BackendConfig` collects them under a name. The API is PyTorch's, setter for setter, so
the BackendConfig tutorial ports by changing imports; torch.ao's own BackendConfig objects
(and the shipped ones: native, fbgemm, qnnpack, x86, onednn, executorch) are read as they are
with :meth:`BackendConfig.of`.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from qviz.engine.backend_config.dtypes import DTypeConfig, ObservationType
    >>> linear = (BackendPatternConfig(nn.Linear)
    ...     .set_observation_type(ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
    ...     .add_dtype_config(DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float)))
    >>> backend = BackendConfig("my_backend").set_backend_pattern_config(linear)
    >>> [pattern_name(c.pattern) for c in backend.configs]
    ['Linear']
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

# torch.ao's shipped configs (get_native_backend_config, get_fbgemm_backend_config, ...) call
# this module by attribute without importing it: loaded here, they work once qviz's
# backend_config is imported, in whatever order the user imports torch.ao's functions.
import torch.ao.quantization.backend_config.utils
from torch import nn
from torch.nn import functional as F

from qviz.engine.backend_config.dtypes import DTypeConfig, ObservationType
from qviz.errors import ConfigError

#: One element of a pattern: a module class, a function / ATen operator, or a Tensor method name.
PatternElement = type | Callable[..., Any] | str
#: A pattern: one element, or a tuple of elements in forward order (``(nn.Conv2d, nn.ReLU)``).
Pattern = PatternElement | tuple[PatternElement, ...]


def _element_name(element: PatternElement) -> str:
    if isinstance(element, str):
        return f'"{element}"'
    if isinstance(element, tuple):  # a nested (reversed-format) pattern, named as written
        return pattern_name(element)
    if isinstance(element, nn.Module):
        return f"{type(element).__name__}()"
    return getattr(element, "__name__", None) or str(element)


def pattern_name(pattern: Pattern) -> str:
    """``Linear``, ``(Conv2d, ReLU)``, ``add``: a pattern as a backend author writes it.

    Example:
        >>> pattern_name((nn.Conv2d, nn.BatchNorm2d, nn.ReLU))
        '(Conv2d, BatchNorm2d, ReLU)'
    """
    if isinstance(pattern, tuple):
        return "(" + ", ".join(_element_name(e) for e in pattern) + ")"
    return _element_name(pattern)


def _class_path(cls: type) -> str:
    """``torch.nn.Conv2d`` for torch.nn's classes, the full path otherwise."""
    if getattr(nn, cls.__name__, None) is cls:
        return f"torch.nn.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


#: What a pattern element or a QConfigMapping object type is, for the messages.
_ELEMENT_KINDS = (
    "a module class (torch.nn.Conv2d), a function (torch.nn.functional.linear, torch.add) or a "
    "Tensor method name ('relu')"
)


def check_element(element: Any, where: str) -> None:
    """Raise a ConfigError, naming ``where`` and the fix, unless ``element`` is a pattern
    element / object type: a ``torch.nn.Module`` class, a function, or a Tensor method name."""
    if isinstance(element, nn.Module):
        cls = type(element)
        raise ConfigError(
            f"{where}: {cls.__name__}(...) is a module instance; give its class, "
            f"{_class_path(cls)} (the setting applies to every module of that class)"
        )
    if isinstance(element, type):
        if not issubclass(element, nn.Module):
            raise ConfigError(
                f"{where}: {element.__qualname__} is a class but not a torch.nn.Module; give "
                f"{_ELEMENT_KINDS}"
            )
        return
    if isinstance(element, str):
        names = (element, element.rstrip("_"))  # in-place variants: "relu_", "hardsigmoid_"
        if not any(hasattr(owner, n) for owner in (torch.Tensor, torch, F) for n in names):
            module = getattr(nn, element, None)
            fix = (
                f"the module type goes in as its class: torch.nn.{element}, not {element!r}"
                if isinstance(module, type) and issubclass(module, nn.Module)
                else f"a module type goes in as its class (e.g. torch.nn.Conv2d, not 'Conv2d'); "
                f"give {_ELEMENT_KINDS}"
            )
            raise ConfigError(
                f"{where}: {element!r} is not a torch.Tensor method or torch function; {fix}"
            )
        return
    if not callable(element):
        raise ConfigError(f"{where}: {element!r} is not {_ELEMENT_KINDS}")


def _check_pattern(pattern: Any) -> Pattern:
    where = f"set_pattern({pattern_name(pattern) if pattern is not None else pattern})"
    if isinstance(pattern, list):
        pattern = tuple(pattern)
    if isinstance(pattern, tuple):
        if any(isinstance(e, tuple | list) for e in pattern):
            forward = _from_complex(pattern)
            hint = (
                f"write it forward: {pattern_name(forward)}"
                if isinstance(forward, tuple)
                else "write the chain forward, as a flat tuple (e.g. (nn.Conv2d, nn.ReLU))"
            )
            raise ConfigError(
                f"{where}: a nested tuple is torch.ao's reversed nested pattern format (the last "
                f"op first); a pattern here, as in torch.ao's set_pattern (which would accept "
                f"this one and never match it), lists the ops in forward order: {hint}"
            )
        if len(pattern) < 2:
            raise ConfigError(
                f"{where}: a fused pattern needs two or more elements; for one op give the "
                f"element itself (BackendPatternConfig(nn.Conv2d)), not a 1-tuple"
            )
        for element in pattern:
            check_element(element, where)
        return pattern
    check_element(pattern, where)
    return pattern


def _from_complex(pattern: Any) -> Pattern | None:
    """torch.ao's reversed nested format ``(relu, (bn, conv))`` as a forward tuple, when it is
    a plain chain; None for shapes qviz does not match (trees with MatchAllNode, ...)."""
    chain: list[Any] = []
    while isinstance(pattern, tuple | list) and len(pattern) == 2:
        chain.append(pattern[0])
        pattern = pattern[1]
    if isinstance(pattern, tuple | list) or "MatchAllNode" in getattr(pattern, "__name__", ""):
        return None
    if any(isinstance(e, tuple | list) for e in chain):
        return None
    chain.append(pattern)
    return tuple(reversed(chain)) if len(chain) > 1 else chain[0]


def _stand_in(element: Any) -> Any:
    """What FX's fusion hands a fuser method for ``element``: a module of that class (built
    with the fewest arguments its constructor takes, in eval mode), ``nn.ReLU()`` for
    ``F.relu``, the function itself otherwise."""
    if element is F.relu:
        return nn.ReLU().eval()
    if not isinstance(element, type):
        return element
    for args in ((), (1,), (1, 1), (1, 1, 1)):
        try:
            return element(*args).eval()
        except Exception:  # the next argument count may build it
            continue
    raise TypeError(f"cannot build a {element.__name__} to fuse")


def fused_form(config: BackendPatternConfig) -> tuple[type[nn.Module] | None, tuple[type, ...]]:
    """The module class FX's fusion turns a match of ``config`` into for post-training
    quantization (None where FX fuses nothing: no fuser method), and the classes of the modules
    inside it when it is one of torch.ao's fused modules (FX requires one QConfig for them).

    The class is what ``fuser_method(False, ...)`` builds (a conv-bn pair folds into a plain
    conv, a conv-bn-relu into a ConvReLU2d), asked of stand-in modules; the declared fused
    module where the fuser cannot be asked.

    Example:
        >>> import torch.ao.nn.intrinsic as nni
        >>> c = BackendPatternConfig((nn.Conv2d, nn.ReLU)).set_fuser_method(
        ...     lambda is_qat, conv, relu: nni.ConvReLU2d(conv, relu))
        >>> fused, members = fused_form(c)
        >>> fused.__name__, [m.__name__ for m in members]
        ('ConvReLU2d', ['Conv2d', 'ReLU'])
    """
    if config.fuser_method is None or config.pattern is None:
        return None, ()
    elements = config.pattern if isinstance(config.pattern, tuple) else (config.pattern,)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fused = config.fuser_method(False, *(_stand_in(e) for e in elements))
    except Exception:  # the user's fuser method: fall back to what the config declares
        return config.fused_module, ()
    if not isinstance(fused, nn.Module):
        return config.fused_module, ()
    from torch.ao.nn.intrinsic import _FusedModule

    members = tuple(type(m) for m in fused.children()) if isinstance(fused, _FusedModule) else ()
    return type(fused), members


class BackendPatternConfig:
    """How a backend runs one pattern: observation type, dtypes, and its eager-mode modules.

    Args:
        pattern: optional, as :meth:`set_pattern`.

    Example:
        >>> c = BackendPatternConfig((nn.Conv2d, nn.ReLU)).set_fused_module(
        ...     torch.ao.nn.intrinsic.ConvReLU2d)
        >>> pattern_name(c.pattern), c.fused_module.__name__
        ('(Conv2d, ReLU)', 'ConvReLU2d')
    """

    def __init__(self, pattern: Pattern | None = None) -> None:
        self.pattern: Pattern | None = None
        self.observation_type = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
        self.dtype_configs: list[DTypeConfig] = []
        self.root_module: type[nn.Module] | None = None
        self.qat_module: type[nn.Module] | None = None
        self.reference_quantized_module: type[nn.Module] | None = None
        self.fused_module: type[nn.Module] | None = None
        self.fuser_method: Callable[..., Any] | None = None
        if pattern is not None:
            self.set_pattern(pattern)

    def set_pattern(self, pattern: Pattern) -> BackendPatternConfig:
        """The module class, function, Tensor method name, or forward-order tuple of them."""
        self.pattern = _check_pattern(pattern)
        return self

    def set_observation_type(self, observation_type: ObservationType) -> BackendPatternConfig:
        """How the pattern's output is observed (see :class:`ObservationType`)."""
        self.observation_type = ObservationType.of(observation_type)
        return self

    def add_dtype_config(self, dtype_config: DTypeConfig) -> BackendPatternConfig:
        """One more dtype combination the backend runs this pattern with."""
        self.dtype_configs.append(DTypeConfig.of(dtype_config))
        return self

    def set_dtype_configs(self, dtype_configs: Iterable[DTypeConfig]) -> BackendPatternConfig:
        """Replace the dtype combinations (a list; one config: ``set_dtype_configs([c])``)."""
        items = _a_list(dtype_configs, "set_dtype_configs", "DTypeConfig", "add_dtype_config")
        self.dtype_configs = [DTypeConfig.of(c) for c in items]
        return self

    def _set_module(self, attr: str, module: Any) -> BackendPatternConfig:
        if not (isinstance(module, type) and issubclass(module, nn.Module)):
            raise ConfigError(f"set_{attr}({module!r}): pass a torch.nn.Module class")
        setattr(self, attr, module)
        return self

    def set_root_module(self, root_module: type[nn.Module]) -> BackendPatternConfig:
        """The module the pattern's quantized version is built around (e.g. nn.Conv2d)."""
        return self._set_module("root_module", root_module)

    def set_qat_module(self, qat_module: type[nn.Module]) -> BackendPatternConfig:
        """The module that replaces the pattern for quantization-aware training."""
        return self._set_module("qat_module", qat_module)

    def set_reference_quantized_module(self, module: type[nn.Module]) -> BackendPatternConfig:
        """The reference quantized module of the root module (e.g. ``nnqr.Conv2d``)."""
        return self._set_module("reference_quantized_module", module)

    def set_fused_module(self, fused_module: type[nn.Module]) -> BackendPatternConfig:
        """The module a fused pattern becomes (e.g. ``nni.ConvReLU2d``)."""
        return self._set_module("fused_module", fused_module)

    def set_fuser_method(self, fuser_method: Callable[..., Any]) -> BackendPatternConfig:
        """``fuser_method(is_qat, *modules)`` builds the fused module from the pattern's modules."""
        if not callable(fuser_method):
            raise ConfigError(f"set_fuser_method({fuser_method!r}): pass a function")
        self.fuser_method = fuser_method
        return self

    @classmethod
    def of(cls, config: Any) -> BackendPatternConfig | None:
        """qviz's config for ``config`` (itself, or torch.ao's); None for a torch.ao pattern in
        a shape qviz does not match (the caller reports it)."""
        if isinstance(config, cls):
            return config
        pattern = getattr(config, "pattern", None)
        if pattern is None:
            pattern = _from_complex(getattr(config, "_pattern_complex_format", None))
        if pattern is None:
            return None
        out = cls(pattern).set_observation_type(config.observation_type)
        out.set_dtype_configs(config.dtype_configs)
        for attr in ("root_module", "qat_module", "reference_quantized_module", "fused_module"):
            setattr(out, attr, getattr(config, attr, None))
        out.fuser_method = getattr(config, "fuser_method", None)
        return out

    def __repr__(self) -> str:
        pattern = pattern_name(self.pattern) if self.pattern is not None else None
        return (
            f"BackendPatternConfig({pattern}, {self.observation_type.name}, "
            f"{len(self.dtype_configs)} dtype configs)"
        )


class BackendConfig:
    """A named set of pattern configs: what one backend runs quantized.

    Example:
        >>> from qviz.engine.backend_config.dtypes import DTypeConfig
        >>> config = BackendPatternConfig(torch.add).add_dtype_config(
        ...     DTypeConfig(torch.quint8, torch.quint8))
        >>> BackendConfig("b").set_backend_pattern_config(config).name
        'b'
    """

    def __init__(self, name: str = "") -> None:
        self.name = _check_name(name)
        self._configs: dict[Any, BackendPatternConfig] = {}
        #: torch.ao patterns :meth:`of` could not read, by printed pattern (reported, not lost).
        self.unread: tuple[str, ...] = ()

    def set_name(self, name: str) -> BackendConfig:
        self.name = _check_name(name)
        return self

    def set_backend_pattern_config(self, config: BackendPatternConfig) -> BackendConfig:
        """Add ``config``; a config for the same pattern replaces the earlier one."""
        if not isinstance(config, BackendPatternConfig):
            if hasattr(config, "dtype_configs") and hasattr(config, "observation_type"):
                raise ConfigError(
                    f"set_backend_pattern_config({config!r}): this is torch.ao's "
                    f"BackendPatternConfig; build the whole backend with torch.ao's classes and "
                    f"read it with qviz's BackendConfig.of(...), or use qviz's classes throughout"
                )
            raise ConfigError(
                f"set_backend_pattern_config({config!r}): pass a BackendPatternConfig (or read "
                f"torch.ao's whole BackendConfig with qviz's BackendConfig.of)"
            )
        if config.pattern is None:
            raise ConfigError(
                "set_backend_pattern_config: the BackendPatternConfig has no pattern; call "
                "set_pattern(...) first"
            )
        self._configs[config.pattern] = config
        return self

    def set_backend_pattern_configs(self, configs: Iterable[BackendPatternConfig]) -> BackendConfig:
        """Add each of ``configs`` (a list), as :meth:`set_backend_pattern_config` does."""
        items = _a_list(
            configs,
            "set_backend_pattern_configs",
            "BackendPatternConfig",
            "set_backend_pattern_config",
        )
        for config in items:
            self.set_backend_pattern_config(config)
        return self

    @property
    def configs(self) -> list[BackendPatternConfig]:
        """The pattern configs, in the order they were set."""
        return list(self._configs.values())

    def config_for(self, pattern: Any) -> BackendPatternConfig | None:
        """The config set for exactly ``pattern``, or None."""
        return self._configs.get(pattern)

    @classmethod
    def of(cls, backend_config: Any, where: str = "BackendConfig.of") -> BackendConfig:
        """qviz's BackendConfig for ``backend_config``: itself, or torch.ao's (e.g.
        ``torch.ao.quantization.backend_config.get_native_backend_config()``); patterns in a
        shape qviz does not match are listed in ``unread``.

        Raises:
            ConfigError: ``backend_config`` is not a BackendConfig; the message, which starts
                with ``where``, says what to pass instead.
        """
        if isinstance(backend_config, cls):
            return backend_config
        if not hasattr(backend_config, "configs") or not hasattr(backend_config, "name"):
            raise ConfigError(_not_a_backend_config(backend_config, where))
        out, unread = cls(getattr(backend_config, "name", "")), []
        for config in backend_config.configs:
            try:
                ours = BackendPatternConfig.of(config)
            except ConfigError as error:  # torch.ao's classes take anything: say which config
                pattern = getattr(config, "pattern", None) or getattr(
                    config, "_pattern_complex_format", None
                )
                raise ConfigError(
                    f"{where}: torch.ao's BackendPatternConfig for {pattern_name(pattern)}: {error}"
                ) from None
            if ours is None:
                unread.append(str(getattr(config, "_pattern_complex_format", config)))
            else:
                out.set_backend_pattern_config(ours)
        out.unread = tuple(unread)
        return out

    def __repr__(self) -> str:
        return f"BackendConfig({self.name!r}, {len(self._configs)} patterns)"


def brief_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)``, or its class and ``(...)`` where that would be longer than ``limit``."""
    text = repr(value)
    return text if len(text) <= limit else f"{type(value).__name__}(...)"


def _check_name(name: Any) -> str:
    if not isinstance(name, str):
        raise ConfigError(f"BackendConfig(name={name!r}): the name is a string, e.g. 'my_backend'")
    return name


_SHIPPED = (
    "torch.ao.quantization.backend_config: get_native_backend_config(), "
    "get_fbgemm_backend_config(), get_qnnpack_backend_config(), get_onednn_backend_config(), "
    "x86.get_x86_backend_config(), executorch.get_executorch_backend_config()"
)


def _not_a_backend_config(value: Any, where: str) -> str:
    """What was passed instead of a BackendConfig, and what to pass."""
    head = f"{where}: {brief_repr(value)} is not a BackendConfig"
    if isinstance(value, str):
        return (
            f"{head}; a backend goes in as its BackendConfig object, not its name: for "
            f"{value!r} one of torch.ao's shipped configs ({_SHIPPED}), or your own, built with "
            f"BackendConfig({value!r}).set_backend_pattern_config(...)"
        )
    if isinstance(value, BackendPatternConfig) or hasattr(value, "dtype_configs"):
        return (
            f"{head} but one pattern's config; put it in one: "
            f"BackendConfig('my_backend').set_backend_pattern_config(config)"
        )
    if hasattr(value, "global_qconfig") or hasattr(value, "object_type_qconfigs"):
        return (
            f"{head} but a QConfigMapping; BackendConfigQuantizer takes "
            f"(backend_config, qconfig_mapping), the backend first"
        )
    if hasattr(value, "activation") and hasattr(value, "weight"):
        return (
            f"{head} but a QConfig; BackendConfigQuantizer takes (backend_config, "
            f"qconfig_mapping): a BackendConfig first, then QConfigMapping().set_global(qconfig)"
        )
    return (
        f"{head}; pass qviz's BackendConfig('name').set_backend_pattern_config(...) or one of "
        f"torch.ao's ({_SHIPPED}), read by BackendConfig.of"
    )


def _a_list(value: Any, where: str, item: str, single: str) -> list[Any]:
    """``value`` as a list, or the ConfigError saying to pass one (a single ``item`` is the
    mistake this catches: torch.ao then fails deep inside with "not iterable").

    Example:
        >>> _a_list(("a",), "set_dtype_configs", "DTypeConfig", "add_dtype_config")
        ['a']
    """
    if isinstance(value, list | tuple):
        return list(value)
    raise ConfigError(
        f"{where}({value!r}): pass a list of {item}s, e.g. {where}([config]); to add one "
        f"{item} use {single}(config)"
    )
