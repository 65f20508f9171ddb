"""The integer functions of the reference representation, besides quantized linear and conv.

:func:`~qviz.engine.pt2e.passes.reference_representation.to_reference_representation` rewrites
each quantized pattern of a converted model into one call of a small function; linear and conv
live in :mod:`~qviz.engine.pt2e.passes.reference_representation`, the others here, with the
arithmetic they all share:

* :func:`quantized_add` (``relu=True`` for add + ReLU): each input's integers, shifted by their
  zero points, are scaled to the output's units by ``x_scale / out_scale`` and
  ``y_scale / out_scale``, summed, rounded once, shifted by the output's zero point, clamped;
* :func:`quantized_max_pool2d`: max pooling of the shifted integers (dequantizing is increasing,
  so the max commutes with it), then requantized; with equal input and output qparams (XNNPACK
  shares them) the multiplier is exactly 1, so the result is the input's integers, pooled;
* :func:`dynamic_quantized_linear`: the int32 multiply-accumulate of a dynamically quantized
  linear, scaled back to float by ``x_scale * w_scale``, plus the float bias;
* :func:`reference_quantize_per_tensor` / :func:`reference_dequantize_per_tensor` and the
  per-channel pair: ``quantize`` and ``dequantize`` written out, every operation the same as in
  ``torch.ops.quantized_decomposed``'s own implementation, so they give the same bits.

Multipliers are applied in float64, where an integer backend uses a fixed-point multiplier and a
shift; rounding is half to even, as in ``quantize_per_tensor``. Each function raises
:class:`~qviz.errors.QuantizationError` when handed a tensor of the wrong dtype.

Example:
    >>> x_q = torch.tensor([10, -20], dtype=torch.int8)
    >>> quantized_add(x_q, 0.5, 0, x_q, 0.25, 0, 1.0, 0)   # 5 + 2.5 and -10 - 5
    tensor([  8, -15], dtype=torch.int8)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from qviz.errors import QuantizationError

_INT8_TYPES = (torch.int8, torch.uint8)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
Scale = float | Tensor
ZeroPoint = int | Tensor

# --------------------------------------------------------------------------------------------
# Shared arithmetic.
# --------------------------------------------------------------------------------------------


def per_channel(value: Scale | ZeroPoint, dims_after: int, dtype: torch.dtype) -> Tensor:
    """A scalar, or a per-channel vector shaped ``(C, 1, ..., 1)`` to broadcast over channels."""
    tensor = torch.as_tensor(value)
    return tensor.to(dtype).reshape(-1, *(1,) * dims_after)


def shift(q: Tensor, zero_point: Tensor, name: str) -> Tensor:
    """``q - zero_point`` widened to int16, so the difference of two int8 values cannot wrap."""
    if q.dtype not in _INT8_TYPES:
        raise QuantizationError(
            f"the reference kernels take int8 or uint8 tensors, got {name} of dtype {q.dtype}; "
            f"pass the output of quantize_per_tensor / the stored integer weight"
        )
    return q.to(torch.int16) - zero_point.to(torch.int16)


def exact_linear(x: Tensor, w: Tensor) -> Tensor:
    """``x @ w.T`` of shifted int16 tensors as int32, exact (see the module docstring of
    :mod:`~qviz.engine.pt2e.passes.reference_representation`: float64 holds every partial sum)."""
    return torch.matmul(x.to(torch.float64), w.to(torch.float64).T).to(torch.int32)


def quantize_bias(bias: Tensor, x_scale: Scale, w_scale: Scale) -> Tensor:
    """Quantize a float bias to int32 with scale ``x_scale * w_scale``, zero_point 0.

    The accumulator of ``x_q * w_q`` counts units of ``x_scale * w_scale``, so the bias has to be
    counted in the same units before it can be added. Values beyond int32 are clamped.

    Args:
        bias: float bias, one value per output channel.
        x_scale: the input's scale.
        w_scale: the weight's scale, a float or one value per output channel.

    Returns:
        The int32 bias, same shape as ``bias``.

    Example:
        >>> quantize_bias(torch.tensor([0.3, -1.0]), 0.5, torch.tensor([0.1, 0.2]))
        tensor([  6, -10], dtype=torch.int32)
    """
    scale = torch.as_tensor(x_scale, dtype=torch.float64) * torch.as_tensor(
        w_scale, dtype=torch.float64
    )
    counted = torch.round(bias.to(torch.float64) / scale)
    return counted.clamp(_INT32_MIN, _INT32_MAX).to(torch.int32)


def requantize(
    acc: Tensor,
    multiplier: Tensor | float,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype = torch.int8,
    *,
    relu: bool = False,
) -> Tensor:
    """Scale an int32 accumulator to the output's integers: round, add zero_point, clamp.

    ``multiplier`` is ``x_scale * w_scale / out_scale`` (float64; a per-channel tensor broadcasts).
    Rounding is half to even, as in ``quantize_per_tensor``. With ``relu`` the lower bound is
    ``zero_point``, the integer that stands for 0.0, which equals quantizing ``relu(y)``.

    Args:
        acc: int32 accumulator.
        multiplier: the requantization multiplier.
        zero_point: the output's zero_point.
        quant_min: the output's smallest integer.
        quant_max: the output's largest integer.
        dtype: the output's integer dtype.
        relu: clamp at ``zero_point`` from below as well.

    Returns:
        The quantized output, of ``dtype``.

    Example:
        >>> requantize(torch.tensor([24, -500], dtype=torch.int32), 1.25, 3, -128, 127)
        tensor([  33, -128], dtype=torch.int8)
        >>> requantize(torch.tensor([24, -500], dtype=torch.int32), 1.25, 3, -128, 127, relu=True)
        tensor([33,  3], dtype=torch.int8)
    """
    scaled = acc.to(torch.float64) * multiplier
    return _round_clamp(
        scaled,
        _Output(
            scale=1.0,
            zero_point=zero_point,
            quant_min=quant_min,
            quant_max=quant_max,
            dtype=dtype,
            relu=relu,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class _Output:
    """The output side shared by every kernel: qparams, integer range, dtype, fused relu."""

    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    dtype: torch.dtype
    relu: bool


def _round_clamp(value: Tensor, out: _Output) -> Tensor:
    """``value`` (float64, in units of the output's scale) rounded, shifted, clamped, cast."""
    low = max(out.quant_min, out.zero_point) if out.relu else out.quant_min
    return (torch.round(value) + out.zero_point).clamp(low, out.quant_max).to(out.dtype)


# --------------------------------------------------------------------------------------------
# Add, max pooling, dynamic linear.
# --------------------------------------------------------------------------------------------


def quantized_add(
    x_q: Tensor,
    x_scale: float,
    x_zero_point: int,
    y_q: Tensor,
    y_scale: float,
    y_zero_point: int,
    out_scale: float,
    out_zero_point: int,
    *,
    quant_min: int = -128,
    quant_max: int = 127,
    out_dtype: torch.dtype = torch.int8,
    relu: bool = False,
) -> Tensor:
    """``q(dq(x_q) + dq(y_q))`` (and ``q(relu(...))``) computed on the integers.

    ``out = clamp(round((x_q - x_zp) * x_scale / out_scale + (y_q - y_zp) * y_scale / out_scale)
    + out_zp)``: one rounding, at the end, as the q/dq form rounds. (torchao's reference rounds
    each rescaled input separately and, for add + ReLU, truncates; so it can be one level off.)

    Args:
        x_q: int8/uint8 first input.
        x_scale: its scale.
        x_zero_point: its zero_point.
        y_q: int8/uint8 second input (broadcasts as in ``torch.add``).
        y_scale: its scale.
        y_zero_point: its zero_point.
        out_scale: the output's scale.
        out_zero_point: the output's zero_point.
        quant_min: the output's smallest integer.
        quant_max: the output's largest integer.
        out_dtype: the output's integer dtype.
        relu: fuse a ReLU (clamp at ``out_zero_point``).

    Returns:
        The quantized sum, of ``out_dtype``.

    Example:
        >>> x_q = torch.tensor([10, -40], dtype=torch.int8)
        >>> y_q = torch.tensor([3], dtype=torch.int8)
        >>> quantized_add(x_q, 0.5, 2, y_q, 1.0, -1, 0.25, 5)   # 4 + 4 = 8 and -21 + 4 = -17
        tensor([ 37, -63], dtype=torch.int8)
        >>> quantized_add(x_q, 0.5, 2, y_q, 1.0, -1, 0.25, 5, relu=True)
        tensor([37,  5], dtype=torch.int8)
    """
    x = shift(x_q, torch.as_tensor(x_zero_point), "x_q").to(torch.float64)
    y = shift(y_q, torch.as_tensor(y_zero_point), "y_q").to(torch.float64)
    value = x * (float(x_scale) / float(out_scale)) + y * (float(y_scale) / float(out_scale))
    out = _Output(
        scale=out_scale,
        zero_point=out_zero_point,
        quant_min=quant_min,
        quant_max=quant_max,
        dtype=out_dtype,
        relu=relu,
    )
    return _round_clamp(value, out)


def quantized_max_pool2d(
    x_q: Tensor,
    x_scale: float,
    x_zero_point: int,
    out_scale: float,
    out_zero_point: int,
    *,
    kernel_size: Sequence[int] | int,
    stride: Sequence[int] | int = (),
    padding: Sequence[int] | int = 0,
    dilation: Sequence[int] | int = 1,
    ceil_mode: bool = False,
    quant_min: int = -128,
    quant_max: int = 127,
    out_dtype: torch.dtype = torch.int8,
) -> Tensor:
    """``q(max_pool2d(dq(x_q)))`` computed on the integers.

    Dequantizing is increasing (``scale > 0``), so the max of the dequantized values is the
    dequantized max: pool ``x_q - x_zero_point`` (padding counts as minus infinity, as in the
    float op), then requantize with ``x_scale / out_scale``, exactly 1 when the qparams are
    shared.

    Args:
        x_q: int8/uint8 input ``(N, C, H, W)``.
        x_scale: the input's scale.
        x_zero_point: the input's zero_point.
        out_scale: the output's scale.
        out_zero_point: the output's zero_point.
        kernel_size: as in ``torch.nn.functional.max_pool2d``.
        stride: as in ``max_pool2d`` (empty: ``kernel_size``).
        padding: as in ``max_pool2d``.
        dilation: as in ``max_pool2d``.
        ceil_mode: as in ``max_pool2d``.
        quant_min: the output's smallest integer.
        quant_max: the output's largest integer.
        out_dtype: the output's integer dtype.

    Returns:
        The pooled integers, of ``out_dtype``.

    Example:
        >>> x_q = torch.tensor([[[[1, -7], [5, 3]]]], dtype=torch.int8)
        >>> quantized_max_pool2d(x_q, 0.1, -2, 0.1, -2, kernel_size=2).flatten()
        tensor([5], dtype=torch.int8)
    """
    x = shift(x_q, torch.as_tensor(x_zero_point), "x_q").to(torch.float64)
    pooled = torch.nn.functional.max_pool2d(
        x, kernel_size, stride or None, padding, dilation, ceil_mode=ceil_mode
    )
    out = _Output(
        scale=out_scale,
        zero_point=out_zero_point,
        quant_min=quant_min,
        quant_max=quant_max,
        dtype=out_dtype,
        relu=False,
    )
    return _round_clamp(pooled * (float(x_scale) / float(out_scale)), out)


def dynamic_quantized_linear(
    x_q: Tensor,
    x_scale: Scale,
    x_zero_point: ZeroPoint,
    w_q: Tensor,
    w_scale: Scale,
    w_zero_point: ZeroPoint,
    bias: Tensor | None,
    *,
    out_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """``linear(dq(x_q), dq(w_q), bias)`` of a dynamically quantized input, on the integers.

    ``x_q`` was quantized at run time (``choose_qparams`` gives ``x_scale``, ``x_zero_point``);
    the int32 accumulator of the shifted integers is scaled back to float by
    ``x_scale * w_scale`` (float64) and the float bias is added, as integer backends do for
    dynamic quantization: the output stays float, so the bias need not be quantized.

    Args:
        x_q: int8/uint8 input, features last.
        x_scale: the input's scale (a one-element tensor from ``choose_qparams``, or a float).
        x_zero_point: the input's zero_point (likewise).
        w_q: int8 weight ``(out_features, in_features)``.
        w_scale: the weight's scale, a float or one per output feature.
        w_zero_point: the weight's zero_point, an int or one per output feature.
        bias: float bias ``(out_features,)``, or None.
        out_dtype: the output's float dtype.

    Returns:
        The float output ``(..., out_features)``.

    Example:
        >>> x_q = torch.tensor([[10, 2]], dtype=torch.int8)
        >>> w_q = torch.tensor([[3, 5]], dtype=torch.int8)
        >>> dynamic_quantized_linear(x_q, 0.5, 2, w_q, 0.25, 0, torch.tensor([1.0]))
        tensor([[4.]])
    """
    x = shift(x_q, torch.as_tensor(x_zero_point), "x_q")
    w = shift(w_q, per_channel(w_zero_point, 1, torch.int64), "w_q")
    acc = exact_linear(x, w).to(torch.float64)
    scale = torch.as_tensor(x_scale, dtype=torch.float64) * per_channel(w_scale, 0, torch.float64)
    y = acc * scale
    if bias is not None:
        y = y + bias.to(torch.float64)
    return y.to(out_dtype)


# --------------------------------------------------------------------------------------------
# quantize / dequantize, written out.
# --------------------------------------------------------------------------------------------


def _float_input(x: Tensor, name: str) -> Tensor:
    """The float32 input of a quantize (half precision widened, as the op does)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.to(torch.float32)
    if x.dtype != torch.float32:
        raise QuantizationError(
            f"{name} quantizes float32 (or half precision) tensors, got {x.dtype}; quantize "
            f"the float output of the layer before"
        )
    return x


def _integer_input(q: Tensor, dtype: torch.dtype, name: str) -> Tensor:
    if q.dtype != dtype:
        raise QuantizationError(
            f"{name} was told the input is {dtype}, got {q.dtype}; pass the integer tensor that "
            f"the matching quantize returned"
        )
    return q


def reference_quantize_per_tensor(
    x: Tensor,
    scale: Scale,
    zero_point: ZeroPoint,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> Tensor:
    """``clamp(round(x * (1 / scale)) + zero_point, quant_min, quant_max)`` cast to ``dtype``.

    The same operations as ``quantized_decomposed.quantize_per_tensor``: the reciprocal in
    float64, rounded to float32, then one float32 multiply, round half to even. (torchao's
    reference divides by ``scale`` instead, which can round the other way on a tie.)

    Args:
        x: float input.
        scale: the scale, a float or a one-element tensor (dynamic quantization).
        zero_point: the zero_point, an int or a one-element tensor.
        quant_min: the smallest integer.
        quant_max: the largest integer.
        dtype: the integer dtype.

    Returns:
        The integers, of ``dtype``.

    Example:
        >>> reference_quantize_per_tensor(torch.tensor([0.26, -9.0]), 0.1, 3, -128, 127, torch.int8)
        tensor([  6, -87], dtype=torch.int8)
    """
    x = _float_input(x, "reference_quantize_per_tensor")
    inv_scale = (1.0 / torch.as_tensor(scale, dtype=torch.float64)).to(torch.float32)
    rounded = torch.round(x * inv_scale) + torch.as_tensor(zero_point)
    return rounded.clamp(quant_min, quant_max).to(dtype)


def reference_dequantize_per_tensor(
    q: Tensor,
    scale: Scale,
    zero_point: ZeroPoint,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    *,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """``(q - zero_point) * scale`` in float32 (the same bits as ``dequantize_per_tensor``).

    Args:
        q: the integers, of ``dtype``.
        scale: the scale, a float or a one-element tensor.
        zero_point: the zero_point, an int or a one-element tensor.
        quant_min: the smallest integer (recorded, not used, as in the op).
        quant_max: the largest integer (likewise).
        dtype: the integers' dtype.
        out_dtype: the float dtype returned (default float32).

    Returns:
        The float values.

    Example:
        >>> q = torch.tensor([6, -87], dtype=torch.int8)
        >>> reference_dequantize_per_tensor(q, 0.5, 3, -128, 127, torch.int8)
        tensor([  1.5000, -45.0000])
    """
    q = _integer_input(q, dtype, "reference_dequantize_per_tensor")
    out_dtype = out_dtype or torch.float32
    compute = torch.promote_types(out_dtype, torch.float32)
    scale_t = torch.as_tensor(scale, dtype=torch.float64).to(compute)
    return ((q.to(compute) - torch.as_tensor(zero_point)) * scale_t).to(out_dtype)


def _along(value: Tensor, axis: int, ndim: int) -> Tensor:
    """A per-channel vector shaped to broadcast along ``axis`` of an ``ndim``-dim tensor."""
    shape = [1] * ndim
    shape[axis] = -1
    return value.reshape(shape)


def reference_quantize_per_channel(
    x: Tensor,
    scales: Tensor,
    zero_points: Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> Tensor:
    """``clamp(round(x * (1 / scales)) + zero_points)`` along ``axis``, cast to ``dtype``.

    The same operations as ``quantized_decomposed.quantize_per_channel`` (the reciprocal taken
    in the scales' dtype), so the same bits.

    Args:
        x: float input.
        scales: one scale per channel of ``axis``.
        zero_points: one zero_point per channel.
        axis: the channel axis.
        quant_min: the smallest integer.
        quant_max: the largest integer.
        dtype: the integer dtype.

    Returns:
        The integers, of ``dtype``.

    Example:
        >>> x = torch.tensor([[0.5, 1.0], [0.5, 1.0]])
        >>> reference_quantize_per_channel(x, torch.tensor([0.5, 0.25]), torch.zeros(2), 0,
        ...                                -128, 127, torch.int8)
        tensor([[1, 2],
                [2, 4]], dtype=torch.int8)
    """
    x = _float_input(x, "reference_quantize_per_channel")
    axis = axis % x.dim()
    inv_scales = _along(1.0 / scales, axis, x.dim())
    rounded = torch.round(x * inv_scales) + _along(zero_points, axis, x.dim())
    return rounded.clamp(quant_min, quant_max).to(dtype)


def reference_dequantize_per_channel(
    q: Tensor,
    scales: Tensor,
    zero_points: Tensor | None,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    *,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """``(q - zero_points) * scales`` along ``axis`` (the same bits as
    ``dequantize_per_channel``).

    Args:
        q: the integers, of ``dtype``.
        scales: one scale per channel of ``axis``.
        zero_points: one zero_point per channel, or None (zero).
        axis: the channel axis.
        quant_min: the smallest integer (recorded, not used, as in the op).
        quant_max: the largest integer (likewise).
        dtype: the integers' dtype.
        out_dtype: the float dtype returned (default float32).

    Returns:
        The float values.

    Example:
        >>> q = torch.tensor([[2, 4], [2, 4]], dtype=torch.int8)
        >>> reference_dequantize_per_channel(q, torch.tensor([0.5, 0.25]), None, 0,
        ...                                  -128, 127, torch.int8)
        tensor([[1.0000, 2.0000],
                [0.5000, 1.0000]])
    """
    q = _integer_input(q, dtype, "reference_dequantize_per_channel")
    axis = axis % q.dim()
    shifted = q if zero_points is None else q - _along(zero_points, axis, q.dim())
    return (shifted * _along(scales, axis, q.dim())).to(out_dtype or torch.float32)
