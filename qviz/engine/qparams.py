"""Pure quantization arithmetic: integer ranges and amax-to-scale conversion.

Two scale conventions meet in qviz and this module is where they are reconciled:

* the tensor-level toolkit (``tensor_quant``) follows NVIDIA's pytorch-quantization and returns
  the *multiplier* ``quant_max / amax`` (``x_int = round(x * multiplier)``);
* PyTorch's quantization (observers, ``quantize_per_tensor``, PT2E) uses the *step size*
  ``scale = amax / quant_max`` (``x_int = round(x / scale) + zero_point``).

For symmetric quantization the two are reciprocals, and :func:`symmetric_scale` gives the PyTorch
one.

Example:
    >>> quant_range(8)
    (-128, 127)
    >>> quant_range(8, narrow_range=True)
    (-127, 127)
    >>> quant_range(4, unsigned=True)
    (0, 15)
    >>> round(symmetric_scale(0.9921, num_bits=8), 6)
    0.007812
    >>> bits_of_range(-127, 127)
    8
    >>> scale, zero_point = affine_qparams(-1.0, 3.0, -128, 127)
    >>> round(scale, 6), zero_point
    (0.015686, -64)
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch

from qviz.errors import ConfigError

__all__ = [
    "DTYPE_RANGES",
    "FLOAT32_EPS",
    "MAX_NUM_BITS",
    "QParams",
    "affine_qparams",
    "bits_of_range",
    "clip_limits",
    "quant_range",
    "symmetric_scale",
    "validate_num_bits",
]

#: The widest integer grid the float32 arithmetic of fake quantization represents exactly.
MAX_NUM_BITS = 16

#: The smallest scale PyTorch's observers allow by default (``torch.finfo(torch.float32).eps``).
FLOAT32_EPS: float = torch.finfo(torch.float32).eps

#: Full integer range of each quantized storage dtype, as PyTorch's observers use them.
DTYPE_RANGES: dict[torch.dtype, tuple[int, int]] = {
    torch.int8: (-128, 127),
    torch.uint8: (0, 255),
    torch.int16: (-(2**15), 2**15 - 1),
    torch.int32: (-(2**31), 2**31 - 1),
}


def validate_num_bits(num_bits: int, *, unsigned: bool = False) -> int:
    """Return ``num_bits`` if it is a usable bit width, else raise ConfigError naming the limits.

    Example:
        >>> validate_num_bits(8)
        8
    """
    if isinstance(num_bits, bool) or not isinstance(num_bits, int):
        raise ConfigError(f"num_bits must be an int, got {num_bits!r} ({type(num_bits).__name__})")
    low = 1 if unsigned else 2
    if not low <= num_bits <= MAX_NUM_BITS:
        kind = "unsigned" if unsigned else "signed"
        raise ConfigError(
            f"num_bits={num_bits} is out of range for {kind} quantization: "
            f"use {low}..{MAX_NUM_BITS}"
        )
    return num_bits


def quant_range(
    num_bits: int, *, unsigned: bool = False, narrow_range: bool = False
) -> tuple[int, int]:
    """Integer range ``(quant_min, quant_max)`` of a ``num_bits`` grid.

    Signed grids are ``[-2^(b-1), 2^(b-1) - 1]``, or symmetric ``[-(2^(b-1) - 1), 2^(b-1) - 1]``
    with ``narrow_range``; unsigned grids are ``[0, 2^b - 1]`` (``narrow_range`` does not apply).

    Example:
        >>> quant_range(8, unsigned=True)
        (0, 255)
    """
    validate_num_bits(num_bits, unsigned=unsigned)
    if unsigned:
        return 0, 2**num_bits - 1
    quant_max = 2 ** (num_bits - 1) - 1
    return (-quant_max if narrow_range else -quant_max - 1), quant_max


def bits_of_range(quant_min: int, quant_max: int) -> int:
    """Bit width of the smallest integer container that holds ``[quant_min, quant_max]``.

    Defined as ``(quant_max - quant_min).bit_length()``: the number of bits needed to count the
    range's ``quant_max - quant_min`` steps. It is the inverse of :func:`quant_range`:
    ``bits_of_range(*quant_range(b, unsigned=u, narrow_range=n)) == b`` for every valid
    combination, so a narrow (symmetric) range is still held in a ``b``-bit container:
    ``[-127, 127]`` is 8 bits, like ``[-128, 127]`` and ``[0, 255]``. It equals
    ``ceil(log2(quant_max - quant_min + 1))`` (the bits to number every level) computed exactly on
    integers. A single-level range ``[q, q]`` has 0 bits.

    Args:
        quant_min, quant_max: the integer range; anything ``operator.index`` accepts (Python or
            NumPy ints, integer 0-dim tensors), but not bools.

    Raises:
        ConfigError: a bound is not an integer, or ``quant_min > quant_max``.

    Example:
        >>> bits_of_range(-128, 127), bits_of_range(0, 255), bits_of_range(-127, 127)
        (8, 8, 8)
        >>> bits_of_range(0, 15), bits_of_range(-8, 7)
        (4, 4)
    """
    low = _as_int("quant_min", quant_min)
    high = _as_int("quant_max", quant_max)
    if low > high:
        raise ConfigError(f"quant_min {low} must be <= quant_max {high}")
    return (high - low).bit_length()


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(
            f"{name} must be an int, got {value!r} ({type(value).__name__})"
        ) from None


def affine_qparams(
    low: float, high: float, quant_min: int, quant_max: int, *, eps: float = FLOAT32_EPS
) -> tuple[float, int]:
    """``(scale, zero_point)`` of the affine grid ``[quant_min, quant_max]`` over ``[low, high]``.

    PyTorch's affine formula, on Python floats (float64):

    * the range always includes zero: ``low = min(low, 0)``, ``high = max(high, 0)``;
    * ``scale = max((high - low) / (quant_max - quant_min), eps)``;
    * ``zero_point = clamp(quant_min - round(low / scale), quant_min, quant_max)``.

    A degenerate range (``[0, 0]`` once zero is included) gets ``scale = eps`` and
    ``zero_point = quant_min``, as PyTorch's observers give it. The observers themselves compute
    the same formula on float32 tensors (``qviz.engine.observers.uniform``): their scale is a
    float32 number, generally not bit-identical to this float64 one (on float64 statistics they
    agree bit for bit). Use this function for qparams derived from Python numbers (a prescribed
    range, a report), not to reproduce an observer.

    Args:
        low, high: the float range to cover (finite).
        quant_min, quant_max: the integer grid, ``quant_min < quant_max``.
        eps: smallest scale (>= 0); the default is PyTorch's observer default. With ``eps=0.0``
            the formula is used as is, and a degenerate range raises.

    Raises:
        ConfigError: a non-finite bound, an empty grid, a negative eps, or a zero scale.

    Example:
        >>> scale, zero_point = affine_qparams(-1.0, 3.0, -128, 127)  # 4 / 255
        >>> round(scale, 6), zero_point
        (0.015686, -64)
        >>> affine_qparams(0.5, 2.0, 0, 255)  # zero included: [0, 2]
        (0.00784313725490196, 0)
        >>> affine_qparams(0.0, 0.0, -128, 127) == (FLOAT32_EPS, -128)
        True
    """
    qmin = _as_int("quant_min", quant_min)
    qmax = _as_int("quant_max", quant_max)
    if not qmin < qmax:
        raise ConfigError(f"quant_min {qmin} must be < quant_max {qmax}")
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ConfigError(f"the range [{low}, {high}] must be finite to give affine qparams")
    if not eps >= 0:
        raise ConfigError(f"eps={eps!r} must be >= 0")
    low, high = min(low, 0.0), max(high, 0.0)
    scale = max((high - low) / (qmax - qmin), eps)
    if scale == 0:
        raise ConfigError(
            f"the range [{low}, {high}] is degenerate and eps=0 gives a zero scale; pass eps > 0"
        )
    zero_point = int(min(max(qmin - round(low / scale), qmin), qmax))
    return scale, zero_point


def symmetric_scale(amax: float | torch.Tensor, *, num_bits: int = 8, unsigned: bool = False):
    """PyTorch-convention scale (step size) of a symmetric grid whose largest level is ``amax``.

    ``scale = amax / quant_max``; the reciprocal of the multiplier ``tensor_quant`` returns.
    Works element-wise on tensors (per-channel amax).

    Example:
        >>> symmetric_scale(127.0)
        1.0
    """
    _, quant_max = quant_range(num_bits, unsigned=unsigned)
    return amax / quant_max


def clip_limits(
    scale: float | torch.Tensor,
    zero_point: int | torch.Tensor,
    quant_min: int,
    quant_max: int,
) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    """The values beyond which quantizing ``x`` clips it: ``(low, high)``, half a step past the
    grid's end levels ``scale * (quant_min - zero_point)`` and ``scale * (quant_max - zero_point)``.

    This is qviz's one definition of *clipped*: a value ``x < low`` or ``x > high`` lies beyond
    the rounding boundary of the last level, so clamping, not rounding, sets its error (larger
    than half a step). Values between the end level and the boundary round to the end level like
    any other value and are not clipped. Every "clipped" number qviz shows (the numeric report,
    the calibration tables, the histogram rows, the explorer) uses these limits. Per-channel
    ``scale`` / ``zero_point`` tensors give per-channel limits.

    Example:
        >>> [round(v, 6) for v in clip_limits(0.1, 0, -128, 127)]  # levels -12.8 .. 12.7
        [-12.85, 12.75]
    """
    half = scale / 2
    return scale * (quant_min - zero_point) - half, scale * (quant_max - zero_point) + half


@dataclass(frozen=True)
class QParams:
    """Quantization parameters after convert: one value per tensor, or per channel (tuples).

    Zero points are integers, except for ``per_channel_affine_float_qparams`` (embedding
    tables), whose zero points are floats.
    """

    scale: float | tuple[float, ...]
    zero_point: int | tuple[int, ...] | tuple[float, ...]
