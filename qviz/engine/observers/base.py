"""What every graph observer shares: the ``with_args`` factory, bookkeeping and input checks.

An observer is an ``nn.Module`` that PT2E ``prepare`` inserts into the graph. Its ``forward``
returns its input unchanged and records statistics about it; ``calculate_qparams()`` turns them
into ``(scale, zero_point)``. Besides the statistics that decide the qparams, every observer keeps
what the views need: ``num_batches`` and ``num_elements`` seen and, for the observers that watch
values, the ``min_val``/``max_val`` buffers.

``Observer.with_args(**kwargs)`` returns an :class:`ObserverFactory`: a constructor with those
keyword arguments bound (called with no arguments it builds a fresh observer), which can bind
more with its own ``with_args``. It quacks like torch's ``PartialWrapper``: ``.p`` is a
``functools.partial`` whose ``.func`` is always the observer class (never a nested partial), and
``__name__`` is the class name, so prepare code written for torchao can inspect it.

Example:
    >>> import torch
    >>> from qviz.engine.observers import MinMaxObserver
    >>> make = MinMaxObserver.with_args(dtype=torch.int8).with_args(eps=2**-12)
    >>> make
    MinMaxObserver.with_args(dtype=torch.int8, eps=0.000244140625)
    >>> obs = make()
    >>> obs.dtype, obs.quant_min, obs.quant_max
    (torch.int8, -128, 127)
    >>> make.p.func is MinMaxObserver and make.__name__ == "MinMaxObserver"
    True
"""

from __future__ import annotations

import abc
import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from qviz.engine.qparams import DTYPE_RANGES
from qviz.errors import CalibrationError, ConfigError

#: Full integer range of every storage dtype the observers compute qparams for.
INTEGER_DTYPE_RANGES: dict[torch.dtype, tuple[int, int]] = {
    **DTYPE_RANGES,
    torch.uint16: (0, 2**16 - 1),
    torch.qint8: DTYPE_RANGES[torch.int8],
    torch.quint8: DTYPE_RANGES[torch.uint8],
    torch.qint32: DTYPE_RANGES[torch.int32],
}


class ObserverFactory:
    """An observer constructor with keyword arguments bound: what ``with_args`` returns.

    Calling it builds a new observer (extra keyword arguments override the bound ones);
    ``with_args`` binds more and returns a new factory. Two factories are equal when they build
    the same class with equal arguments, so equal quantization specs compare equal.

    Args:
        cls: the observer class.
        kwargs: the keyword arguments to bind; names the constructor does not take raise
            ConfigError listing the ones it does.

    Example:
        >>> import torch
        >>> from qviz.engine.observers import HistogramObserver
        >>> make = HistogramObserver.with_args(bins=256)
        >>> make() is make(), make().bins, make.kwargs
        (False, 256, {'bins': 256})
        >>> make == HistogramObserver.with_args(bins=256)
        True
    """

    def __init__(self, cls: type[ObserverBase], kwargs: dict[str, Any]) -> None:
        try:
            inspect.signature(cls).bind_partial(**kwargs)
        except TypeError as exc:
            names = ", ".join(inspect.signature(cls).parameters)
            raise ConfigError(
                f"{cls.__name__}.with_args: {exc}; the constructor takes {names}"
            ) from None
        self.p = functools.partial(cls, **kwargs)
        self.callable_args: dict[str, Callable[[], Any]] = {}  # torch PartialWrapper's field

    @property
    def __name__(self) -> str:  # prepare code reads the class name of a constructor
        return self.p.func.__name__

    @property
    def observer_class(self) -> type[ObserverBase]:
        """The class this factory builds."""
        return self.p.func

    @property
    def kwargs(self) -> dict[str, Any]:
        """A copy of the bound keyword arguments."""
        return dict(self.p.keywords)

    def __call__(self, *args: Any, **kwargs: Any) -> ObserverBase:
        return self.p(*args, **kwargs)

    def with_args(self, **kwargs: Any) -> ObserverFactory:
        """A new factory with ``kwargs`` bound on top of this one's."""
        return ObserverFactory(self.p.func, {**self.p.keywords, **kwargs})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ObserverFactory):
            return NotImplemented
        if self.p.func is not other.p.func or self.p.keywords.keys() != other.p.keywords.keys():
            return False
        try:
            return all(bool(v == other.p.keywords[k]) for k, v in self.p.keywords.items())
        except (RuntimeError, TypeError, ValueError):  # e.g. multi-element tensors
            return self is other

    def __hash__(self) -> int:
        return hash((self.p.func, tuple(sorted(self.p.keywords))))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.p.keywords.items())
        return f"{self.p.func.__name__}.with_args({args})"


def check_bool(owner: str, name: str, value: Any) -> bool:
    """``value`` if it is a bool, else ConfigError naming the argument."""
    if not isinstance(value, bool):
        raise ConfigError(f"{owner}: {name} must be True or False, got {value!r}")
    return value


def check_int(owner: str, name: str, value: Any) -> int:
    """``value`` if it is an int (not a bool), else ConfigError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{owner}: {name} must be an int, got {value!r}")
    return value


def factory_device(owner: str, factory_kwargs: dict[str, Any] | None) -> torch.device | None:
    """The device named by torch's ``factory_kwargs`` (buffers stay float32)."""
    if factory_kwargs is None:
        return None
    if not isinstance(factory_kwargs, dict) or not set(factory_kwargs) <= {"device", "dtype"}:
        raise ConfigError(
            f"{owner}: factory_kwargs must be None or a dict with 'device' (and 'dtype'), "
            f"got {factory_kwargs!r}"
        )
    if factory_kwargs.get("dtype") not in (None, torch.float32):
        raise ConfigError(
            f"{owner}: observers keep float32 statistics; factory_kwargs dtype "
            f"{factory_kwargs['dtype']} is not supported, leave it out"
        )
    device = factory_kwargs.get("device")
    return None if device is None else torch.device(device)


class ObserverBase(abc.ABC, nn.Module):
    """Base of every qviz observer: forward records, ``calculate_qparams`` decides.

    Args:
        dtype: the quantized storage dtype the qparams are for (``torch.int8``, ...), or the
            float dtype a placeholder passes on.
        is_dynamic: qparams are computed at run time from each input (dynamic quantization).

    Attributes:
        num_batches: how many non-empty tensors ``forward`` has observed since the last reset.
        num_elements: how many elements those tensors held together.

    Example:
        >>> import torch
        >>> from qviz.engine.observers import MinMaxObserver
        >>> obs = MinMaxObserver(dtype=torch.int8)
        >>> _ = obs(torch.tensor([-1.0, 2.0])); _ = obs(torch.tensor([0.5]))
        >>> obs.num_batches, obs.num_elements
        (2, 3)
        >>> obs.reset(); obs.num_batches
        0
    """

    min_val: torch.Tensor
    max_val: torch.Tensor

    def __init__(self, dtype: torch.dtype, is_dynamic: bool = False) -> None:
        super().__init__()
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(f"{type(self).__name__}: dtype must be a torch.dtype, got {dtype!r}")
        self.dtype = dtype
        self.is_dynamic = check_bool(type(self).__name__, "is_dynamic", is_dynamic)
        self.num_batches = 0
        self.num_elements = 0

    @classmethod
    def with_args(cls, **kwargs: Any) -> ObserverFactory:
        """A constructor of this observer with ``kwargs`` bound (see :class:`ObserverFactory`).

        Example:
            >>> import torch
            >>> from qviz.engine.observers import PerChannelMinMaxObserver
            >>> PerChannelMinMaxObserver.with_args(ch_axis=1)().ch_axis
            1
        """
        return ObserverFactory(cls, kwargs)

    @abc.abstractmethod
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Record statistics of ``x`` and return ``x`` unchanged."""

    @abc.abstractmethod
    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)`` from what was observed."""

    def reset(self) -> None:
        """Forget everything observed (the configuration stays)."""
        self.num_batches = 0
        self.num_elements = 0
        self._reset_statistics()

    def reset_min_max_vals(self) -> None:
        """torch's name for :meth:`reset`."""
        self.reset()

    def _reset_statistics(self) -> None:
        if "min_val" in self._buffers:
            self.min_val.fill_(float("inf"))
            self.max_val.fill_(float("-inf"))

    # -- helpers for subclasses ----------------------------------------------------------------
    def _label(self) -> str:
        """What errors call this observer: ``qviz_label`` (prepare sets it: the module's name and
        the tensor it observes), else the class name."""
        return getattr(self, "qviz_label", None) or type(self).__name__

    def _input(self, x: Any) -> torch.Tensor | None:
        """``x`` detached, or None when it is empty (nothing to observe)."""
        if not isinstance(x, torch.Tensor):
            raise CalibrationError(f"{self._label()} observes tensors, got {type(x).__name__}")
        if x.is_complex() or x.dtype == torch.bool:
            raise CalibrationError(
                f"{self._label()} got a {x.dtype} tensor; observers take real-valued tensors"
            )
        return None if x.numel() == 0 else x.detach()

    def _check_finite(self, x: torch.Tensor, *extremes: torch.Tensor) -> None:
        """Raise CalibrationError counting NaN/Inf in ``x`` unless all ``extremes`` are finite."""
        if all(t.dim() == 0 for t in extremes):  # per tensor: .item() is 20x cheaper than ops
            if all(math.isfinite(t.item()) for t in extremes):
                return
        elif all(bool(torch.isfinite(t).all()) for t in extremes):
            return
        n_nan = int(torch.isnan(x).sum())
        n_inf = int(torch.isinf(x).sum())
        raise CalibrationError(
            f"{self._label()} got {n_nan} NaN and {n_inf} Inf values in a {x.dtype} tensor of "
            f"shape {tuple(x.shape)}: observers need finite values; fix the model or the data "
            f"that produce them (or clamp them) before calibrating"
        )

    def _follow(self, device: torch.device) -> None:
        """Keep the state on the device of the data being observed."""
        if self.min_val.device != device:
            self.to(device)

    def _count(self, x: torch.Tensor) -> None:
        self.num_batches += 1
        self.num_elements += x.numel()

    def _track_range(self, x: torch.Tensor) -> None:
        """Fold ``x`` into the running ``min_val``/``max_val`` (float32, NaN/Inf rejected)."""
        y = x if x.dtype == torch.float32 else x.to(torch.float32)
        low, high = torch.aminmax(y)
        self._check_finite(y, low, high)
        self._follow(low.device)
        self._fold(low, high)
        self._count(x)

    def _fold(self, low: torch.Tensor, high: torch.Tensor) -> None:
        """Running minimum and maximum (as torch: ``min(batch_min, min_val)``)."""
        self.min_val.copy_(torch.min(low, self.min_val))
        self.max_val.copy_(torch.max(high, self.max_val))

    def _has_range(self) -> bool:
        """Whether data was seen: the buffers left their empty / (+inf, -inf) start."""
        if self.min_val.dim() == 0:
            return not (self.min_val.item() == math.inf and self.max_val.item() == -math.inf)
        return bool(self.min_val.numel()) and not bool(
            (self.min_val == math.inf).all() & (self.max_val == -math.inf).all()
        )

    def _range_repr(self) -> str:
        text = f"batches={self.num_batches}"
        if "min_val" in self._buffers and self._has_range():
            low, high = float(self.min_val.min()), float(self.max_val.max())
            text += f" min={low:.4g} max={high:.4g}"
        return text

    def _no_data_error(self) -> CalibrationError:
        return CalibrationError(
            f"{self._label()} has observed no data, so it has no qparams: run calibration "
            f"batches through the prepared model (qviz.calibrate(model, data)) before converting "
            f"or calling calculate_qparams()"
        )
