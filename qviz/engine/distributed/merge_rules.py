"""How each kind of observer and calibrator state merges across processes (pure rules).

:mod:`qviz.engine.distributed.sharded` merges in two rounds of reductions. A *rule* says, for one
observer or calibrator, what it contributes to each round and how the reduced values become its
state again. Contributions are ``(op, float64 or int64 tensor)`` with op ``"min"``, ``"max"``
or ``"sum"``; the merge packs every contribution of every rule into a few flat tensors, so the
number of collectives does not grow with the number of observers.

=============================  ===========================================================
state                          merged as
=============================  ===========================================================
min_val / max_val (per tensor  MIN / MAX: exactly the single-process running range
or per channel)
histogram (HistogramObserver)  round 1 agrees on the global range; round 2 re-bins each
                               process's histogram onto it as a growing range does in one
                               process (torch's re-binning), then sums the counts
                               (within one process's batch-order spread, see sharded)
signed histogram               the ranges are powers of two, so round 2 merges 2^k bins on
(OrderFreeHistogramObserver)   each side of zero exactly and sums int64 counts: the
                               single-process histogram, bit for bit
|x| histogram                  the ranges are powers of two (HistogramCalibrator), so round 2
(HistogramCalibrator)          merges 2^k neighbouring bins exactly and sums int64 counts:
                               the single-process histogram, bit for bit
running amax (MaxCalibrator)   MAX
moving averages                batch-count weighted mean of the processes' averages
num_batches / num_elements     SUM
=============================  ===========================================================

Example:
    >>> import torch
    >>> from qviz.engine.observers import MinMaxObserver
    >>> a, b = MinMaxObserver(), MinMaxObserver()
    >>> _ = a(torch.tensor([-1.0, 2.0])); _ = b(torch.tensor([3.0]))
    >>> rule = rule_for(a)
    >>> parts = [rule.round1(o, Shape(None, ())) for o in (a, b)]
    >>> reduced = {k: REDUCE[op](parts[0][k][1], parts[1][k][1]) for k, (op, _) in parts[0].items()}
    >>> rule.apply(a, reduced, {}, Shape(None, ()))
    >>> a.min_val.item(), a.max_val.item(), a.num_batches
    (-1.0, 3.0, 2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from qviz.engine.observers import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    ObserverBase,
    OrderFreeHistogramObserver,
    PerChannelMinMaxObserver,
)
from qviz.engine.observers.order_free_histogram import regrid_signed
from qviz.engine.tensor.calib.histogram_calibrator import HistogramCalibrator
from qviz.engine.tensor.calib.max_calibrator import MaxCalibrator
from qviz.engine.tensor.calib.pow2_ranges import regrid

#: ``{key: (op, tensor)}``: what one observer contributes to one round.
Contributions = dict[str, tuple[str, torch.Tensor]]

#: the reductions, as functions of two tensors (what a collective does across processes)
REDUCE = {"min": torch.minimum, "max": torch.maximum, "sum": torch.add}

_F64, _I64 = torch.float64, torch.int64
#: configuration attributes that must agree across processes (those an object has)
_CONFIG = (
    "dtype", "qscheme", "quant_min", "quant_max", "ch_axis", "bins", "averaging_constant",
    "num_bits", "axis", "unsigned", "num_bins",
)  # fmt: skip
_INF = math.inf


@dataclass(frozen=True)
class Shape:
    """What every process agrees on before reducing: the channel count (None per tensor) and
    a calibrator's amax keep-shape (from any process that saw data)."""

    channels: int | None
    keep: tuple[int, ...]

    @property
    def rows(self) -> int:
        return self.channels or 1


def _counts(obj: Any) -> tuple[str, torch.Tensor]:
    return "sum", torch.tensor([obj.num_batches, obj.num_elements], dtype=_I64)


def _set_counts(obj: Any, reduced: dict[str, torch.Tensor]) -> None:
    obj.num_batches, obj.num_elements = (int(v) for v in reduced["counts"].tolist())


class Rule:
    """Merge nothing but the batch and element counts (fixed, placeholder, derived observers)."""

    def signature(self, obj: Any) -> str:
        """What must be equal on every process (class and configuration, no statistics)."""
        config = ", ".join(f"{name}={getattr(obj, name)}" for name in _CONFIG if hasattr(obj, name))
        return f"{type(obj).__name__}({config})"

    def channels(self, obj: Any) -> int | None:
        return None

    def keep(self, obj: Any) -> tuple[int, ...] | None:
        return None

    def round1(self, obj: Any, shape: Shape) -> Contributions:
        return {"counts": _counts(obj)}

    def round2(self, obj: Any, reduced: dict[str, torch.Tensor], shape: Shape) -> Contributions:
        return {}

    def apply(self, obj: Any, r1: dict, r2: dict, shape: Shape) -> None:
        _set_counts(obj, r1)


class RangeRule(Rule):
    """Running min / max, per tensor or per channel: MIN and MAX."""

    def channels(self, obj: Any) -> int | None:
        if obj.min_val.dim() == 0:
            return None
        return obj.min_val.numel() or None

    def _range(self, obj: Any, shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
        if not obj._has_range():
            low = torch.full((shape.rows,), _INF, dtype=_F64)
            return low, -low
        return obj.min_val.detach().to("cpu", _F64).reshape(-1), obj.max_val.detach().to(
            "cpu", _F64
        ).reshape(-1)

    def round1(self, obj: Any, shape: Shape) -> Contributions:
        low, high = self._range(obj, shape)
        return {"counts": _counts(obj), "min": ("min", low), "max": ("max", high)}

    def _store(self, obj: Any, low: torch.Tensor, high: torch.Tensor, shape: Shape) -> None:
        if bool(torch.isinf(low).all()) and bool(torch.isinf(high).all()):
            return  # no process saw data
        device = obj.min_val.device
        low, high = low.to(device, torch.float32), high.to(device, torch.float32)
        if obj.min_val.dim() == 0:  # a per-tensor observer
            obj.min_val.copy_(low.reshape(()))
            obj.max_val.copy_(high.reshape(()))
        else:
            obj.min_val.resize_(low.shape).copy_(low)
            obj.max_val.resize_(high.shape).copy_(high)

    def apply(self, obj: Any, r1: dict, r2: dict, shape: Shape) -> None:
        _set_counts(obj, r1)
        self._store(obj, r1["min"], r1["max"], shape)


class MovingAverageRule(RangeRule):
    """Moving averages: the mean of the processes' averages weighted by their batch counts.

    One process's moving average depends on the order of its batches, so no merge can equal
    every single-process order; this rule is order-free across processes and gives a process's
    own average back when it is the only one that saw data.
    """

    def round1(self, obj: Any, shape: Shape) -> Contributions:
        low, high = self._range(obj, shape)
        n = float(obj.num_batches) if obj._has_range() else 0.0
        finite_low = torch.where(torch.isinf(low), 0.0, low)
        finite_high = torch.where(torch.isinf(high), 0.0, high)
        return {
            "counts": _counts(obj),
            "weighted": ("sum", torch.cat([finite_low * n, finite_high * n])),
            "weight": ("sum", torch.tensor([n], dtype=_F64)),
        }

    def apply(self, obj: Any, r1: dict, r2: dict, shape: Shape) -> None:
        _set_counts(obj, r1)
        weight = float(r1["weight"])
        if weight == 0:
            return
        low, high = (r1["weighted"] / weight).split(shape.rows)
        self._store(obj, low, high, shape)


class HistogramObserverRule(RangeRule):
    """torch's histogram: the global range first, then each histogram re-binned onto it as a
    growing range re-bins in one process, and the counts summed."""

    def round2(self, obj: Any, reduced: dict[str, torch.Tensor], shape: Shape) -> Contributions:
        if not obj._keeps_l2:
            return {}
        low, high = float(reduced["min"]), float(reduced["max"])
        if not obj._has_range() or math.isinf(low):
            return {"histogram": ("sum", torch.zeros(obj.bins, dtype=_F64))}
        hist = obj.histogram_on(torch.tensor(low), torch.tensor(high))
        return {"histogram": ("sum", hist.detach().to("cpu", _F64))}

    def apply(self, obj: Any, r1: dict, r2: dict, shape: Shape) -> None:
        super().apply(obj, r1, r2, shape)
        if "histogram" in r2:
            obj.histogram.copy_(r2["histogram"].to(obj.histogram.device, torch.float32))


class OrderFreeHistogramRule(RangeRule):
    """Signed histograms over power-of-two ranges: the largest range, each histogram's bins
    merged 2^k at a time onto it on each side of zero, int64 counts summed: the single-process
    histogram of all the batches, bit for bit (so are the qparams)."""

    def round1(self, obj: Any, shape: Shape) -> Contributions:
        contributions = super().round1(obj, shape)
        own = obj.hist_range.detach().to("cpu", _F64).reshape(1)
        contributions["range"] = ("max", own)
        return contributions

    def round2(self, obj: Any, reduced: dict[str, torch.Tensor], shape: Shape) -> Contributions:
        old, new = float(obj.hist_range), float(reduced["range"])
        counts = regrid_signed(obj.counts.detach().cpu(), old, new)
        return {"hist": ("sum", counts)}

    def apply(self, obj: Any, r1: dict, r2: dict, shape: Shape) -> None:
        super().apply(obj, r1, r2, shape)
        obj.hist_range.fill_(float(r1["range"]))
        obj.counts.copy_(r2["hist"].to(obj.counts.device))


class MaxCalibratorRule(Rule):
    """The running amax of a MaxCalibrator: MAX per channel (its per-batch history stays local)."""

    def channels(self, obj: Any) -> int | None:
        amax = obj._calib_amax
        return None if amax is None or amax.numel() == 1 else amax.numel()

    def keep(self, obj: Any) -> tuple[int, ...] | None:
        return obj._keep_shape

    def _amax(self, obj: Any, shape: Shape) -> torch.Tensor:
        if obj._calib_amax is None:
            return torch.full((shape.rows,), -_INF, dtype=_F64)
        return obj._calib_amax.detach().to("cpu", _F64).reshape(-1)

    def round1(self, obj: Any, shape: Shape) -> Contributions:
        return {"counts": _counts(obj), "amax": ("max", self._amax(obj, shape))}

    def _bind(self, obj: Any, shape: Shape) -> torch.device:
        if obj._keep_shape is None:
            obj._keep_shape, obj._device = shape.keep, torch.device("cpu")
        return obj._device

    def apply(self, obj: Any, r1: dict, r2: dict, shape: Shape) -> None:
        _set_counts(obj, r1)
        if obj.num_batches == 0:
            return
        device = self._bind(obj, shape)
        obj._calib_amax = r1["amax"].to(device, torch.float32)


class HistogramCalibratorRule(MaxCalibratorRule):
    """|x| histograms over power-of-two ranges: the largest range, each histogram's bins merged
    2^k at a time onto it (exact integer sums), int64 counts summed: the single-process
    histogram of all the batches, bit for bit."""

    def channels(self, obj: Any) -> int | None:
        counts = obj._counts
        return None if counts is None or counts.shape[0] == 1 else counts.shape[0]

    def round1(self, obj: Any, shape: Shape) -> Contributions:
        contributions = super().round1(obj, shape)
        own = torch.zeros(shape.rows, dtype=_F64) if obj._range is None else obj._range
        contributions["range"] = ("max", own.detach().to("cpu", _F64).reshape(-1))
        return contributions

    def round2(self, obj: Any, reduced: dict[str, torch.Tensor], shape: Shape) -> Contributions:
        bins = obj.num_bins
        if obj._counts is None:
            return {"hist": ("sum", torch.zeros(shape.rows * bins, dtype=_I64))}
        own = obj._range.detach().to("cpu", _F64)
        counts = regrid(obj._counts.detach().cpu(), own, reduced["range"])
        return {"hist": ("sum", counts.reshape(-1))}

    def apply(self, obj: Any, r1: dict, r2: dict, shape: Shape) -> None:
        super().apply(obj, r1, r2, shape)
        if obj.num_batches == 0:
            return
        device = obj._device
        obj._range = r1["range"].to(device, _F64)
        obj._counts = r2["hist"].reshape(shape.rows, obj.num_bins).to(device)


_RULES: tuple[tuple[type, Rule], ...] = (
    (HistogramCalibrator, HistogramCalibratorRule()),
    (MaxCalibrator, MaxCalibratorRule()),
    (HistogramObserver, HistogramObserverRule()),
    (OrderFreeHistogramObserver, OrderFreeHistogramRule()),
    (MovingAverageMinMaxObserver, MovingAverageRule()),
    (MovingAveragePerChannelMinMaxObserver, MovingAverageRule()),
    (MinMaxObserver, RangeRule()),
    (PerChannelMinMaxObserver, RangeRule()),
    (ObserverBase, Rule()),
)


def rule_for(obj: Any) -> Rule | None:
    """The merge rule of an observer or calibrator (None: not something qviz merges)."""
    for cls, rule in _RULES:
        if isinstance(obj, cls):
            return rule
    return None
