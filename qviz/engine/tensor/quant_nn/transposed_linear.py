"""Quantized versions of foreign linear layers that store their weight as ``[in, out]``.

Hugging Face's GPT-2 (and GPT, CTRL, ...) projects with ``transformers.pytorch_utils.Conv1D``:
despite its name a linear layer, ``y = x @ weight + bias`` with ``weight`` of shape
``[in_features, out_features]``, the transpose of ``nn.Linear``'s. It is not an ``nn.Linear``,
so :func:`quant_modules.quantize_model <qviz.engine.tensor.quant_modules.quantize_model>` leaves
it float unless told how to quantize it. :func:`quant_transposed_linear` builds that quantized
class from the foreign class itself (qviz never imports transformers): a subclass of the
foreign class (``isinstance(layer, Conv1D)`` stays true, so the model's own code still
recognises it) plus :class:`~qviz.engine.tensor.quant_nn.mixin.QuantMixin`'s input and weight
quantizers. Pass it as ``custom_quant_modules=[(namespace, "Conv1D", quantized)]``.

The weight's output features are its axis 1, so the default weight descriptor keeps one amax per
output feature along ``axis=1`` (amax shape ``[1, out]``); the quantized values are those of a
:class:`~qviz.engine.tensor.quant_nn.QuantLinear` holding the transposed weight.

Example:
    >>> import torch
    >>> class Conv1D(torch.nn.Module):  # transformers.pytorch_utils.Conv1D, in short
    ...     def __init__(self, nf, nx):
    ...         super().__init__()
    ...         self.nf, self.nx = nf, nx
    ...         self.weight = torch.nn.Parameter(torch.randn(nx, nf))
    ...         self.bias = torch.nn.Parameter(torch.zeros(nf))
    ...     def forward(self, x):
    ...         return x @ self.weight + self.bias
    >>> QuantConv1D = quant_transposed_linear(Conv1D)
    >>> layer = QuantConv1D.from_float(Conv1D(nf=3, nx=4))
    >>> layer.weight_quantizer.axis, layer(torch.randn(2, 5, 4)).shape
    ((1,), torch.Size([2, 5, 3]))
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from qviz.engine.tensor.descriptor import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor
from qviz.engine.tensor.quant_nn.mixin import QuantInputMixin, QuantMixin
from qviz.errors import ConfigError

# one amax per output feature of an ``[in, out]`` weight
_QUANT_DESC_8BIT_WEIGHT_PER_OUTPUT_COLUMN = QuantDescriptor(num_bits=8, axis=1)

_built: dict[tuple[type, tuple[str, ...]], type] = {}  # filled by quant_transposed_linear only


class QuantTransposedLinearMixin(QuantMixin):
    """``y = q(x) @ q(weight) + bias`` for a foreign layer whose ``weight`` is ``[in, out]``.

    :func:`quant_transposed_linear` puts it before the foreign class; use that function rather
    than this class. The forward is transformers' ``Conv1D.forward`` with the two quantizers
    (``torch.addmm`` on the input flattened to 2-D), so with both quantizers disabled it
    returns the float layer's output bit for bit.

    Example:
        >>> issubclass(QuantTransposedLinearMixin, QuantMixin)
        True
    """

    default_quant_desc_input: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight: ClassVar[QuantDescriptor] = _QUANT_DESC_8BIT_WEIGHT_PER_OUTPUT_COLUMN

    def _init_weight_quantizers(self, desc: QuantDescriptor) -> None:
        weight = getattr(self, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise ConfigError(
                f"{type(self).__name__}: the float class must hold a 2-D weight [in, out] "
                f"(y = x @ weight + bias), got {got}; quant_transposed_linear is for layers "
                f"like transformers' Conv1D"
            )
        super()._init_weight_quantizers(desc)

    __repr__ = nn.Module.__repr__  # the quantizers too (transformers' Conv1D prints only nf, nx)

    def extra_repr(self) -> str:
        in_features, out_features = self.weight.shape
        return f"in_features={in_features}, out_features={out_features}, weight=[in, out]"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x = self._input_quantizer(input)
        weight = self._weight_quantizer(self.weight)
        flat = x.reshape(-1, x.size(-1))
        out = torch.mm(flat, weight) if self.bias is None else torch.addmm(self.bias, flat, weight)
        return out.view(*x.shape[:-1], weight.shape[-1])

    @classmethod
    def _init_kwargs(cls, module: nn.Module) -> dict[str, Any]:
        # only the foreign constructor's own arguments: Conv1D(nf, nx) takes no bias or dtype
        return {name: getattr(module, name) for name in cls._init_args}

    @classmethod
    def _check_float(cls, module: object) -> None:
        if type(module) is not cls._float_module or isinstance(module, QuantInputMixin):
            float_name = f"{cls._float_module.__module__}.{cls._float_module.__qualname__}"
            raise ConfigError(
                f"{cls.__name__}.from_float needs a float {float_name}, got "
                f"{type(module).__name__}; build the quantized class of that layer's own class "
                f"with quant_transposed_linear(type(layer))"
            )

    def _copy_float_state(self, module: nn.Module) -> None:
        first = next(module.parameters(), None)
        if first is not None:  # the foreign constructor took no device / dtype
            for param in self.parameters(recurse=False):
                param.data = param.data.to(device=first.device, dtype=first.dtype)
        super()._copy_float_state(module)


def _unique_qualname(name: str) -> str:
    # pickle finds a class by module and qualified name: two foreign classes of one name (or
    # one class with two init_args) get distinct qualified names, the same __name__
    taken = {cls.__qualname__ for cls in _built.values()}
    unique, suffix = name, 2
    while unique in taken:
        unique, suffix = f"{name}_{suffix}", suffix + 1
    return unique


def quant_transposed_linear(
    float_class: type[nn.Module], init_args: tuple[str, ...] = ("nf", "nx")
) -> type[QuantTransposedLinearMixin]:
    """The quantized class of a foreign linear layer whose weight is ``[in, out]``.

    Built once per class (a second call returns the same class): a subclass of
    ``float_class`` and :class:`QuantTransposedLinearMixin`, named ``Quant<Name>``, with
    ``from_float(layer)`` for ``quantize_model``. Its constructor takes the foreign
    constructor's arguments plus keyword-only ``quant_desc_input`` / ``quant_desc_weight``
    (default: 8 bits, the input per tensor, the weight per output feature, ``axis=1``).

    Args:
        float_class: the foreign layer, e.g. ``transformers.pytorch_utils.Conv1D``. It must
            compute ``x @ weight + bias`` with a 2-D ``weight [in, out]`` and ``bias [out]``
            (or None).
        init_args: the foreign constructor's arguments, read back from a float layer's
            attributes of the same names by ``from_float`` (transformers' ``Conv1D(nf, nx)``).

    Returns:
        The quantized class.

    Raises:
        ConfigError: ``float_class`` is not an ``nn.Module`` class or is already quantized,
            or ``init_args`` is not a tuple of names.

    Example:
        >>> import torch
        >>> class Proj(torch.nn.Module):   # y = x @ w, w: [in, out]
        ...     def __init__(self, n_in, n_out):
        ...         super().__init__()
        ...         self.n_in, self.n_out = n_in, n_out
        ...         self.weight, self.bias = torch.nn.Parameter(torch.randn(n_in, n_out)), None
        >>> QuantProj = quant_transposed_linear(Proj, init_args=("n_in", "n_out"))
        >>> QuantProj.__name__, quant_transposed_linear(Proj, ("n_in", "n_out")) is QuantProj
        ('QuantProj', True)
        >>> QuantProj(4, 3).weight_quantizer.axis
        (1,)
    """
    if not (isinstance(float_class, type) and issubclass(float_class, nn.Module)):
        raise ConfigError(
            f"quant_transposed_linear: float_class must be an nn.Module class such as "
            f"transformers.pytorch_utils.Conv1D, got {float_class!r:.80}"
        )
    if issubclass(float_class, QuantInputMixin):
        raise ConfigError(
            f"quant_transposed_linear: float_class {float_class.__name__} is already quantized; "
            f"pass the float class (e.g. transformers.pytorch_utils.Conv1D)"
        )
    if not (isinstance(init_args, tuple) and all(isinstance(a, str) for a in init_args)):
        raise ConfigError(
            f"quant_transposed_linear: init_args is a tuple of the float constructor's argument "
            f"names, e.g. ('nf', 'nx'); got {init_args!r:.80}"
        )
    key = (float_class, init_args)
    if key not in _built:
        name = f"Quant{float_class.__name__}"
        _built[key] = type(
            name,
            (QuantTransposedLinearMixin, float_class),
            {
                "__module__": __name__,
                "__qualname__": _unique_qualname(name),
                "__doc__": f"{float_class.__qualname__} with a quantized input and weight "
                f"(built by quant_transposed_linear).",
                "_float_module": float_class,
                "_init_args": init_args,
            },
        )
    return _built[key]


def __getattr__(name: str) -> type:
    # pickle finds a built class by module and name; only classes built in this process exist
    for cls in _built.values():
        if cls.__qualname__ == name:
            return cls
    raise AttributeError(
        f"module {__name__!r} has no attribute {name!r} (a quantized class exists only after "
        f"quant_transposed_linear(its float class) has been called in this process)"
    )
