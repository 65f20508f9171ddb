"""Symmetric linear quantization as autograd functions with a straight-through estimator (STE).

The arithmetic follows NVIDIA's pytorch-quantization exactly, so its published numbers reproduce:

* ``multiplier = quant_max / amax`` with ``quant_max = 2^(num_bits - 1 + unsigned) - 1``;
* ``q = clamp(round(x * multiplier), quant_min, quant_max)`` (round half to even);
* fake quantization returns ``q / multiplier``;
* an amax at or below 2^-24 quantizes everything to 0 and reports a multiplier of 1.

The backward pass is the STE: the incoming gradient passes where ``|x| <= amax`` and is 0 where
the value was clipped. amax receives no gradient.

Example:
    >>> import torch
    >>> x = torch.tensor([0.5, -1.0, 3.0], requires_grad=True)
    >>> y = FakeTensorQuantFunction.apply(x, torch.tensor(1.0), 8, False, True)
    >>> y.sum().backward()
    >>> x.grad
    tensor([1., 1., 0.])
"""

from __future__ import annotations

import torch

from qviz.engine.qparams import quant_range
from qviz.errors import QuantizationError

__all__ = ["FakeTensorQuantFunction", "TensorQuantFunction", "quantize_symmetric"]

_TINY_AMAX = 1.0 / (1 << 24)  # below the smallest fp16 subnormal: treated as amax = 0


def _as_amax(amax: float | torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    if not isinstance(amax, torch.Tensor):
        amax = torch.tensor(float(amax))
    amax = amax.detach().to(inputs.device, torch.float32)
    if amax.numel() == 0:
        raise QuantizationError("amax is an empty tensor: give one value, or one per channel")
    if not bool(torch.isfinite(amax).all()):
        raise QuantizationError(f"amax must be finite, got {amax.flatten()[:8].tolist()}")
    if bool((amax < 0).any()):
        raise QuantizationError(
            f"amax must be >= 0 (it is the largest |x| kept), got min {float(amax.min()):.6g}"
        )
    try:
        torch.broadcast_shapes(amax.shape, inputs.shape)
    except RuntimeError as exc:
        raise QuantizationError(
            f"amax of shape {tuple(amax.shape)} does not broadcast against inputs of shape "
            f"{tuple(inputs.shape)}: per-channel amax keeps size 1 on reduced axes, "
            f"e.g. (C, 1, 1, 1)"
        ) from exc
    return amax


def quantize_symmetric(
    inputs: torch.Tensor,
    amax: float | torch.Tensor,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer-valued float32 outputs and the float32 multiplier; no autograd bookkeeping.

    Example:
        >>> import torch
        >>> q, m = quantize_symmetric(torch.tensor([0.25, -1.0]), 1.0)
        >>> q.tolist(), float(m)
        ([32.0, -127.0], 127.0)
    """
    if not isinstance(inputs, torch.Tensor) or not inputs.is_floating_point():
        raise QuantizationError(
            f"inputs must be a floating-point tensor, got {type(inputs).__name__}"
        )
    quant_min, quant_max = quant_range(num_bits, unsigned=unsigned, narrow_range=narrow_range)
    amax = _as_amax(amax, inputs)
    x = inputs.float()  # half/bfloat16 would overflow or lose the grid: compute in float32
    if unsigned and x.numel() and float(x.min()) < 0:
        raise QuantizationError(
            f"unsigned quantization got negative inputs (min {float(x.min()):.6g}): use "
            f"unsigned=False, or quantize a non-negative tensor"
        )
    scale = torch.tensor(float(quant_max), device=x.device) / amax
    tiny = amax <= _TINY_AMAX
    scale = torch.where(tiny, torch.zeros_like(scale), scale)  # quantize everything to 0
    outputs = torch.clamp(torch.round(x * scale), quant_min, quant_max)
    return outputs, torch.where(tiny, torch.ones_like(scale), scale)


def _ste_grad(ctx, grad_outputs: torch.Tensor) -> torch.Tensor:
    inputs, amax = ctx.saved_tensors
    return torch.where(inputs.abs() <= amax, grad_outputs, torch.zeros_like(grad_outputs))


class TensorQuantFunction(torch.autograd.Function):
    """``(inputs, amax, num_bits, unsigned, narrow_range, output_dtype) -> (outputs, multiplier)``.

    ``outputs`` hold the integer values (in ``output_dtype``); backward is the STE.
    """

    @staticmethod
    def forward(
        ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True, output_dtype=None
    ):
        outputs, scale = quantize_symmetric(inputs, amax, num_bits, unsigned, narrow_range)
        ctx.save_for_backward(inputs, _as_amax(amax, inputs))
        output_dtype = output_dtype or inputs.dtype
        if (
            output_dtype.is_floating_point
            and output_dtype == torch.float16
            and float(scale.max()) > 65504
        ):
            raise QuantizationError(
                f"multiplier {float(scale.max()):.6g} overflows float16: amax is too small for a "
                f"float16 output; use output_dtype=torch.float32"
            )
        outputs = outputs.to(output_dtype)
        if not output_dtype.is_floating_point:
            ctx.mark_non_differentiable(outputs)
        scale = scale.to(inputs.dtype)
        ctx.mark_non_differentiable(scale)
        return outputs, scale

    @staticmethod
    def backward(ctx, grad_outputs, grad_scale):
        return _ste_grad(ctx, grad_outputs), None, None, None, None, None


class FakeTensorQuantFunction(torch.autograd.Function):
    """``(inputs, amax, num_bits, unsigned, narrow_range) -> q / multiplier``; STE backward."""

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):
        outputs, scale = quantize_symmetric(inputs, amax, num_bits, unsigned, narrow_range)
        ctx.save_for_backward(inputs, _as_amax(amax, inputs))
        return (outputs / scale).to(inputs.dtype)

    @staticmethod
    def backward(ctx, grad_outputs):
        return _ste_grad(ctx, grad_outputs), None, None, None, None
