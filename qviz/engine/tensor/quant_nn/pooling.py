"""Quantized pooling: max, average and adaptive average pooling over 1, 2 and 3 dims.

Each quantizes its input with ``_input_quantizer`` and then runs its ``torch.nn`` parent's
forward, so every constructor argument (``ceil_mode``, ``count_include_pad``,
``divisor_override``, ``return_indices``, ...) keeps its meaning. Pooling has no weight.

Example:
    >>> import torch
    >>> pool = QuantAvgPool2d(2, ceil_mode=True, count_include_pad=False)
    >>> pool(torch.randn(1, 1, 5, 5)).shape
    torch.Size([1, 1, 3, 3])
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from qviz.engine.tensor.descriptor import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor
from qviz.engine.tensor.quant_nn.mixin import QuantInputMixin

_MAX_ARGS = ("kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode")
_AVG1D_ARGS = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad")
_AVG_ARGS = (*_AVG1D_ARGS, "divisor_override")


class _QuantPool(QuantInputMixin):
    """Quantize the input, then pool as the parent does."""

    default_quant_desc_input: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_PER_TENSOR

    def forward(self, input: torch.Tensor) -> Any:
        return super().forward(self._input_quantizer(input))


class QuantMaxPool1d(_QuantPool, nn.MaxPool1d):
    """``torch.nn.MaxPool1d`` on a fake-quantized input.

    Example:
        >>> import torch
        >>> QuantMaxPool1d(2)(torch.randn(1, 2, 8)).shape
        torch.Size([1, 2, 4])
    """

    _float_module = nn.MaxPool1d
    _init_args = _MAX_ARGS


class QuantMaxPool2d(_QuantPool, nn.MaxPool2d):
    """``torch.nn.MaxPool2d`` on a fake-quantized input.

    Example:
        >>> import torch
        >>> out, idx = QuantMaxPool2d(2, return_indices=True)(torch.randn(1, 1, 4, 4))
        >>> out.shape, idx.dtype
        (torch.Size([1, 1, 2, 2]), torch.int64)
    """

    _float_module = nn.MaxPool2d
    _init_args = _MAX_ARGS


class QuantMaxPool3d(_QuantPool, nn.MaxPool3d):
    """``torch.nn.MaxPool3d`` on a fake-quantized input.

    Example:
        >>> import torch
        >>> QuantMaxPool3d(2)(torch.randn(1, 1, 4, 4, 4)).shape
        torch.Size([1, 1, 2, 2, 2])
    """

    _float_module = nn.MaxPool3d
    _init_args = _MAX_ARGS


class QuantAvgPool1d(_QuantPool, nn.AvgPool1d):
    """``torch.nn.AvgPool1d`` on a fake-quantized input.

    Example:
        >>> import torch
        >>> QuantAvgPool1d(3, stride=2, padding=1)(torch.randn(1, 2, 8)).shape
        torch.Size([1, 2, 4])
    """

    _float_module = nn.AvgPool1d
    _init_args = _AVG1D_ARGS


class QuantAvgPool2d(_QuantPool, nn.AvgPool2d):
    """``torch.nn.AvgPool2d`` on a fake-quantized input.

    Example:
        >>> import torch
        >>> QuantAvgPool2d(2, divisor_override=1)(torch.ones(1, 1, 2, 2))
        tensor([[[[4.]]]])
    """

    _float_module = nn.AvgPool2d
    _init_args = _AVG_ARGS


class QuantAvgPool3d(_QuantPool, nn.AvgPool3d):
    """``torch.nn.AvgPool3d`` on a fake-quantized input.

    Example:
        >>> import torch
        >>> QuantAvgPool3d(2)(torch.randn(1, 1, 4, 4, 4)).shape
        torch.Size([1, 1, 2, 2, 2])
    """

    _float_module = nn.AvgPool3d
    _init_args = _AVG_ARGS


class QuantAdaptiveAvgPool1d(_QuantPool, nn.AdaptiveAvgPool1d):
    """``torch.nn.AdaptiveAvgPool1d`` on a fake-quantized input.

    Example:
        >>> import torch
        >>> QuantAdaptiveAvgPool1d(3)(torch.randn(1, 2, 7)).shape
        torch.Size([1, 2, 3])
    """

    _float_module = nn.AdaptiveAvgPool1d
    _init_args = ("output_size",)


class QuantAdaptiveAvgPool2d(_QuantPool, nn.AdaptiveAvgPool2d):
    """``torch.nn.AdaptiveAvgPool2d`` on a fake-quantized input.

    Example:
        >>> import torch
        >>> QuantAdaptiveAvgPool2d((1, None))(torch.randn(1, 2, 5, 3)).shape
        torch.Size([1, 2, 1, 3])
    """

    _float_module = nn.AdaptiveAvgPool2d
    _init_args = ("output_size",)


class QuantAdaptiveAvgPool3d(_QuantPool, nn.AdaptiveAvgPool3d):
    """``torch.nn.AdaptiveAvgPool3d`` on a fake-quantized input.

    Example:
        >>> import torch
        >>> QuantAdaptiveAvgPool3d(1)(torch.randn(1, 2, 3, 3, 3)).shape
        torch.Size([1, 2, 1, 1, 1])
    """

    _float_module = nn.AdaptiveAvgPool3d
    _init_args = ("output_size",)
