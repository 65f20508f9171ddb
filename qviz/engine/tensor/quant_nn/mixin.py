"""The quantizer plumbing every ``quant_nn`` layer shares: descriptors, defaults, ``from_float``.

A quantized layer is its ``torch.nn`` parent plus :class:`TensorQuantizer` submodules:
``_input_quantizer`` for every layer, and ``_weight_quantizer`` for the weighted ones
(:class:`QuantMixin`). The names are NVIDIA pytorch-quantization's, so its recipes (find the
quantizers with ``name.endswith("_input_quantizer")``) work unchanged; ``input_quantizer`` and
``weight_quantizer`` are properties onto the same modules.

Each class has its own defaults (``default_quant_desc_input``, ``default_quant_desc_weight``)
that ``set_default_quant_desc_input`` / ``set_default_quant_desc_weight`` change for that class
alone; a layer built with ``quant_desc_input=None`` takes the default at construction time.

Example:
    >>> from torch import nn
    >>> from qviz.engine.tensor.quant_nn import QuantLinear
    >>> issubclass(QuantLinear, QuantMixin), issubclass(QuantLinear, nn.Linear)
    (True, True)
    >>> layer = QuantLinear.from_float(nn.Linear(4, 2))
    >>> layer.input_quantizer is layer._input_quantizer
    True
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import torch
from torch import nn

from qviz.engine.tensor.descriptor import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import ConfigError


def _check_desc(owner: str, arg: str, desc: object) -> QuantDescriptor:
    if not isinstance(desc, QuantDescriptor):
        raise ConfigError(
            f"{owner}: {arg} must be a QuantDescriptor (e.g. QUANT_DESC_8BIT_PER_TENSOR or "
            f"QuantDescriptor(num_bits=8, axis=0)), got {type(desc).__name__} {desc!r:.80}"
        )
    return desc


def _check_quantizer(owner: str, name: str, value: object) -> None:
    if not isinstance(value, TensorQuantizer):
        raise ConfigError(
            f"{owner}.{name} must be a TensorQuantizer, got {type(value).__name__}: build one "
            f"with TensorQuantizer(QuantDescriptor(...))"
        )


class QuantInputMixin:
    """Quantize the input of a ``torch.nn`` layer: ``_input_quantizer`` and its defaults.

    Put it before the ``torch.nn`` parent (``class QuantMaxPool2d(QuantInputMixin,
    nn.MaxPool2d)``) and set ``_float_module`` (the parent) and ``_init_args`` (the parent's
    constructor arguments that ``from_float`` reads back from a float layer's attributes). The
    constructor takes the parent's arguments plus keyword-only ``quant_desc_input``.

    Example:
        >>> from qviz.engine.tensor.quant_nn import QuantMaxPool2d
        >>> pool = QuantMaxPool2d(2, quant_desc_input=QuantDescriptor(num_bits=4))
        >>> pool.input_quantizer.num_bits, issubclass(QuantMaxPool2d, QuantInputMixin)
        (4, True)
    """

    default_quant_desc_input: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_PER_TENSOR
    _float_module: ClassVar[type[nn.Module]]
    _init_args: ClassVar[tuple[str, ...]] = ()
    # public property name -> the submodule it stands for (None: the property cannot be assigned)
    _quantizer_aliases: ClassVar[dict[str, str | None]] = {"input_quantizer": "_input_quantizer"}

    def __init__(
        self, *args: Any, quant_desc_input: QuantDescriptor | None = None, **kwargs: Any
    ) -> None:
        desc = self._desc_or_default("quant_desc_input", quant_desc_input)
        super().__init__(*args, **kwargs)
        self._init_input_quantizers(desc)

    def _init_input_quantizers(self, desc: QuantDescriptor) -> None:
        self._input_quantizer = TensorQuantizer(desc)

    @classmethod
    def _desc_or_default(cls, arg: str, desc: QuantDescriptor | None) -> QuantDescriptor:
        default = getattr(cls, arg.replace("quant_desc", "default_quant_desc"))
        return _check_desc(cls.__name__, arg, default if desc is None else desc)

    @property
    def input_quantizer(self) -> TensorQuantizer:
        """The quantizer of the layer's input (the ``_input_quantizer`` submodule)."""
        return self._input_quantizer

    def __setattr__(self, name: str, value: Any) -> None:
        # nn.Module.__setattr__ would register an assigned module under the property's name,
        # where nothing reads it: assigning a property sets the submodule it stands for
        aliases = type(self)._quantizer_aliases
        if name in aliases:
            target = aliases[name]
            if target is None:
                raise ConfigError(
                    f"{type(self).__name__}.{name} cannot be assigned: assign into the "
                    f"ModuleList instead, e.g. layer._input_quantizers[0] = TensorQuantizer(...)"
                )
            _check_quantizer(type(self).__name__, name, value)
            name = target
        super().__setattr__(name, value)

    # -- defaults -------------------------------------------------------------------------------
    @classmethod
    def set_default_quant_desc_input(cls, value: QuantDescriptor) -> None:
        """Make ``value`` this class's input descriptor for layers built afterwards.

        Only this class (and its subclasses) changes: ``QuantConv2d``'s default leaves
        ``QuantConv1d`` alone. Layers already built keep their quantizers.

        Raises:
            ConfigError: ``value`` is not a QuantDescriptor.
        """
        cls.default_quant_desc_input = _check_desc(
            f"{cls.__name__}.set_default_quant_desc_input", "value", value
        )

    # -- from a float layer ---------------------------------------------------------------------
    @classmethod
    def _init_kwargs(cls, module: nn.Module) -> dict[str, Any]:
        """The parent's constructor arguments, read back from a float layer's attributes."""
        return {name: getattr(module, name) for name in cls._init_args}

    @classmethod
    def _check_float(cls, module: object) -> None:
        if isinstance(module, QuantInputMixin):
            raise ConfigError(
                f"{cls.__name__}.from_float got {type(module).__name__}, which is already "
                f"quantized: pass the float {cls._float_module.__name__}"
            )
        if type(module) is not cls._float_module:
            raise ConfigError(
                f"{cls.__name__}.from_float needs a torch.nn.{cls._float_module.__name__}, got "
                f"{type(module).__name__}; a subclass would lose its own forward, so it is "
                f"not converted (quantize its layers, or write its quantized version)"
            )

    @classmethod
    def from_float(
        cls,
        module: nn.Module,
        *,
        quant_desc_input: QuantDescriptor | None = None,
        quant_desc_weight: QuantDescriptor | None = None,
    ) -> Self:
        """A new quantized layer with the float layer's constructor settings and a copy of its
        parameters and buffers; the float layer is not changed and shares no storage with it.

        Args:
            module: a layer of exactly the float class (``torch.nn.Conv2d`` for ``QuantConv2d``).
            quant_desc_input: the input descriptor; None for the class default.
            quant_desc_weight: the weight descriptor of weighted layers; None for the class
                default (layers without a weight accept only None).

        Raises:
            ConfigError: ``module`` is not of the float class, a descriptor is not a
                QuantDescriptor, or the float layer holds state the quantized one cannot load.
        """
        cls._check_float(module)
        descs = {"quant_desc_input": quant_desc_input}
        if issubclass(cls, QuantMixin):
            descs["quant_desc_weight"] = quant_desc_weight
        elif quant_desc_weight is not None:
            raise ConfigError(
                f"{cls.__name__} has no weight, so quant_desc_weight must be None: pass it only "
                f"to weighted layers (subclasses of QuantMixin)"
            )
        new = cls(**cls._init_kwargs(module), **descs)
        new._copy_float_state(module)
        new.train(module.training)
        return new

    def _copy_float_state(self, module: nn.Module) -> None:
        result = self.load_state_dict(module.state_dict(), strict=False)  # copies the values
        missing = [k for k in result.missing_keys if not k.endswith("_amax")]
        if result.unexpected_keys or missing:
            raise ConfigError(
                f"{type(self).__name__}.from_float cannot take the state of this "
                f"{type(module).__name__}: unexpected keys {result.unexpected_keys}, missing "
                f"{missing} (extra buffers or parametrizations on the float layer: remove them "
                f"first)"
            )
        params = dict(self.named_parameters())
        for name, param in module.named_parameters():
            params[name].requires_grad_(param.requires_grad)
        for quantizer in self.modules():
            if isinstance(quantizer, TensorQuantizer) and params:
                quantizer.to(next(iter(params.values())).device)

    # -- loading a checkpoint -------------------------------------------------------------------
    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self._check_saved_shapes(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _check_saved_shapes(self, state_dict: dict, prefix: str) -> None:
        """Refuse a saved parameter or buffer of another shape than the layer's own, naming
        the layer, the parameter, both shapes and the fix (torch says only "size mismatch");
        missing and unexpected keys stay torch's (``strict``) business."""
        own = dict(self._parameters)
        own.update(
            (n, b) for n, b in self._buffers.items() if n not in self._non_persistent_buffers_set
        )
        for name, current in own.items():
            saved = state_dict.get(prefix + name)
            if (
                current is None
                or not isinstance(saved, torch.Tensor)
                or saved.shape == current.shape
                or nn.parameter.is_lazy(current)
                or (current.dim() == 0 and saved.dim() == 1)  # torch's legacy 1-d scalars
            ):
                continue
            where = f"{type(self).__name__} {prefix[:-1]!r}" if prefix else type(self).__name__
            built = ", ".join(
                f"{arg}={getattr(self, arg)!r}"
                for arg in self._init_args
                if arg.endswith(("channels", "features", "size"))
            )
            raise ConfigError(
                f"{where}: the checkpoint's {name!r} has shape {tuple(saved.shape)}, this "
                f"layer's {tuple(current.shape)}: the layer was built with "
                f"{built or 'other sizes'}; build it with the checkpoint's sizes, or leave "
                f"{prefix + name!r} out of the state_dict (strict=False)"
            )


class QuantMixin(QuantInputMixin):
    """Quantize the input and the weight of a ``torch.nn`` layer (``_weight_quantizer`` too).

    The constructor takes the parent's arguments plus keyword-only ``quant_desc_input`` and
    ``quant_desc_weight``. The weight descriptor's axes must exist on the weight.

    Example:
        >>> from qviz.engine.tensor.quant_nn import QuantConv2d
        >>> conv = QuantConv2d(2, 4, 3, quant_desc_weight=QuantDescriptor(num_bits=4, axis=0))
        >>> conv.weight_quantizer.num_bits, conv.weight_quantizer.axis
        (4, (0,))
    """

    default_quant_desc_weight: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_PER_TENSOR
    _quantizer_aliases: ClassVar[dict[str, str | None]] = {
        "input_quantizer": "_input_quantizer",
        "weight_quantizer": "_weight_quantizer",
    }

    def __init__(
        self,
        *args: Any,
        quant_desc_input: QuantDescriptor | None = None,
        quant_desc_weight: QuantDescriptor | None = None,
        **kwargs: Any,
    ) -> None:
        desc = self._desc_or_default("quant_desc_weight", quant_desc_weight)
        super().__init__(*args, quant_desc_input=quant_desc_input, **kwargs)
        self._init_weight_quantizers(desc)

    def _init_weight_quantizers(self, desc: QuantDescriptor) -> None:
        self._check_weight_axis(desc, self.weight)
        self._weight_quantizer = TensorQuantizer(desc)

    def _check_weight_axis(self, desc: QuantDescriptor, weight: torch.Tensor) -> None:
        bad = [a for a in desc.axis or () if not -weight.dim() <= a < weight.dim()]
        if bad:
            raise ConfigError(
                f"{type(self).__name__}: quant_desc_weight keeps axis {desc.axis}, but the weight "
                f"has {weight.dim()} dims {tuple(weight.shape)}; use an axis below "
                f"{weight.dim()} (axis=0: one amax per output row/channel)"
            )

    @property
    def weight_quantizer(self) -> TensorQuantizer:
        """The quantizer of the layer's weight (the ``_weight_quantizer`` submodule)."""
        return self._weight_quantizer

    @classmethod
    def set_default_quant_desc_weight(cls, value: QuantDescriptor) -> None:
        """Make ``value`` this class's weight descriptor for layers built afterwards.

        Only this class (and its subclasses) changes.

        Raises:
            ConfigError: ``value`` is not a QuantDescriptor.
        """
        cls.default_quant_desc_weight = _check_desc(
            f"{cls.__name__}.set_default_quant_desc_weight", "value", value
        )

    @classmethod
    def _init_kwargs(cls, module: nn.Module) -> dict[str, Any]:
        kwargs = super()._init_kwargs(module)
        if "bias" not in kwargs:  # Linear and convs: a bias parameter or None
            kwargs["bias"] = getattr(module, "bias", None) is not None
        first = next(module.parameters(), None)
        if first is not None:
            kwargs.update(device=first.device, dtype=first.dtype)
        return kwargs
