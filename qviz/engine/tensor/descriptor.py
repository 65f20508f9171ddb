"""QuantDescriptor: how a tensor is quantized, as one frozen, validated record.

The predefined descriptors match NVIDIA's toolkit: per-tensor 8-bit for activations, and one amax
per output channel (``axis=0``) for conv and linear weights.

Example:
    >>> QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL
    QuantDescriptor(axis=(0,))
    >>> QuantDescriptor(num_bits=4, unsigned=True).dict()
    {'num_bits': 4, 'unsigned': True}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from qviz.engine.qparams import validate_num_bits
from qviz.engine.tensor.calib.base import CalibMethod, normalize_axis
from qviz.errors import ConfigError


def check_amax(amax: object, where: str, fix: str) -> torch.Tensor:
    """``amax`` as a detached float32 copy, refused unless every value is finite and >= 0.

    The one check of amax values: a descriptor's ``amax=``, the ``TensorQuantizer.amax``
    setter, ``load_calib_amax`` and ``load_state_dict`` all call it, so a NaN or negative amax
    is refused where it is set, naming ``where`` and ``fix``, not at the first forward.

    Args:
        amax: a number, a sequence or a tensor.
        where: what the message names (``"TensorQuantizer 'conv1._weight_quantizer'"``).
        fix: what the message tells the user to do.

    Raises:
        ConfigError: ``amax`` is not numeric, or holds NaN, Inf or a negative value.

    Example:
        >>> check_amax([0.5, 2], "QuantDescriptor", "pass amax >= 0")
        tensor([0.5000, 2.0000])
        >>> check_amax([1.0, -1.0], "QuantDescriptor", "pass amax >= 0")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: QuantDescriptor: amax must be finite and >= 0, got [-1.0] among ...
    """
    try:
        value = torch.as_tensor(amax, dtype=torch.float32).detach().clone()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            f"{where}: amax must be a number, a sequence or a tensor, got {amax!r:.80}; {fix}"
        ) from exc
    bad = ~torch.isfinite(value) | (value < 0)
    if bool(bad.any()):
        raise ConfigError(
            f"{where}: amax must be finite and >= 0, got {value[bad].flatten()[:8].tolist()}"
            f"{f' among {value.numel()} values' if value.numel() > 1 else ''}; {fix}"
        )
    return value


def _amax_tensor(amax) -> torch.Tensor | None:
    if amax is None:
        return None
    return check_amax(amax, "QuantDescriptor", "pass a finite amax >= 0, or None to calibrate")


@dataclass(frozen=True, eq=False)
class QuantDescriptor:
    """How a tensor is quantized: bit width, granularity, range and calibration method.

    Args:
        num_bits: bit width (2..16 signed, 1..16 unsigned).
        name: a label carried into the quantizer's repr and error messages.
        fake_quant: return fake-quantized floats (True) or the integer values (False).
        axis: axes that KEEP their own amax (per-channel); None for one amax per tensor.
            ``axis=0`` on a conv weight ``(out, in, kh, kw)`` gives one amax per output channel.
        amax: a fixed amax (number or per-channel values); None to calibrate or compute it on
            the fly.
        scale_amax: multiply the amax by this factor before quantizing (experiments).
        calib_method: ``"max"`` (MaxCalibrator) or ``"percentile"``, ``"entropy"``, ``"mse"``
            (HistogramCalibrator, and the method ``load_calib_amax`` uses by default);
            ``"histogram"`` selects a HistogramCalibrator with no default method.
        unsigned: quantize to ``[0, 2^b - 1]``.
        narrow_range: signed grid without ``-2^(b-1)`` (as the toolkit's descriptors, off by
            default here; ``tensor_quant`` itself defaults to it on).
        num_bins: histogram bins for the histogram-based methods.
        skip_nonfinite: calibrators skip NaN/Inf tensors with a warning instead of raising.

    Example:
        >>> QuantDescriptor(num_bits=4, axis=0, calib_method="entropy")
        QuantDescriptor(num_bits=4, axis=(0,), calib_method='entropy')
    """

    num_bits: int = 8
    name: str | None = None
    fake_quant: bool = True
    axis: int | tuple[int, ...] | None = None
    amax: float | tuple | torch.Tensor | None = field(default=None, repr=False)
    scale_amax: float | None = None
    calib_method: str = "max"
    unsigned: bool = False
    narrow_range: bool = False
    num_bins: int = 2048
    skip_nonfinite: bool = False

    def __post_init__(self) -> None:
        for flag in ("fake_quant", "unsigned", "narrow_range", "skip_nonfinite"):
            value = getattr(self, flag)
            if not isinstance(value, bool):
                raise ConfigError(
                    f"QuantDescriptor: {flag} must be True or False, got {value!r:.40} "
                    f"({type(value).__name__}): pass a bool, e.g. {flag}=True"
                )
        validate_num_bits(self.num_bits, unsigned=self.unsigned)
        object.__setattr__(self, "axis", normalize_axis(self.axis))
        object.__setattr__(self, "amax", _amax_tensor(self.amax))
        if self.calib_method != "histogram":
            object.__setattr__(self, "calib_method", CalibMethod.parse(self.calib_method).value)
        if self.scale_amax is not None and not (
            isinstance(self.scale_amax, int | float)
            and not isinstance(self.scale_amax, bool)
            and 0 < self.scale_amax < float("inf")
        ):
            raise ConfigError(
                f"scale_amax must be a finite positive number (or None), got {self.scale_amax!r}"
            )
        if (
            isinstance(self.num_bins, bool)
            or not isinstance(self.num_bins, int)
            or self.num_bins < 2
        ):
            raise ConfigError(f"num_bins must be an int >= 2, got {self.num_bins!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise ConfigError(f"name must be a string, got {self.name!r}")

    @property
    def default_method(self) -> CalibMethod | None:
        """The amax method ``load_calib_amax()`` uses when given none (None for "histogram")."""
        return None if self.calib_method == "histogram" else CalibMethod(self.calib_method)

    def dict(self) -> dict:
        """The fields that differ from the defaults (amax as a list), e.g. to save as JSON."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "amax" and value is not None:
                out["amax"] = value.tolist()
            elif f.name != "amax" and value != f.default:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def _key(self) -> tuple:
        amax = (
            None
            if self.amax is None
            else (tuple(self.amax.shape), tuple(self.amax.flatten().tolist()))
        )
        return tuple(
            amax if f.name == "amax" else getattr(self, f.name) for f in dataclasses.fields(self)
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QuantDescriptor):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        parts = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if f.name != "amax" and getattr(self, f.name) != f.default
        ]
        if self.amax is not None:
            parts.append(f"amax={short_amax(self.amax)}")
        return f"QuantDescriptor({', '.join(parts)})"


def short_amax(amax: torch.Tensor | None) -> str:
    """A short, tensor-free description of an amax: "dynamic", one value, or min, max and count.

    Example:
        >>> short_amax(torch.tensor([0.5, 2.0, 1.0]))
        '[0.5000, 2.0000](3)'
    """
    if amax is None:
        return "dynamic"
    if amax.numel() == 1:
        return f"{float(amax):.4f}"
    return f"[{float(amax.min()):.4f}, {float(amax.max()):.4f}]({amax.numel()})"


QUANT_DESC_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8)
QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8, unsigned=True)
QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW = QuantDescriptor(num_bits=8, axis=0)
# ConvTranspose weights are (in, out / groups, k...): their output channels are axis 1
QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=1)
