"""What the user asks for: a QConfig (activation and weight observers) per part of the model.

:class:`QConfig` pairs two observer constructors; :class:`QConfigMapping` says which QConfig
applies where, with PyTorch's setters and precedence (highest first): module name and object
type and call order, module name, module name regex, object type, global. A QConfig of None
keeps that part in float. torch.ao's QConfig and QConfigMapping are read as they are
(:meth:`QConfigMapping.of`), and :func:`get_default_qconfig_mapping` gives torch.ao's defaults
for a backend.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from qviz.engine.observers import MinMaxObserver, PerChannelMinMaxObserver
    >>> qconfig = QConfig(
    ...     activation=MinMaxObserver.with_args(dtype=torch.quint8),
    ...     weight=PerChannelMinMaxObserver.with_args(dtype=torch.qint8,
    ...                                               qscheme=torch.per_channel_symmetric))
    >>> mapping = QConfigMapping().set_global(qconfig).set_object_type(nn.Sigmoid, None)
    >>> mapping.qconfig_for("head.act", nn.Sigmoid) is None
    True
    >>> mapping.qconfig_for("body.0", nn.Linear) is qconfig
    True
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from torch import nn

from qviz.engine.backend_config.config import brief_repr, check_element
from qviz.errors import ConfigError


class QConfig(NamedTuple):
    """Observer constructors for a pattern's activations and its weight (None: not observed).

    Example:
        >>> QConfig(activation=None, weight=None).weight is None
        True
    """

    activation: Callable[..., Any] | None
    weight: Callable[..., Any] | None


def _check_constructor(ctr: Any, role: str, where: str) -> None:
    if ctr is None or (callable(ctr) and not isinstance(ctr, nn.Module)):
        return
    fix = (
        f"pass its class or {type(ctr).__name__}.with_args(...) (an instance would be shared by "
        f"every place the QConfig applies)"
        if isinstance(ctr, nn.Module)
        else "pass an observer class or Observer.with_args(...), or None"
    )
    raise ConfigError(
        f"{where}: the QConfig's {role} is {ctr!r}, not an observer constructor; {fix}"
    )


def _as_qconfig(qconfig: Any, where: str) -> QConfig | None:
    if qconfig is None:
        return None
    if isinstance(qconfig, QConfig):
        out = qconfig
    elif hasattr(qconfig, "activation") and hasattr(qconfig, "weight"):
        out = QConfig(qconfig.activation, qconfig.weight)
    else:
        raise ConfigError(
            f"{where}: {qconfig!r} is not a QConfig; give QConfig(activation=..., weight=...) "
            f"(observer constructors), or None to keep it in float"
        )
    _check_constructor(out.activation, "activation", where)
    _check_constructor(out.weight, "weight", where)
    return out


def _check_module_name(name: Any, where: str) -> str:
    if not isinstance(name, str):
        raise ConfigError(
            f"{where}({name!r}, ...): a module name is a string, as model.named_modules() "
            f"spells it (e.g. 'layer1.0.conv1'; '' for the top-level module)"
        )
    return name


class QConfigMapping:
    """Which QConfig applies to which module, operator type, or call.

    Example:
        >>> QConfigMapping().set_module_name_regex(r"layer\\d\\.0", None).qconfig_for(
        ...     "layer1.0", object) is None
        True
    """

    def __init__(self) -> None:
        self.global_qconfig: QConfig | None = None
        self.object_type_qconfigs: OrderedDict[Any, QConfig | None] = OrderedDict()
        self.module_name_regex_qconfigs: OrderedDict[str, QConfig | None] = OrderedDict()
        self.module_name_qconfigs: OrderedDict[str, QConfig | None] = OrderedDict()
        self.module_name_object_type_order_qconfigs: OrderedDict[
            tuple[str, Any, int], QConfig | None
        ] = OrderedDict()

    def set_global(self, global_qconfig: QConfig | None) -> QConfigMapping:
        """The QConfig for everything nothing more specific names."""
        self.global_qconfig = _as_qconfig(global_qconfig, "set_global")
        return self

    def set_object_type(self, object_type: Any, qconfig: QConfig | None) -> QConfigMapping:
        """The QConfig for a module class (nn.Linear), function (F.linear) or method name.

        Raises:
            ConfigError: ``object_type`` is none of these (a class name as a string, a module
                instance, a number): it would match nothing.
        """
        check_element(object_type, f"set_object_type({_short(object_type)}, ...)")
        self.object_type_qconfigs[object_type] = _as_qconfig(qconfig, "set_object_type")
        return self

    def set_module_name_regex(self, regex: str, qconfig: QConfig | None) -> QConfigMapping:
        """The QConfig for modules whose full name matches ``regex`` (``re.match``); a regex
        that matches no module of the model is a ConfigError at prepare."""
        if not isinstance(regex, str):
            raise ConfigError(
                f"set_module_name_regex({regex!r}, ...): give the regex as a string, e.g. "
                f"r'layer\\d\\.0'"
            )
        try:
            re.compile(regex)
        except re.error as error:
            raise ConfigError(f"set_module_name_regex({regex!r}): not a regex ({error})") from None
        self.module_name_regex_qconfigs[regex] = _as_qconfig(qconfig, "set_module_name_regex")
        return self

    def set_module_name(self, module_name: str, qconfig: QConfig | None) -> QConfigMapping:
        """The QConfig for the module ``module_name`` (as ``model.named_modules()`` spells it)."""
        _check_module_name(module_name, "set_module_name")
        self.module_name_qconfigs[module_name] = _as_qconfig(qconfig, "set_module_name")
        return self

    def set_module_name_object_type_order(
        self, module_name: str, object_type: Any, index: int, qconfig: QConfig | None
    ) -> QConfigMapping:
        """The QConfig for the ``index``-th call of ``object_type`` inside ``module_name``; an
        index past the calls the module makes is a ConfigError at prepare."""
        where = "set_module_name_object_type_order"
        _check_module_name(module_name, where)
        check_element(object_type, f"{where}({module_name!r}, {_short(object_type)}, ...)")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ConfigError(
                f"{where}({module_name!r}, {_short(object_type)}, {index!r}, ...): the index "
                f"counts the calls of that type inside the module from 0: give an int >= 0"
            )
        key = (module_name, object_type, index)
        self.module_name_object_type_order_qconfigs[key] = _as_qconfig(
            qconfig, "set_module_name_object_type_order"
        )
        return self

    def qconfig_for(
        self,
        module_name: str,
        object_type: Any,
        index: int | None = None,
        caller: str | None = None,
    ) -> Any:
        """The QConfig that applies to ``object_type`` called inside ``module_name``.

        ``module_name`` settings apply to the module and to everything inside it (the nearest
        enclosing name wins), as in the reference. ``index`` is the call's position among the
        calls of ``object_type`` made by the module ``caller`` (default ``module_name``; for a
        layer, its parent), for ``set_module_name_object_type_order``.
        """
        if index is not None:
            key = (module_name if caller is None else caller, object_type, index)
            if key in self.module_name_object_type_order_qconfigs:
                return self.module_name_object_type_order_qconfigs[key]
        parts = module_name.split(".") if module_name else []
        for end in range(len(parts), 0, -1):
            prefix = ".".join(parts[:end])
            if prefix in self.module_name_qconfigs:
                return self.module_name_qconfigs[prefix]
        for regex, qconfig in self.module_name_regex_qconfigs.items():
            if re.match(regex, module_name):
                return qconfig
        if object_type in self.object_type_qconfigs:
            return self.object_type_qconfigs[object_type]
        return self.global_qconfig

    def named_modules(self) -> list[str]:
        """Every module name this mapping mentions (checked against the model by the quantizer)."""
        names = list(self.module_name_qconfigs)
        names += [name for name, _, _ in self.module_name_object_type_order_qconfigs]
        return list(dict.fromkeys(names))

    @classmethod
    def of(cls, mapping: Any, where: str = "QConfigMapping.of") -> QConfigMapping:
        """qviz's mapping for ``mapping``: itself, or torch.ao's QConfigMapping.

        Raises:
            ConfigError: ``mapping`` is not a QConfigMapping; the message, which starts with
                ``where``, says what to pass instead (a QConfig wrapped with ``set_global``,
                a backend name through ``get_default_qconfig_mapping``).
        """
        if isinstance(mapping, cls):
            return mapping
        if not hasattr(mapping, "object_type_qconfigs"):
            raise ConfigError(_not_a_mapping(mapping, where))
        out = cls().set_global(mapping.global_qconfig)
        for object_type, qconfig in mapping.object_type_qconfigs.items():
            out.set_object_type(object_type, qconfig)
        for regex, qconfig in mapping.module_name_regex_qconfigs.items():
            out.set_module_name_regex(regex, qconfig)
        for name, qconfig in mapping.module_name_qconfigs.items():
            out.set_module_name(name, qconfig)
        for key, qconfig in mapping.module_name_object_type_order_qconfigs.items():
            out.set_module_name_object_type_order(*key, qconfig)
        return out


def _short(value: Any) -> str:
    """A pattern element / object type as a message names it."""
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, nn.Module):
        return f"{type(value).__name__}(...)"
    return repr(value) if isinstance(value, str | int | float) else str(value)


def _not_a_mapping(value: Any, where: str) -> str:
    """What was passed instead of a QConfigMapping, and what to pass."""
    head = f"{where}: {brief_repr(value)} is not a QConfigMapping"
    if value is None:
        return (
            f"{head}; give one: QConfigMapping().set_global(qconfig), or torch.ao's defaults "
            f"for a backend, get_default_qconfig_mapping('x86') (qviz.engine.backend_config "
            f"has it)"
        )
    if hasattr(value, "activation") and hasattr(value, "weight"):
        return (
            f"{head} but a single QConfig; wrap it: QConfigMapping().set_global(qconfig) "
            f"(everything the backend runs), or set_object_type / set_module_name for parts"
        )
    if isinstance(value, str):
        return (
            f"{head}; for a backend's default QConfigs give get_default_qconfig_mapping("
            f"{value!r}) (backends: 'x86', 'fbgemm', 'qnnpack', 'onednn')"
        )
    if hasattr(value, "configs") and hasattr(value, "name"):
        return (
            f"{head} but a BackendConfig; BackendConfigQuantizer takes (backend_config, "
            f"qconfig_mapping), the backend first"
        )
    if isinstance(value, dict):
        return (
            f"{head} but a dict; build the mapping with QConfigMapping().set_global(...) and "
            f"its setters, or torch.ao's QConfigMapping.from_dict(...), which is read as it is"
        )
    return (
        f"{head}; give QConfigMapping().set_global(qconfig) or get_default_qconfig_mapping('x86')"
    )


def get_default_qconfig_mapping(backend: str = "x86", version: int = 0) -> QConfigMapping:
    """torch.ao's default QConfigMapping for ``backend`` ("x86", "fbgemm", "qnnpack", "onednn").

    Example:
        >>> mapping = get_default_qconfig_mapping("x86")
        >>> mapping.global_qconfig.activation.p.func.__name__
        'HistogramObserver'
    """
    import warnings

    from torch.ao.quantization import qconfig_mapping

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            reference = qconfig_mapping.get_default_qconfig_mapping(backend, version)
        except (AssertionError, ValueError, AttributeError) as error:
            raise ConfigError(
                f"get_default_qconfig_mapping({backend!r}): {error}; backends: 'x86', 'fbgemm', "
                f"'qnnpack', 'onednn'"
            ) from None
    return QConfigMapping.of(reference)
