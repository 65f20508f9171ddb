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

from collections.abc import Callable, Iterable
from typing import Any

import torch
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


def _check_element(element: Any, where: str) -> None:
    if isinstance(element, type):
        if not issubclass(element, nn.Module):
            raise ConfigError(
                f"{where}: {element.__qualname__} is a class but not a torch.nn.Module; a pattern "
                f"names module classes (nn.Conv2d), functions (F.linear, torch.add) or Tensor "
                f"method names ('view')"
            )
        return
    if isinstance(element, str):
        names = (element, element.rstrip("_"))  # in-place variants: "relu_", "hardsigmoid_"
        if not any(hasattr(owner, n) for owner in (torch.Tensor, torch, F) for n in names):
            raise ConfigError(
                f"{where}: {element!r} is not a torch.Tensor method or torch function; a module "
                f"type goes in as its class (e.g. torch.nn.Conv2d, not 'Conv2d')"
            )
        return
    if not callable(element):
        raise ConfigError(
            f"{where}: {element!r} is not a module class, function or Tensor method name"
        )


def _check_pattern(pattern: Any) -> Pattern:
    where = f"set_pattern({pattern_name(pattern) if pattern is not None else pattern})"
    if isinstance(pattern, list):
        pattern = tuple(pattern)
    if isinstance(pattern, tuple):
        if len(pattern) < 2:
            raise ConfigError(f"{where}: a fused pattern needs two or more elements")
        for element in pattern:
            _check_element(element, where)
        return pattern
    _check_element(pattern, where)
    return pattern


def _from_complex(pattern: Any) -> Pattern | None:
    """torch.ao's reversed nested format ``(relu, (bn, conv))`` as a forward tuple, when it is
    a plain chain; None for shapes qviz does not match (trees with MatchAllNode, ...)."""
    chain: list[Any] = []
    while isinstance(pattern, tuple) and len(pattern) == 2:
        chain.append(pattern[0])
        pattern = pattern[1]
    if isinstance(pattern, tuple) or "MatchAllNode" in getattr(pattern, "__name__", ""):
        return None
    chain.append(pattern)
    return tuple(reversed(chain)) if len(chain) > 1 else chain[0]


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
        """Replace the dtype combinations."""
        self.dtype_configs = [DTypeConfig.of(c) for c in dtype_configs]
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
        self.name = name
        self._configs: dict[Any, BackendPatternConfig] = {}
        #: torch.ao patterns :meth:`of` could not read, by printed pattern (reported, not lost).
        self.unread: tuple[str, ...] = ()

    def set_name(self, name: str) -> BackendConfig:
        self.name = name
        return self

    def set_backend_pattern_config(self, config: BackendPatternConfig) -> BackendConfig:
        """Add ``config``; a config for the same pattern replaces the earlier one."""
        if not isinstance(config, BackendPatternConfig):
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
        for config in configs:
            self.set_backend_pattern_config(config)
        return self

    @property
    def configs(self) -> list[BackendPatternConfig]:
        """The pattern configs, in the order they were set."""
        return list(self._configs.values())

    @classmethod
    def of(cls, backend_config: Any) -> BackendConfig:
        """qviz's BackendConfig for ``backend_config``: itself, or torch.ao's (e.g.
        ``torch.ao.quantization.backend_config.get_native_backend_config()``); patterns in a
        shape qviz does not match are listed in ``unread``."""
        if isinstance(backend_config, cls):
            return backend_config
        if not hasattr(backend_config, "configs"):
            raise ConfigError(f"{backend_config!r} is not a BackendConfig")
        out, unread = cls(getattr(backend_config, "name", "")), []
        for config in backend_config.configs:
            ours = BackendPatternConfig.of(config)
            if ours is None:
                unread.append(str(getattr(config, "_pattern_complex_format", config)))
            else:
                out.set_backend_pattern_config(ours)
        out.unread = tuple(unread)
        return out

    def __repr__(self) -> str:
        return f"BackendConfig({self.name!r}, {len(self._configs)} patterns)"
