"""Model-level sums of a comparison: output statistics, the metric, samples and batches.

``compare`` (PT2E and quant_nn models) and ``sensitivity`` add one batch at a time; the sums
are exact (:class:`~qviz.numeric.streaming.ExactSum`), so the totals of several processes merge
into one process's, bit for bit.

Example:
    >>> import torch
    >>> totals = OutputTotals.for_metric(None)
    >>> totals.add(torch.ones(4), torch.ones(4) * 1.01, size=4)
    >>> totals.figures()["batches"], round(totals.figures()["output_sqnr"], 1)
    (1, 40.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qviz.numeric.batches import flat_tensors
from qviz.numeric.streaming import ExactSum, PairStats


def single(out: Any) -> Any:
    """A one-element list or tuple of outputs as its element (what a metric expects)."""
    return out[0] if isinstance(out, list | tuple) and len(out) == 1 else out


@dataclass
class OutputTotals:
    """The model outputs compared so far, the metric's sample-weighted sum (None: no metric),
    and the sample and batch counts (picklable, mergeable)."""

    outputs: PairStats = field(default_factory=PairStats)
    metric: ExactSum | None = None
    samples: int = 0
    count: int = 0

    @classmethod
    def for_metric(cls, metric: Callable | None) -> OutputTotals:
        return cls(metric=None if metric is None else ExactSum())

    def add(self, reference: Any, test: Any, size: int, metric_value: Any = None) -> None:
        """One batch: the reference and test outputs, its size, the metric's value on it."""
        for f, q in zip(flat_tensors(reference), flat_tensors(test), strict=True):
            self.outputs.update(f, q)
        if self.metric is not None and metric_value is not None:
            self.metric.add(float(metric_value) * size)
        self.samples += size
        self.count += 1

    def merge(self, other: OutputTotals) -> None:
        self.outputs.merge(other.outputs)
        if self.metric is not None and other.metric is not None:
            self.metric.merge(other.metric)
        self.samples += other.samples
        self.count += other.count

    @property
    def metric_value(self) -> float | None:
        """The metric averaged over samples (None without a metric or samples)."""
        if self.metric is None or not self.samples:
            return None
        return self.metric.value / self.samples

    def figures(self) -> dict[str, Any]:
        """``output_sqnr``, ``metric``, ``batches``, ``samples`` for a NumericReport."""
        return {
            "output_sqnr": self.outputs.sqnr if self.outputs.count else math.nan,
            "metric": self.metric_value,
            "batches": self.count,
            "samples": self.samples,
        }
