"""Min/max observers: the running (or moving-average) range, per tensor or per channel.

* :class:`MinMaxObserver` keeps ``min(x)`` and ``max(x)`` over all batches;
* :class:`MovingAverageMinMaxObserver` starts from the first batch's range and then moves it
  towards each new batch's: ``min_val += averaging_constant * (min(x) - min_val)``;
* :class:`PerChannelMinMaxObserver` and :class:`MovingAveragePerChannelMinMaxObserver` do the
  same for each slice along ``ch_axis`` (one range per output channel of a weight).

All of them turn the range into qparams with the shared formula of
:class:`~qviz.engine.observers.uniform.UniformQuantizationObserverBase` and agree bit for bit
with torch's observers of the same names given the same batches.

Calibrated on several processes (``qviz.calibrate(..., group=...)``), the running min/max merge
exactly (MIN / MAX: one process's range over all the shards, bit for bit). A moving average
depends on the order of its batches, so no merge can equal one process: the ranks' averages
merge as their batch-count weighted mean (:mod:`qviz.engine.distributed.merge_rules`).

Example:
    >>> import torch
    >>> obs = MovingAverageMinMaxObserver(averaging_constant=0.5, dtype=torch.int8)
    >>> for x in (torch.tensor([-1.0, 1.0]), torch.tensor([-3.0, 3.0])):
    ...     _ = obs(x)
    >>> float(obs.min_val), float(obs.max_val)
    (-2.0, 2.0)
    >>> obs
    MovingAverageMinMaxObserver(int8 per_tensor_affine [-128, 127] batches=2 min=-2 max=2)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from qviz.engine.observers.base import check_int
from qviz.engine.observers.uniform import (
    PER_CHANNEL_QSCHEMES,
    UniformQuantizationObserverBase,
)
from qviz.errors import CalibrationError, ConfigError

_EPS32 = torch.finfo(torch.float32).eps


def check_averaging_constant(owner: str, value: Any, is_dynamic: bool) -> float:
    """``value`` as a float in (0, 1]; dynamic observers need exactly 1 (latest batch only)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigError(f"{owner}: averaging_constant must be in (0, 1], got {value!r}")
    if is_dynamic and value != 1:
        raise ConfigError(
            f"{owner}: is_dynamic=True needs averaging_constant=1 (qparams from each batch "
            f"alone), got {value!r}"
        )
    return float(value)


class MinMaxObserver(UniformQuantizationObserverBase):
    """qparams from the running minimum and maximum of every observed tensor.

    Args:
        dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic: see
            :class:`~qviz.engine.observers.uniform.UniformQuantizationObserverBase`; ``qscheme``
            is ``torch.per_tensor_affine`` (default) or ``torch.per_tensor_symmetric``.

    Example:
        >>> import torch
        >>> obs = MinMaxObserver(dtype=torch.int8, qscheme=torch.per_tensor_symmetric)
        >>> _ = obs(torch.tensor([-2.54, 1.0]))
        >>> obs.calculate_qparams()
        (tensor([0.0199]), tensor([0]))
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.quint8,
        qscheme: torch.qscheme | None = torch.per_tensor_affine,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: dict[str, Any] | None = None,
        eps: float = _EPS32,
        is_dynamic: bool = False,
    ) -> None:
        super().__init__(
            dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic
        )
        self.register_buffer("min_val", torch.tensor(float("inf"), device=self._device))
        self.register_buffer("max_val", torch.tensor(float("-inf"), device=self._device))

    @torch.no_grad()
    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Fold the range of ``x_orig`` into the statistics; return ``x_orig`` unchanged."""
        x = self._input(x_orig)
        if x is not None:
            self._track_range(x)
        return x_orig

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)`` of the observed range, each of shape ``(1,)``.

        Raises:
            CalibrationError: nothing was observed yet.
        """
        if not self._has_range():
            raise self._no_data_error()
        return self._calculate_qparams(self.min_val, self.max_val)


class MovingAverageMinMaxObserver(MinMaxObserver):
    """qparams from a moving average of each batch's minimum and maximum.

    The first batch sets the range; each later batch moves it by ``averaging_constant`` of the
    way towards its own: ``min_val = min_val + c * (min(x) - min_val)`` (float32, as torch).

    Args:
        averaging_constant: weight ``c`` of the newest batch, in (0, 1]; 1 keeps only the latest
            batch (what dynamic quantization uses).
        dtype, qscheme, reduce_range, quant_min, quant_max, eps, is_dynamic, factory_kwargs: as
            :class:`MinMaxObserver`.

    Example:
        >>> import torch
        >>> obs = MovingAverageMinMaxObserver(averaging_constant=1, is_dynamic=True)
        >>> _ = obs(torch.tensor([0.0, 4.0])); _ = obs(torch.tensor([0.0, 1.0]))
        >>> float(obs.max_val)
        1.0
    """

    def __init__(
        self,
        averaging_constant: float = 0.01,
        dtype: torch.dtype = torch.quint8,
        qscheme: torch.qscheme | None = torch.per_tensor_affine,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = _EPS32,
        is_dynamic: bool = False,
        factory_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic
        )
        self.averaging_constant = check_averaging_constant(
            type(self).__name__, averaging_constant, self.is_dynamic
        )

    def _fold(self, low: torch.Tensor, high: torch.Tensor) -> None:
        if not self._has_range():
            self.min_val.copy_(low)
            self.max_val.copy_(high)
            return
        c = self.averaging_constant
        self.min_val.copy_(self.min_val + c * (low - self.min_val))
        self.max_val.copy_(self.max_val + c * (high - self.max_val))


class PerChannelMinMaxObserver(UniformQuantizationObserverBase):
    """qparams per slice along ``ch_axis`` from each slice's running minimum and maximum.

    Args:
        ch_axis: the channel axis (0 for conv/linear weights); negative counts from the end.
        dtype, reduce_range, quant_min, quant_max, factory_kwargs, eps: as
            :class:`MinMaxObserver`.
        qscheme: ``torch.per_channel_affine`` (default), ``torch.per_channel_symmetric`` or
            ``torch.per_channel_affine_float_qparams`` (float zero_point, for embeddings).
        is_dynamic: must be False (per-channel qparams are static).

    Example:
        >>> import torch
        >>> obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.int8,
        ...                                qscheme=torch.per_channel_symmetric)
        >>> _ = obs(torch.tensor([[-1.27, 0.5], [0.2, 2.54]]))
        >>> obs.calculate_qparams()
        (tensor([0.0100, 0.0199]), tensor([0, 0]))
    """

    _QSCHEMES = PER_CHANNEL_QSCHEMES

    def __init__(
        self,
        ch_axis: int = 0,
        dtype: torch.dtype = torch.quint8,
        qscheme: torch.qscheme | None = torch.per_channel_affine,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: dict[str, Any] | None = None,
        eps: float = _EPS32,
        is_dynamic: bool = False,
    ) -> None:
        super().__init__(
            dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic
        )
        if self.is_dynamic:
            raise ConfigError(
                f"{type(self).__name__} does not support dynamic quantization (is_dynamic=True); "
                f"use a per-tensor observer such as MovingAverageMinMaxObserver"
            )
        self.ch_axis = check_int(type(self).__name__, "ch_axis", ch_axis)
        self.register_buffer("min_val", torch.tensor([], device=self._device))
        self.register_buffer("max_val", torch.tensor([], device=self._device))

    @torch.no_grad()
    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Fold the per-channel ranges of ``x_orig`` in; return ``x_orig`` unchanged."""
        x = self._input(x_orig)
        if x is not None:
            low, high = self._channel_extremes(x)
            if self.min_val.numel() and self.min_val.shape != low.shape:
                raise CalibrationError(
                    f"{self._label()} first saw {self.min_val.numel()} channels along "
                    f"ch_axis={self.ch_axis} and now a tensor of shape {tuple(x.shape)}: "
                    f"per-channel observers need the same channel count; call reset() between "
                    f"different tensors"
                )
            self._follow(low.device)
            self._fold(low, high)
            self._count(x)
        return x_orig

    def _channel_extremes(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel (min, max) in float32.

        torch swaps ch_axis to the front, copies, and reduces rows with ``aminmax(dim=1)``;
        reducing a ``(before, C, after)`` view over dims 0 and 2 gives the same values (a min is
        exact in any order; at most the sign of a zero may differ) about 15x faster on
        activations.
        """
        dims = max(x.dim(), 1)
        if not -dims <= self.ch_axis < dims:
            raise ConfigError(
                f"{self._label()} has ch_axis={self.ch_axis} but got a tensor of shape "
                f"{tuple(x.shape)}: choose ch_axis in range(-{dims}, {dims})"
            )
        y = x if x.dtype == torch.float32 else x.to(torch.float32)
        axis = self.ch_axis % dims
        shape = y.shape if y.dim() else (1,)
        view = y.reshape(math.prod(shape[:axis]), shape[axis], -1)
        low, high = torch.amin(view, dim=(0, 2)), torch.amax(view, dim=(0, 2))
        self._check_finite(y, low, high)
        return low, high

    def _fold(self, low: torch.Tensor, high: torch.Tensor) -> None:
        if self.min_val.numel():
            low, high = torch.min(low, self.min_val), torch.max(high, self.max_val)
        self._store(low, high)

    def _store(self, low: torch.Tensor, high: torch.Tensor) -> None:
        self.min_val.resize_(low.shape).copy_(low)
        self.max_val.resize_(high.shape).copy_(high)

    def _reset_statistics(self) -> None:
        self.min_val.resize_(0)
        self.max_val.resize_(0)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # Saved ranges have C channels; the fresh buffers are empty until data is seen.
        for name in ("min_val", "max_val"):
            saved = state_dict.get(prefix + name)
            if isinstance(saved, torch.Tensor):
                getattr(self, name).resize_(saved.shape)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)`` per channel, each of shape ``(C,)``.

        Raises:
            CalibrationError: nothing was observed yet.
        """
        if not self.min_val.numel():
            raise self._no_data_error()
        return self._calculate_qparams(self.min_val, self.max_val)

    def extra_repr(self) -> str:
        channels = f" channels={self.min_val.numel()}" if self.min_val.numel() else ""
        return f"{self._config_repr()} ch_axis={self.ch_axis}{channels} {self._range_repr()}"


class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """Per-channel moving-average ranges (see :class:`MovingAverageMinMaxObserver`).

    Args:
        averaging_constant: weight of the newest batch, in (0, 1].

    The other arguments (``ch_axis``, ``dtype``, ``qscheme``, ``reduce_range``, ``quant_min``,
    ``quant_max``, ``eps``, ``is_dynamic``, ``factory_kwargs``) are those of
    :class:`PerChannelMinMaxObserver`.

    Example:
        >>> import torch
        >>> obs = MovingAveragePerChannelMinMaxObserver(averaging_constant=0.5, ch_axis=1)
        >>> _ = obs(torch.tensor([[0.0, 2.0]])); _ = obs(torch.tensor([[4.0, 2.0]]))
        >>> obs.max_val
        tensor([2., 2.])
    """

    def __init__(
        self,
        averaging_constant: float = 0.01,
        ch_axis: int = 0,
        dtype: torch.dtype = torch.quint8,
        qscheme: torch.qscheme | None = torch.per_channel_affine,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        eps: float = _EPS32,
        is_dynamic: bool = False,
        factory_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            ch_axis, dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps,
            is_dynamic,
        )  # fmt: skip
        self.averaging_constant = check_averaging_constant(
            type(self).__name__, averaging_constant, self.is_dynamic
        )

    def _fold(self, low: torch.Tensor, high: torch.Tensor) -> None:
        if self.min_val.numel():
            c = self.averaging_constant
            low = self.min_val + c * (low - self.min_val)
            high = self.max_val + c * (high - self.max_val)
        self._store(low, high)
