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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qviz.errors import ConfigError

__all__ = [
    "DTYPE_RANGES",
    "MAX_NUM_BITS",
    "QParams",
    "clip_limits",
    "quant_range",
    "symmetric_scale",
    "validate_num_bits",
]

#: The widest integer grid the float32 arithmetic of fake quantization represents exactly.
MAX_NUM_BITS = 16

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
