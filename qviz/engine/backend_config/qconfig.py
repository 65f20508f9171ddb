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

from qviz.errors import ConfigError


class QConfig(NamedTuple):
    """Observer constructors for a pattern's activations and its weight (None: not observed).

    Example:
        >>> QConfig(activation=None, weight=None).weight is None
        True
    """

    activation: Callable[..., Any] | None
    weight: Callable[..., Any] | None


def _as_qconfig(qconfig: Any, where: str) -> QConfig | None:
    if qconfig is None or isinstance(qconfig, QConfig):
        return qconfig
    if hasattr(qconfig, "activation") and hasattr(qconfig, "weight"):
        return QConfig(qconfig.activation, qconfig.weight)
    raise ConfigError(f"{where}: {qconfig!r} is not a QConfig (or None to keep it in float)")


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
        """The QConfig for a module class (nn.Linear), function (F.linear) or method name."""
        self.object_type_qconfigs[object_type] = _as_qconfig(qconfig, "set_object_type")
        return self

    def set_module_name_regex(self, regex: str, qconfig: QConfig | None) -> QConfigMapping:
        """The QConfig for modules whose full name matches ``regex`` (``re.match``)."""
        try:
            re.compile(regex)
        except re.error as error:
            raise ConfigError(f"set_module_name_regex({regex!r}): not a regex ({error})") from None
        self.module_name_regex_qconfigs[regex] = _as_qconfig(qconfig, "set_module_name_regex")
        return self

    def set_module_name(self, module_name: str, qconfig: QConfig | None) -> QConfigMapping:
        """The QConfig for the module ``module_name`` (as ``model.named_modules()`` spells it)."""
        self.module_name_qconfigs[module_name] = _as_qconfig(qconfig, "set_module_name")
        return self

    def set_module_name_object_type_order(
        self, module_name: str, object_type: Any, index: int, qconfig: QConfig | None
    ) -> QConfigMapping:
        """The QConfig for the ``index``-th call of ``object_type`` inside ``module_name``."""
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
    def of(cls, mapping: Any) -> QConfigMapping:
        """qviz's mapping for ``mapping``: itself, or torch.ao's QConfigMapping."""
        if isinstance(mapping, cls):
            return mapping
        if not hasattr(mapping, "object_type_qconfigs"):
            raise ConfigError(f"{mapping!r} is not a QConfigMapping")
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
