"""Uniform (affine or symmetric) quantization: the integer range, eps, and min/max -> qparams.

:meth:`UniformQuantizationObserverBase._calculate_qparams` is the one formula every min/max and
histogram observer ends in; it performs the same tensor operations, in the same order and on the
same dtypes, as torch's observers, so its results agree bit for bit:

* the range always includes zero: ``min_neg = min(min_val, 0)``, ``max_pos = max(max_val, 0)``;
* **symmetric**: ``scale = max(-min_neg, max_pos) / ((quant_max - quant_min) / 2)``, at least
  ``eps``; ``zero_point`` is 0 for signed dtypes, 128 for ``uint8`` (the floor of the midpoint
  of a custom range), ``2**15`` for ``uint16``; int64;
* **affine**: ``scale = (max_pos - min_neg) / (quant_max - quant_min)``, at least ``eps``;
  ``zero_point = clamp(quant_min - round(min_neg / scale), quant_min, quant_max)``, int32;
* **per_channel_affine_float_qparams**: ``scale = (max - min) / (quant_max - quant_min)`` (1
  where it is not above eps), float ``zero_point = -min / scale``;
* per-tensor results have shape ``(1,)``, per-channel ones ``(C,)``; scale is float32.

Worked example, int8 affine on the range ``[-1.0, 3.0]``: ``scale = 4 / 255 = 0.015686``,
``zero_point = -128 - round(-1 / 0.015686) = -128 + 64 = -64``.

Example:
    >>> import torch
    >>> from qviz.engine.observers import MinMaxObserver
    >>> obs = MinMaxObserver(dtype=torch.int8)
    >>> _ = obs(torch.tensor([-1.0, 3.0]))
    >>> scale, zero_point = obs.calculate_qparams()
    >>> round(float(scale), 6), zero_point
    (0.015686, tensor([-64], dtype=torch.int32))
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from qviz.engine.observers.base import (
    INTEGER_DTYPE_RANGES,
    ObserverBase,
    check_bool,
    check_int,
    factory_device,
)
from qviz.errors import ConfigError

PER_TENSOR_QSCHEMES = (torch.per_tensor_affine, torch.per_tensor_symmetric)
PER_CHANNEL_QSCHEMES = (
    torch.per_channel_affine,
    torch.per_channel_symmetric,
    torch.per_channel_affine_float_qparams,
)
_SYMMETRIC = (torch.per_tensor_symmetric, torch.per_channel_symmetric)
_UNSIGNED = (torch.uint8, torch.quint8, torch.uint16)
_8BIT = {torch.int8: (-64, 63), torch.qint8: (-64, 63), torch.uint8: (0, 127)}
_8BIT[torch.quint8] = _8BIT[torch.uint8]


def _names(items: Any) -> str:
    return ", ".join(str(i) for i in items)


def default_quant_range(dtype: torch.dtype, reduce_range: bool) -> tuple[int, int]:
    """The range torch's observers use when no custom ``quant_min``/``quant_max`` is given.

    ``reduce_range`` drops one bit of the 8-bit dtypes only (as torch does).

    Example:
        >>> import torch
        >>> default_quant_range(torch.int8, True), default_quant_range(torch.int32, True)
        ((-64, 63), (-2147483648, 2147483647))
    """
    if reduce_range and dtype in _8BIT:
        return _8BIT[dtype]
    return INTEGER_DTYPE_RANGES[dtype]


def resolve_quant_range(
    owner: str, dtype: torch.dtype, quant_min: Any, quant_max: Any, reduce_range: bool = False
) -> tuple[int, int, bool]:
    """``(quant_min, quant_max, customized)`` after validation, with torch's ``reduce_range``.

    A custom range must contain 0, have ``quant_min < quant_max`` and fit ``dtype``; with
    ``reduce_range`` it is halved (floor division), as torch does.

    Example:
        >>> import torch
        >>> resolve_quant_range("obs", torch.int8, -127, 127, reduce_range=True)
        (-64, 63, True)
    """
    if dtype not in INTEGER_DTYPE_RANGES:
        raise ConfigError(
            f"{owner}: dtype {dtype!r} has no integer range; use one of "
            f"{_names(INTEGER_DTYPE_RANGES)}"
        )
    if (quant_min is None) != (quant_max is None):
        raise ConfigError(
            f"{owner}: give both quant_min and quant_max or neither (got quant_min={quant_min!r}, "
            f"quant_max={quant_max!r})"
        )
    if quant_min is None:
        return (*default_quant_range(dtype, reduce_range), False)
    check_int(owner, "quant_min", quant_min)
    check_int(owner, "quant_max", quant_max)
    low, high = INTEGER_DTYPE_RANGES[dtype]
    if not quant_min < quant_max:
        raise ConfigError(f"{owner}: quant_min {quant_min} must be < quant_max {quant_max}")
    if not low <= quant_min <= 0 <= quant_max <= high:
        raise ConfigError(
            f"{owner}: quant_min={quant_min}, quant_max={quant_max} must include 0 and fit "
            f"{dtype} (range {low}..{high}); choose a range inside it, or a wider dtype"
        )
    if reduce_range:
        return quant_min // 2, quant_max // 2, True
    return quant_min, quant_max, True


def check_eps(owner: str, eps: Any) -> float:
    """``eps`` as a float if it is positive, finite and still positive in float32."""
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        raise ConfigError(f"{owner}: eps must be a positive float, got {eps!r}")
    as_f32 = float(torch.tensor(float(eps), dtype=torch.float32))
    if not (0.0 < as_f32 < float("inf")):
        raise ConfigError(
            f"{owner}: eps={eps!r} must be positive, finite and representable in float32 "
            f"(e.g. torch.finfo(torch.float32).eps or 2**-12)"
        )
    return float(eps)


class UniformQuantizationObserverBase(ObserverBase):
    """Base of the observers that compute affine/symmetric qparams from a float range.

    Args:
        dtype: quantized dtype: ``torch.int8``, ``uint8``, ``int16``, ``uint16``, ``int32`` (or
            the legacy ``qint8``, ``quint8``, ``qint32``).
        qscheme: how qparams are computed; which ones are allowed depends on the observer
            (None: the observer's default, affine).
        reduce_range: drop one bit of the range (torch's x86 workaround): ``[-64, 63]`` or
            ``[0, 127]`` for 8-bit dtypes, a custom range halved.
        quant_min, quant_max: custom integer range (both or neither); must contain 0.
        factory_kwargs: ``{"device": ...}`` for the buffers (they also follow the data).
        eps: smallest scale, stored as a float32 buffer.
        is_dynamic: qparams are computed at run time (dynamic quantization).

    Example:
        >>> import torch
        >>> from qviz.engine.observers import MinMaxObserver
        >>> obs = MinMaxObserver(dtype=torch.uint8, reduce_range=True)
        >>> obs.quant_min, obs.quant_max, obs.has_customized_qrange
        (0, 127, False)
    """

    #: torchao's (and torch.ao's) state_dict version of these observers: a checkpoint saved
    #: from qviz then loads into theirs, which read version < 3 as the legacy per-channel
    #: names ``min_vals`` / ``max_vals``.
    _version = 3

    eps: torch.Tensor
    _QSCHEMES: ClassVar[tuple[torch.qscheme, ...]] = PER_TENSOR_QSCHEMES

    def __init__(
        self,
        dtype: torch.dtype = torch.quint8,
        qscheme: torch.qscheme | None = torch.per_tensor_affine,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: dict[str, Any] | None = None,
        eps: float = torch.finfo(torch.float32).eps,
        is_dynamic: bool = False,
    ) -> None:
        super().__init__(dtype=dtype, is_dynamic=is_dynamic)
        owner = type(self).__name__
        if qscheme is None:  # a spec that leaves qscheme out gets the observer's default
            qscheme = self._QSCHEMES[0]
        if qscheme not in self._QSCHEMES:
            hint = ""
            if qscheme in PER_CHANNEL_QSCHEMES:
                hint = " (per-channel qschemes need a PerChannel observer)"
            elif qscheme in PER_TENSOR_QSCHEMES:
                hint = " (per-tensor qschemes need a per-tensor observer)"
            raise ConfigError(
                f"{owner}: qscheme={qscheme!r} is not supported{hint}; use one of "
                f"{_names(self._QSCHEMES)}"
            )
        self.qscheme = qscheme
        self.reduce_range = check_bool(owner, "reduce_range", reduce_range)
        self.quant_min, self.quant_max, self.has_customized_qrange = resolve_quant_range(
            owner, dtype, quant_min, quant_max, self.reduce_range
        )
        if self.reduce_range and qscheme in _SYMMETRIC and dtype in _UNSIGNED:
            raise ConfigError(
                f"{owner}: reduce_range with a symmetric qscheme and unsigned {dtype} would put "
                f"zero_point 128 outside [{self.quant_min}, {self.quant_max}]; use "
                f"quant_min/quant_max instead of reduce_range, or an affine qscheme"
            )
        self._device = factory_device(owner, factory_kwargs)
        eps = check_eps(owner, eps)
        self.register_buffer("eps", torch.tensor([eps], dtype=torch.float32, device=self._device))

    @property
    def is_symmetric(self) -> bool:
        """True for the symmetric qschemes."""
        return self.qscheme in _SYMMETRIC

    def _calculate_qparams(
        self, min_val: torch.Tensor, max_val: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """qparams of the range ``[min_val, max_val]`` (0-dim per tensor, ``(C,)`` per channel)."""
        quant_min, quant_max = self.quant_min, self.quant_max
        if self.qscheme == torch.per_channel_affine_float_qparams:
            scale = (max_val - min_val) / float(quant_max - quant_min)
            scale = torch.where(scale > self.eps, scale, torch.ones_like(scale))
            return scale, -1 * min_val / scale
        min_neg = torch.min(min_val, torch.zeros_like(min_val))
        max_pos = torch.max(max_val, torch.zeros_like(max_val))
        if self.is_symmetric:
            amax = torch.max(-min_neg, max_pos)
            scale = torch.max(amax / (float(quant_max - quant_min) / 2), self.eps)
            return scale, torch.full(scale.shape, self._symmetric_zero_point(), device=scale.device)
        # qparams.affine_qparams is this formula on Python floats (float64); torch computes it on
        # the statistics' float32 tensors, so this keeps its own arithmetic to stay bitwise equal.
        scale = torch.max((max_pos - min_neg) / float(quant_max - quant_min), self.eps)
        zero_point = quant_min - torch.round(min_neg / scale).to(torch.int)
        return scale, torch.clamp(zero_point, quant_min, quant_max)

    def _symmetric_zero_point(self) -> int:
        if self.dtype in (torch.uint8, torch.quint8):
            return (self.quant_min + self.quant_max) // 2 if self.has_customized_qrange else 128
        return 2**15 if self.dtype == torch.uint16 else 0

    def _config_repr(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        qscheme = str(self.qscheme).removeprefix("torch.")
        return f"{dtype} {qscheme} [{self.quant_min}, {self.quant_max}]"

    def extra_repr(self) -> str:
        return f"{self._config_repr()} {self._range_repr()}"
