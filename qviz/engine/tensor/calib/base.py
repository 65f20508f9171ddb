"""The calibrator protocol shared by every calibrator, and the method names.

A calibrator watches tensors go by (``collect``), forgets them (``reset``) and turns what it saw
into a clipping threshold ``amax`` (``compute_amax``). ``axis`` follows NVIDIA's convention: the
axes listed KEEP their own amax (``axis=0`` on a conv weight gives one amax per output channel,
shaped ``(C, 1, 1, 1)`` so it broadcasts), every other axis is reduced.

Example:
    >>> CalibMethod.parse("entropy")
    <CalibMethod.ENTROPY: 'entropy'>
    >>> CalibMethod.parse("kl")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    qviz.errors.ConfigError: unknown calibration method 'kl': use one of 'max', 'percentile', ...
"""

from __future__ import annotations

import abc
import math
import warnings
from enum import StrEnum

import torch

from qviz.engine.qparams import validate_num_bits
from qviz.errors import CalibrationError, ConfigError


class CalibMethod(StrEnum):
    """How an amax is picked from calibration statistics."""

    MAX = "max"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"
    MSE = "mse"

    @classmethod
    def parse(cls, value: CalibMethod | str) -> CalibMethod:
        """Accept the Enum or its string value; reject anything else listing the valid names."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for member in cls:
                if member.value == value.lower():
                    return member
        valid = ", ".join(repr(m.value) for m in cls)
        raise ConfigError(f"unknown calibration method {value!r}: use one of {valid}")


def normalize_axis(axis: int | tuple[int, ...] | list[int] | None) -> tuple[int, ...] | None:
    """A calibrator's ``axis`` argument as a tuple of distinct ints (None: per tensor).

    Example:
        >>> normalize_axis(0), normalize_axis([0, 2]), normalize_axis(None)
        ((0,), (0, 2), None)
    """
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, int) and not isinstance(axis, bool) else axis
    if not isinstance(axes, tuple | list) or not all(
        isinstance(a, int) and not isinstance(a, bool) for a in axes
    ):
        raise ConfigError(f"axis must be None, an int or a tuple of ints, got {axis!r}")
    if len(set(axes)) != len(axes):
        raise ConfigError(f"axis {axis!r} names an axis twice")
    return tuple(axes)


class Calibrator(abc.ABC):
    """Base of every calibrator: argument checks, input validation and bookkeeping.

    Args:
        num_bits: bit width the amax is chosen for.
        axis: axes that keep their own amax (None: one amax for the whole tensor).
        unsigned: the quantized grid is unsigned; negative inputs are then an error.
        name: what error messages call the tensor (a TensorQuantizer passes its own name).
        skip_nonfinite: skip tensors holding NaN or Inf with a warning instead of raising.
    """

    def __init__(
        self,
        num_bits: int = 8,
        axis: int | tuple[int, ...] | None = None,
        unsigned: bool = False,
        *,
        name: str | None = None,
        skip_nonfinite: bool = False,
    ) -> None:
        self._num_bits = validate_num_bits(num_bits, unsigned=unsigned)
        self._axis = normalize_axis(axis)
        self._unsigned = bool(unsigned)
        self.name = name
        self.skip_nonfinite = bool(skip_nonfinite)
        self.reset()

    # -- the protocol ---------------------------------------------------------------------------
    @abc.abstractmethod
    def collect(self, x: torch.Tensor) -> None:
        """Accumulate statistics of ``x``."""

    @abc.abstractmethod
    def compute_amax(self, method: CalibMethod | str = CalibMethod.MAX, **kwargs) -> torch.Tensor:
        """The chosen amax: a 0-dim tensor per-tensor, else shaped to broadcast against inputs."""

    def reset(self) -> None:
        """Forget everything collected."""
        self._keep_shape: tuple[int, ...] | None = None
        self._device: torch.device | None = None
        self.num_batches = 0
        self.num_elements = 0

    # -- shared helpers -------------------------------------------------------------------------
    @property
    def num_bits(self) -> int:
        return self._num_bits

    @property
    def axis(self) -> tuple[int, ...] | None:
        return self._axis

    @property
    def unsigned(self) -> bool:
        return self._unsigned

    def _label(self) -> str:
        return f"calibrator {self.name!r}" if self.name else f"{type(self).__name__}"

    def _channels_first(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        """``x`` detached as float32 ``(C, M)`` with kept axes first, and the amax keep-shape."""
        if not isinstance(x, torch.Tensor):
            raise CalibrationError(f"{self._label()} collects tensors, got {type(x).__name__}")
        x = x.detach()
        if x.numel() == 0:
            raise CalibrationError(f"{self._label()} got an empty tensor of shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise CalibrationError(
                f"{self._label()} got a {x.dtype} tensor; calibrators observe floating-point values"
            )
        if x.dtype != torch.float32 and x.dtype != torch.float64:
            x = x.float()
        if self._axis is None:
            return x.reshape(1, -1), ()
        axes = []
        for a in self._axis:
            if not -x.dim() <= a < x.dim():
                raise ConfigError(
                    f"{self._label()} has axis={self._axis} but got a {x.dim()}-d tensor of shape "
                    f"{tuple(x.shape)}: choose axes in range(-{x.dim()}, {x.dim()})"
                )
            axes.append(a % x.dim())
        keep = tuple(x.shape[d] if d in axes else 1 for d in range(x.dim()))
        moved = x.movedim(axes, list(range(len(axes))))
        return moved.reshape(math.prod(keep), -1), keep

    def _extremes(self, flat: torch.Tensor, x_shape: torch.Size) -> torch.Tensor | None:
        """Per-row amax of ``flat``; None (with a warning) when a non-finite tensor is skipped."""
        if flat.shape[0] == 1:  # a full reduction is parallel; a one-row dim=1 reduction is not
            low, high = (t.reshape(1) for t in torch.aminmax(flat))
        else:
            low, high = torch.aminmax(flat, dim=1)
        if not bool(torch.isfinite(low).all() & torch.isfinite(high).all()):
            n_nan = int(torch.isnan(flat).sum())
            n_inf = int(torch.isinf(flat).sum())
            what = f"{n_nan} NaN and {n_inf} Inf values in a tensor of shape {tuple(x_shape)}"
            if self.skip_nonfinite:
                warnings.warn(f"{self._label()} skipped {what}", RuntimeWarning, stacklevel=3)
                return None
            raise CalibrationError(
                f"{self._label()} got {what}: fix the model or data that produce them, or create "
                f"the calibrator with skip_nonfinite=True to skip such tensors with a warning"
            )
        if self._unsigned and bool((low < 0).any()):
            raise CalibrationError(
                f"{self._label()} is unsigned but got negative values "
                f"(min {float(low.min()):.6g}): "
                f"use unsigned=False, or observe a non-negative tensor (e.g. after ReLU)"
            )
        return torch.maximum(high, -low)

    def _bind(self, keep: tuple[int, ...], device: torch.device) -> torch.device:
        """Fix the amax shape on the first collect and check later ones; return the state device."""
        if self._keep_shape is None:
            self._keep_shape = keep
            self._device = device
        elif keep != self._keep_shape:
            raise CalibrationError(
                f"{self._label()} first saw tensors whose amax shape is {self._keep_shape} and now "
                f"{keep}: per-channel calibration needs the same channel count every time; "
                f"call reset() between different tensors"
            )
        return self._device

    def _require_data(self) -> None:
        if self.num_batches == 0:
            raise CalibrationError(
                f"{self._label()} has collected no data: run calibration batches through the model "
                f"(TensorQuantizer.enable_calib()) before computing amax"
            )

    def _shape_amax(self, amax: torch.Tensor) -> torch.Tensor:
        amax = amax.to(self._device, torch.float32)
        return amax.reshape(self._keep_shape) if self._keep_shape else amax.reshape(())

    def __repr__(self) -> str:
        axis = f" axis={self._axis}" if self._axis is not None else ""
        sign = "unsigned " if self._unsigned else ""
        return (
            f"{type(self).__name__}({sign}{self._num_bits}bit{axis}, "
            f"batches={self.num_batches}, elements={self.num_elements})"
        )
