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

_TINY_AMAX = 1.0 / (1 << 24)  # below the smallest fp16 subnormal: treated as amax = 0


def _as_amax(amax: float | torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    if not isinstance(amax, torch.Tensor):
        amax = torch.tensor(float(amax))
    if torch.compiler.is_exporting():  # values are symbolic while torch.export traces: no checks
        return amax if amax.dtype == torch.float32 else amax.float()
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


def _spelled_out(
    x: torch.Tensor, scale: torch.Tensor, low: int, high: int, dtype: torch.dtype
) -> torch.Tensor:
    """torch's fake_quantize kernels (zero_point 0) as plain operators, bit for bit."""
    out = torch.clamp(torch.round(x * torch.reciprocal(scale)), low, high) * scale
    return out if out.dtype == dtype else out.to(dtype)


def _container(quant_min: int, quant_max: int) -> tuple[int, int]:
    """The 8-bit storage range holding ``[quant_min, quant_max]`` (the range itself if none)."""
    for low, high in ((-128, 127), (0, 255)):
        if low <= quant_min and quant_max <= high:
            return low, high
    return quant_min, quant_max


def torch_fake_quant(
    inputs: torch.Tensor,
    amax: float | torch.Tensor,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
    axis: tuple[int, ...] | None = None,
    *,
    torch_ops: bool = True,
) -> torch.Tensor:
    """Fake quantization through torch's own ``fake_quantize_per_tensor_affine`` /
    ``fake_quantize_per_channel_affine`` (what ONNX export turns into QuantizeLinear /
    DequantizeLinear), with the step size ``scale = amax / quant_max`` and zero_point 0.

    A grid narrower than its 8-bit container (narrow range, fewer than 8 bits) is clamped to
    ``[quant_min * scale, quant_max * scale]`` first and then fake-quantized with the
    container's range, which gives the same values and stays expressible in ONNX. The integer
    grid is the one :class:`FakeTensorQuantFunction` picks; the dequantized floats can differ
    from it in the last bit, because this multiplies by the step size where NVIDIA's
    arithmetic divides by the multiplier. An amax at or below 2^-24 zeroes its values, as the
    toolkit's arithmetic does; inside ``torch.export`` (no data-dependent branches there) its
    step is clamped to 2^-24 / quant_max instead, so such values stay within 2^-24 of 0.
    Gradients follow torch's ops (straight through inside the grid).

    Args:
        inputs: floating-point tensor.
        amax: one value, or one per channel shaped to broadcast (size 1 on reduced axes).
        num_bits, unsigned, narrow_range: the grid, as for :func:`quantize_symmetric`.
        axis: the one axis a per-channel amax runs along (None for a per-tensor amax).
        torch_ops: call torch's fake_quantize operators (True), or spell out their arithmetic
            ``clamp(round(x * (1 / scale))) * scale`` with the same bits, which torch.export
            can trace with symbolic (dynamic) shapes where those operators have no kernel.

    Example:
        >>> import torch
        >>> torch_fake_quant(torch.tensor([0.3, 5.0]), 1.0, num_bits=4)
        tensor([0.2857, 1.0000])
    """
    quant_min, quant_max = quant_range(num_bits, unsigned=unsigned, narrow_range=narrow_range)
    exporting = torch.compiler.is_exporting()
    amax = _as_amax(amax, inputs)
    if exporting:  # no data-dependent branch: a tiny amax keeps a tiny step instead
        scale = torch.clamp_min(amax / quant_max, _TINY_AMAX / quant_max)
    else:
        tiny = amax <= _TINY_AMAX
        scale = torch.where(tiny, torch.ones_like(amax), amax / quant_max)
    low, high = _container(quant_min, quant_max)
    x = inputs if inputs.dtype == torch.float32 else inputs.float()
    if (low, high) != (quant_min, quant_max):
        x = torch.clamp(x, quant_min * scale, quant_max * scale)
    if not exporting and bool(tiny.any()):
        x = x * ~tiny
    if amax.numel() == 1:
        if not torch_ops:
            return _spelled_out(x, scale.reshape(()), low, high, inputs.dtype)
        zero = torch.zeros((), dtype=torch.int32, device=x.device)
        out = torch.fake_quantize_per_tensor_affine(x, scale.reshape(()), zero, low, high)
        return out if out.dtype == inputs.dtype else out.to(inputs.dtype)
    if axis is None or len(axis) != 1:
        raise QuantizationError(
            f"a per-channel amax of shape {tuple(amax.shape)} needs exactly one channel axis "
            f"for torch's per-channel fake quantization, got axis={axis}: quantize along one "
            f"axis, or turn use_fb_fake_quant off"
        )
    ch = axis[0] % x.dim()
    flat = scale.flatten()
    if flat.numel() != x.shape[ch]:
        raise QuantizationError(
            f"a per-channel amax with {flat.numel()} values does not match axis {ch} of size "
            f"{x.shape[ch]} of inputs shaped {tuple(x.shape)}"
        )
    if not torch_ops:
        shape = [flat.numel() if d == ch else 1 for d in range(x.dim())]
        return _spelled_out(x, flat.reshape(shape), low, high, inputs.dtype)
    zero = torch.zeros(flat.numel(), dtype=torch.int32, device=x.device)
    out = torch.fake_quantize_per_channel_affine(x, flat, zero, ch, low, high)
    return out if out.dtype == inputs.dtype else out.to(inputs.dtype)
