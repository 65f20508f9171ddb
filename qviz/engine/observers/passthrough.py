"""Observers whose qparams do not come from the data they see: fixed, placeholder, derived.

Their ``forward`` returns the input unchanged and only records the bookkeeping the views show
(``num_batches``, ``num_elements`` and the observed ``min_val``/``max_val``, e.g. to show how much
of a fixed range a sigmoid output really uses); the recorded range never changes their qparams.

* :class:`FixedQParamsObserver`: known ``scale`` and ``zero_point`` (sigmoid, softmax outputs).
* :class:`PlaceholderObserver`: dynamic quantization (qparams computed from each input at run
  time, so ``calculate_qparams`` raises) or a plain cast (e.g. to float16). It carries what a
  converter needs: ``dtype``, ``is_dynamic``, ``quant_min``/``quant_max`` (the dtype's range when
  not given), ``qscheme`` and ``eps``.
* :class:`DerivedQParamsObserver`: qparams computed from other observers by a function, e.g. an
  int32 bias whose scale is ``input_scale * weight_scale``.

Example:
    >>> import torch
    >>> obs = FixedQParamsObserver(scale=1.0 / 256.0, zero_point=0, dtype=torch.uint8)
    >>> _ = obs(torch.sigmoid(torch.tensor([-2.0, 3.0])))
    >>> obs.calculate_qparams()
    (tensor([0.0039]), tensor([0], dtype=torch.int32))
    >>> obs
    FixedQParamsObserver(uint8 per_tensor_affine [0, 255] scale=0.00390625 zero_point=0 \
batches=1 min=0.1192 max=0.9526)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from qviz.engine.observers.base import INTEGER_DTYPE_RANGES, ObserverBase, check_int
from qviz.engine.observers.uniform import (
    PER_CHANNEL_QSCHEMES,
    PER_TENSOR_QSCHEMES,
    check_eps,
    resolve_quant_range,
)
from qviz.errors import CalibrationError, ConfigError

_ALL_QSCHEMES = PER_TENSOR_QSCHEMES + PER_CHANNEL_QSCHEMES


def _short(value: Any) -> str:
    return str(value).removeprefix("torch.")


def _check_qscheme(owner: str, qscheme: Any, allowed: tuple[torch.qscheme, ...]) -> torch.qscheme:
    if qscheme is None:
        return torch.per_tensor_affine
    if qscheme not in allowed:
        valid = ", ".join(str(q) for q in allowed)
        raise ConfigError(f"{owner}: qscheme={qscheme!r} is not supported; use one of {valid}")
    return qscheme


class _RangeRecorder(ObserverBase):
    """Registers the ``min_val``/``max_val`` buffers and records them in ``forward``.

    The range is for the views only (the qparams never read it), so it is not in the
    ``state_dict``: these observers' saved state is torchao's (a fixed observer's scale and
    zero_point, nothing for a derived one), and checkpoints load across."""

    def _register_range(self) -> None:
        self.register_buffer("min_val", torch.tensor(float("inf")), persistent=False)
        self.register_buffer("max_val", torch.tensor(float("-inf")), persistent=False)

    @torch.no_grad()
    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Record the range of ``x_orig`` (for the views) and return it unchanged."""
        x = self._input(x_orig)
        if x is not None:
            self._track_range(x)
        return x_orig

    def _range_text(self) -> str:
        dtype = _short(self.dtype)
        quant_min, quant_max = getattr(self, "quant_min", None), getattr(self, "quant_max", None)
        limits = "" if quant_min is None else f" [{quant_min}, {quant_max}]"
        return f"{dtype} {_short(self.qscheme)}{limits}"


class FixedQParamsObserver(_RangeRecorder):
    """Fixed ``scale`` and ``zero_point``, whatever the data (per tensor).

    Args:
        scale: the step size, > 0.
        zero_point: the integer that represents 0.0, within ``[quant_min, quant_max]``.
        dtype: quantized dtype.
        qscheme: ``torch.per_tensor_affine`` (default) or ``torch.per_tensor_symmetric``.
        quant_min, quant_max: integer range (None: the dtype's full range).
        is_dynamic: must be False.

    Example:
        >>> import torch
        >>> obs = FixedQParamsObserver(2.0 / 256.0, 0, dtype=torch.int8, quant_min=-128,
        ...                            quant_max=127, qscheme=torch.per_tensor_symmetric)
        >>> obs.calculate_qparams()
        (tensor([0.0078]), tensor([0], dtype=torch.int32))
    """

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(
        self,
        scale: float,
        zero_point: int,
        dtype: torch.dtype = torch.quint8,
        qscheme: torch.qscheme = torch.per_tensor_affine,
        quant_min: int | None = 0,
        quant_max: int | None = 255,
        is_dynamic: bool = False,
    ) -> None:
        super().__init__(dtype=dtype, is_dynamic=is_dynamic)
        owner = type(self).__name__
        if self.is_dynamic:
            raise ConfigError(f"{owner}: fixed qparams cannot be dynamic; use is_dynamic=False")
        self.qscheme = _check_qscheme(owner, qscheme, PER_TENSOR_QSCHEMES)
        self.quant_min, self.quant_max, _ = resolve_quant_range(owner, dtype, quant_min, quant_max)
        check_int(owner, "zero_point", zero_point)
        if not self.quant_min <= zero_point <= self.quant_max:
            raise ConfigError(
                f"{owner}: zero_point={zero_point} is outside [{self.quant_min}, {self.quant_max}]"
            )
        scale32 = float(torch.tensor(float(scale), dtype=torch.float32)) if _is_real(scale) else 0
        if not 0.0 < scale32 < float("inf"):
            raise ConfigError(f"{owner}: scale must be a positive finite float, got {scale!r}")
        self.register_buffer("scale", torch.tensor([scale], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([zero_point], dtype=torch.int))
        self._register_range()

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed ``(scale, zero_point)``: float32 and int32 tensors of shape ``(1,)``."""
        return self.scale.clone(), self.zero_point.clone()

    def extra_repr(self) -> str:
        return (
            f"{self._range_text()} scale={float(self.scale):.6g} "
            f"zero_point={int(self.zero_point)} {self._range_repr()}"
        )


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class PlaceholderObserver(_RangeRecorder):
    """Carries the configuration of dynamic quantization (or a cast); computes no qparams.

    Args:
        dtype: the target dtype (``torch.uint8``/``int8`` for dynamic quantization, a float
            dtype for a cast).
        custom_op_name: kept for torch compatibility (``custom_op``).
        compute_dtype: deprecated by torch; pass ``is_dynamic=True`` instead.
        quant_min, quant_max: integer range; None (both): the dtype's full range for integer
            dtypes, None for float dtypes.
        qscheme: per-tensor or per-channel scheme; None: ``torch.per_tensor_affine``.
        eps: smallest scale for the run-time qparams; None: float32 eps.
        is_dynamic: qparams are computed from each input at run time.

    Example:
        >>> import torch
        >>> obs = PlaceholderObserver(dtype=torch.uint8, is_dynamic=True)
        >>> obs.quant_min, obs.quant_max, obs.qscheme, obs.eps == torch.finfo(torch.float32).eps
        (0, 255, torch.per_tensor_affine, True)
        >>> obs.calculate_qparams()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.CalibrationError: PlaceholderObserver(uint8, dynamic) has no ...
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.float32,
        custom_op_name: str = "",
        compute_dtype: torch.dtype | None = None,
        quant_min: int | None = None,
        quant_max: int | None = None,
        qscheme: torch.qscheme | None = None,
        eps: float | None = None,
        is_dynamic: bool = False,
    ) -> None:
        super().__init__(dtype=dtype, is_dynamic=is_dynamic)
        owner = type(self).__name__
        if compute_dtype is not None:
            raise ConfigError(f"{owner}: compute_dtype is deprecated; pass is_dynamic=True instead")
        self.qscheme = _check_qscheme(owner, qscheme, _ALL_QSCHEMES)
        self.eps = check_eps(owner, torch.finfo(torch.float32).eps if eps is None else eps)
        self.custom_op = custom_op_name
        self.quant_min, self.quant_max = quant_min, quant_max
        if dtype in INTEGER_DTYPE_RANGES:
            self.quant_min, self.quant_max, _ = resolve_quant_range(
                owner, dtype, quant_min, quant_max
            )
        elif quant_min is not None or quant_max is not None:
            raise ConfigError(
                f"{owner}: quant_min/quant_max apply to integer dtypes, not {dtype}; leave them out"
            )
        self._register_range()

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Always raises: a placeholder has no calibration-time qparams.

        Raises:
            CalibrationError: explaining where the qparams come from instead.
        """
        dtype = _short(self.dtype)
        if self.is_dynamic:
            raise CalibrationError(
                f"{self._label()}({dtype}, dynamic) has no calibration-time qparams: dynamic "
                f"quantization computes scale and zero_point from each input at run time "
                f"(from its min/max, with quant_min={self.quant_min}, quant_max={self.quant_max}, "
                f"eps={self.eps:.3g}); convert reads those fields instead of calling "
                f"calculate_qparams()"
            )
        raise CalibrationError(
            f"{self._label()}({dtype}) has no qparams: it marks a cast to {dtype}, which needs no "
            f"scale or zero_point; use a MinMaxObserver or HistogramObserver for static "
            f"quantization"
        )

    def extra_repr(self) -> str:
        dynamic = " dynamic" if self.is_dynamic else ""
        return f"{self._range_text()}{dynamic} {self._range_repr()}"


class DerivedQParamsObserver(_RangeRecorder):
    """qparams computed by ``derive_qparams_fn(obs_or_fqs)`` from other observers.

    Args:
        dtype: quantized dtype (typically ``torch.int32`` for a bias).
        obs_or_fqs: the observers (or fake-quantizers) the qparams derive from; kept as a plain
            list (not submodules), so they stay registered where they live.
        derive_qparams_fn: ``fn(obs_or_fqs) -> (scale, zero_point)``.
        quant_min, quant_max: integer range; None (both): the dtype's full range.
        qscheme: None (``torch.per_tensor_affine``) or any per-tensor/per-channel scheme.
        ch_axis: the channel axis, required by per-channel schemes.

    Example:
        >>> import torch
        >>> from qviz.engine.observers import MinMaxObserver
        >>> act, weight = MinMaxObserver(dtype=torch.int8), MinMaxObserver(dtype=torch.int8)
        >>> _ = act(torch.tensor([-1.0, 1.0])); _ = weight(torch.tensor([-0.5, 0.5]))
        >>> def bias_qparams(obs):
        ...     scale = obs[0].calculate_qparams()[0] * obs[1].calculate_qparams()[0]
        ...     return scale, torch.zeros_like(scale, dtype=torch.int32)
        >>> bias = DerivedQParamsObserver(torch.int32, [act, weight], bias_qparams)
        >>> bias.calculate_qparams()
        (tensor([3.0757e-05]), tensor([0], dtype=torch.int32))
    """

    def __init__(
        self,
        dtype: torch.dtype,
        obs_or_fqs: Sequence[Any],
        derive_qparams_fn: Callable[[list[Any]], tuple[torch.Tensor, torch.Tensor]],
        quant_min: int | None = None,
        quant_max: int | None = None,
        qscheme: torch.qscheme | None = None,
        ch_axis: int | None = None,
    ) -> None:
        super().__init__(dtype=dtype)
        owner = type(self).__name__
        if not isinstance(obs_or_fqs, list | tuple) or not obs_or_fqs:
            raise ConfigError(
                f"{owner}: obs_or_fqs must be a non-empty list of observers, got {obs_or_fqs!r}"
            )
        if not callable(derive_qparams_fn):
            raise ConfigError(
                f"{owner}: derive_qparams_fn must be callable, got {derive_qparams_fn!r}"
            )
        self.obs_or_fqs = list(obs_or_fqs)
        self.derive_qparams_fn = derive_qparams_fn
        self.quant_min, self.quant_max, _ = resolve_quant_range(owner, dtype, quant_min, quant_max)
        self.qscheme = _check_qscheme(owner, qscheme, _ALL_QSCHEMES)
        if ch_axis is not None:
            check_int(owner, "ch_axis", ch_axis)
        if self.qscheme in PER_CHANNEL_QSCHEMES and ch_axis is None:
            raise ConfigError(f"{owner}: qscheme {self.qscheme} needs ch_axis (e.g. 0)")
        self.ch_axis = ch_axis
        self._register_range()

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``derive_qparams_fn(obs_or_fqs)``, checked to be a ``(scale, zero_point)`` pair."""
        result = self.derive_qparams_fn(self.obs_or_fqs)
        if not (
            isinstance(result, tuple | list)
            and len(result) == 2
            and all(isinstance(t, torch.Tensor) for t in result)
        ):
            name = getattr(self.derive_qparams_fn, "__name__", repr(self.derive_qparams_fn))
            raise ConfigError(
                f"{self._label()}: derive_qparams_fn {name} returned {type(result).__name__}; it "
                f"must return a (scale, zero_point) pair of tensors"
            )
        return result[0], result[1]

    def extra_repr(self) -> str:
        axis = "" if self.ch_axis is None else f" ch_axis={self.ch_axis}"
        return (
            f"{self._range_text()}{axis} from {len(self.obs_or_fqs)} observers {self._range_repr()}"
        )
