"""Tensor-level quantization with the semantics of NVIDIA's pytorch-quantization toolkit.

``tensor_quant`` and ``fake_tensor_quant`` quantize with a given amax (a scalar, or a per-axis
tensor that broadcasts); ``QuantDescriptor`` describes how a tensor should be quantized;
``TensorQuantizer`` is the ``nn.Module`` that calibrates and applies it.

Note that ``tensor_quant`` returns NVIDIA's *multiplier* ``quant_max / amax`` as its scale; the
PyTorch-convention scale (step size) is its reciprocal (see :mod:`qviz.engine.qparams`).

Example (the toolkit's published example):
    >>> import torch
    >>> torch.manual_seed(12345)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> x = torch.rand(10)
    >>> fake_tensor_quant(x, x.abs().max())  # doctest: +NORMALIZE_WHITESPACE
    tensor([0.9843, 0.8828, 0.9921, 0.4609, 0.0859, 0.1797, 0.3672, 0.5703, 0.3359, 0.2109])
    >>> q, scale = tensor_quant(x, x.abs().max())
    >>> q.int().tolist(), round(float(scale), 4)
    ([126, 113, 127, 59, 11, 23, 47, 73, 43, 27], 128.0057)
"""

from __future__ import annotations

import torch

from qviz.engine.tensor.descriptor import (
    QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    QUANT_DESC_8BIT_PER_TENSOR,
    QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR,
    QuantDescriptor,
)
from qviz.engine.tensor.fake_quant import FakeTensorQuantFunction, TensorQuantFunction
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer

__all__ = [
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
    "QUANT_DESC_8BIT_PER_TENSOR",
    "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
    "QuantDescriptor",
    "TensorQuantizer",
    "fake_tensor_quant",
    "tensor_quant",
]


def tensor_quant(
    inputs: torch.Tensor,
    amax: float | torch.Tensor,
    num_bits: int = 8,
    output_dtype: torch.dtype = torch.float,
    unsigned: bool = False,
    *,
    narrow_range: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``inputs`` to integers; return ``(values, multiplier)``.

    Args:
        inputs: floating-point tensor.
        amax: largest |x| kept: a number, or a tensor broadcasting against ``inputs`` (per-axis).
        num_bits: bit width of the grid.
        output_dtype: dtype of the integer values (float by default, to stay differentiable;
            ``torch.int8`` etc. for storage).
        unsigned: quantize to ``[0, 2^b - 1]``; negative inputs are an error.
        narrow_range: signed grid ``[-(2^(b-1) - 1), 2^(b-1) - 1]`` (symmetric, the default);
            False adds ``-2^(b-1)``.

    Returns:
        The integer values, and the multiplier ``quant_max / amax`` (1 where amax is 0).
        Gradients flow to ``inputs`` straight through where ``|x| <= amax``.

    Example:
        >>> import torch
        >>> q, m = tensor_quant(torch.tensor([0.5, -2.0]), 1.0, output_dtype=torch.int8)
        >>> q.tolist(), float(m)
        ([64, -127], 127.0)
    """
    return TensorQuantFunction.apply(inputs, amax, num_bits, unsigned, narrow_range, output_dtype)


def fake_tensor_quant(
    inputs: torch.Tensor,
    amax: float | torch.Tensor,
    num_bits: int = 8,
    unsigned: bool = False,
    *,
    narrow_range: bool = True,
) -> torch.Tensor:
    """Quantize and dequantize ``inputs``: the float values an integer kernel would see.

    Same arguments as :func:`tensor_quant`; gradients flow straight through where
    ``|x| <= amax`` and are 0 where the value was clipped.

    Example:
        >>> import torch
        >>> fake_tensor_quant(torch.tensor([0.3, 5.0]), 1.0, num_bits=4)
        tensor([0.2857, 1.0000])
    """
    return FakeTensorQuantFunction.apply(inputs, amax, num_bits, unsigned, narrow_range)
