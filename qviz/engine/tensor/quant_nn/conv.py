"""Quantized convolutions: ``QuantConv1d/2d/3d`` and ``QuantConvTranspose1d/2d/3d``.

The input and the weight pass through TensorQuantizers, the bias stays float, and the parent's
own convolution runs on the results: ``padding_mode`` (``"reflect"``, ``"circular"``, ...) pads
as in ``torch.nn.Conv2d``, and a transposed convolution's ``output_size`` picks the output
padding with the parent's ``_output_padding`` as ``torch.nn.ConvTranspose2d.forward`` does.

Weights get one amax per output channel by default: axis 0 of a conv weight
``(out, in / groups, k...)``, axis 1 of a transposed conv weight ``(in, out / groups, k...)``.

Example:
    >>> import torch
    >>> up = QuantConvTranspose2d(4, 2, 3, stride=2)
    >>> up(torch.randn(1, 4, 5, 5), output_size=[12, 12]).shape
    torch.Size([1, 2, 12, 12])
    >>> up.weight_quantizer.axis
    (1,)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from qviz.engine.tensor.descriptor import (
    QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_PER_TENSOR,
    QuantDescriptor,
)
from qviz.engine.tensor.quant_nn.mixin import QuantMixin
from qviz.errors import ConfigError

_CONV_ARGS = (
    "in_channels",
    "out_channels",
    "kernel_size",
    "stride",
    "padding",
    "dilation",
    "groups",
    "padding_mode",
)


class _QuantConvNd(QuantMixin):
    """Shared forward of the quantized convolutions."""

    default_quant_desc_input: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_PER_TENSOR
    _init_args = _CONV_ARGS

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self._weight_quantizer(self.weight)
        return self._conv_forward(self._input_quantizer(input), weight, self.bias)


class QuantConv1d(_QuantConvNd, nn.Conv1d):
    """``torch.nn.Conv1d`` with a fake-quantized input and weight (one amax per output channel).

    Args:
        *args, **kwargs: those of ``torch.nn.Conv1d``.
        quant_desc_input: input descriptor; default per tensor, 8 bits.
        quant_desc_weight: weight descriptor; default ``QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL``.

    Example:
        >>> import torch
        >>> QuantConv1d(2, 3, 3, padding=1)(torch.randn(1, 2, 8)).shape
        torch.Size([1, 3, 8])
    """

    default_quant_desc_weight: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL
    _float_module = nn.Conv1d


class QuantConv2d(_QuantConvNd, nn.Conv2d):
    """``torch.nn.Conv2d`` with a fake-quantized input and weight (one amax per output channel).

    Args:
        *args, **kwargs: those of ``torch.nn.Conv2d``.
        quant_desc_input: input descriptor; default per tensor, 8 bits.
        quant_desc_weight: weight descriptor; default ``QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL``.

    Example:
        >>> import torch
        >>> conv = QuantConv2d(3, 8, 3, padding=1, padding_mode="reflect")
        >>> conv(torch.randn(1, 3, 6, 6)).shape
        torch.Size([1, 8, 6, 6])
    """

    default_quant_desc_weight: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL
    _float_module = nn.Conv2d


class QuantConv3d(_QuantConvNd, nn.Conv3d):
    """``torch.nn.Conv3d`` with a fake-quantized input and weight (one amax per output channel).

    Args:
        *args, **kwargs: those of ``torch.nn.Conv3d``.
        quant_desc_input: input descriptor; default per tensor, 8 bits.
        quant_desc_weight: weight descriptor; default ``QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL``.

    Example:
        >>> import torch
        >>> QuantConv3d(1, 2, 3)(torch.randn(1, 1, 4, 4, 4)).shape
        torch.Size([1, 2, 2, 2, 2])
    """

    default_quant_desc_weight: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL
    _float_module = nn.Conv3d


class _QuantConvTransposeNd(QuantMixin):
    """Shared forward of the quantized transposed convolutions."""

    default_quant_desc_input: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_PER_TENSOR
    _init_args = (*_CONV_ARGS, "output_padding")
    _num_spatial_dims: ClassVar[int]
    _conv_transpose: ClassVar[Callable[..., torch.Tensor]]

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ConfigError(
                f"{type(self).__name__} supports only padding_mode='zeros' (as torch's "
                f"ConvTranspose), got {self.padding_mode!r}"
            )
        output_padding = self._output_padding(
            input,
            output_size,
            self.stride,
            self.padding,
            self.kernel_size,
            self._num_spatial_dims,
            self.dilation,
        )
        return type(self)._conv_transpose(
            self._input_quantizer(input),
            self._weight_quantizer(self.weight),
            self.bias,
            self.stride,
            self.padding,
            output_padding,
            self.groups,
            self.dilation,
        )


class QuantConvTranspose1d(_QuantConvTransposeNd, nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` with a fake-quantized input and weight.

    Args:
        *args, **kwargs: those of ``torch.nn.ConvTranspose1d``.
        quant_desc_input: input descriptor; default per tensor, 8 bits.
        quant_desc_weight: weight descriptor; default
            ``QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL`` (axis 1, output channels).

    Example:
        >>> import torch
        >>> QuantConvTranspose1d(2, 3, 3, stride=2)(torch.randn(1, 2, 4)).shape
        torch.Size([1, 3, 9])
    """

    default_quant_desc_weight: ClassVar[QuantDescriptor] = (
        QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL
    )
    _float_module = nn.ConvTranspose1d
    _num_spatial_dims = 1
    _conv_transpose = staticmethod(F.conv_transpose1d)


class QuantConvTranspose2d(_QuantConvTransposeNd, nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` with a fake-quantized input and weight.

    Args:
        *args, **kwargs: those of ``torch.nn.ConvTranspose2d``.
        quant_desc_input: input descriptor; default per tensor, 8 bits.
        quant_desc_weight: weight descriptor; default
            ``QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL`` (axis 1, output channels).

    Example:
        >>> import torch
        >>> QuantConvTranspose2d(2, 3, 2, stride=2)(torch.randn(1, 2, 4, 4)).shape
        torch.Size([1, 3, 8, 8])
    """

    default_quant_desc_weight: ClassVar[QuantDescriptor] = (
        QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL
    )
    _float_module = nn.ConvTranspose2d
    _num_spatial_dims = 2
    _conv_transpose = staticmethod(F.conv_transpose2d)


class QuantConvTranspose3d(_QuantConvTransposeNd, nn.ConvTranspose3d):
    """``torch.nn.ConvTranspose3d`` with a fake-quantized input and weight.

    Args:
        *args, **kwargs: those of ``torch.nn.ConvTranspose3d``.
        quant_desc_input: input descriptor; default per tensor, 8 bits.
        quant_desc_weight: weight descriptor; default
            ``QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL`` (axis 1, output channels).

    Example:
        >>> import torch
        >>> QuantConvTranspose3d(1, 2, 2, stride=2)(torch.randn(1, 1, 2, 2, 2)).shape
        torch.Size([1, 2, 4, 4, 4])
    """

    default_quant_desc_weight: ClassVar[QuantDescriptor] = (
        QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL
    )
    _float_module = nn.ConvTranspose3d
    _num_spatial_dims = 3
    _conv_transpose = staticmethod(F.conv_transpose3d)
