"""Model-level sums of a comparison: output statistics, the metric, samples and batches.

``compare`` (PT2E and quant_nn models) and ``sensitivity`` add one batch at a time; the sums
are exact (:class:`~qviz.numeric.measure.streaming.ExactSum`), so the totals of several
processes merge into one process's, bit for bit.

**The output SQNR** is measured leaf by leaf over the outputs' floating-point tensors
(:func:`~qviz.numeric.measure.batches.output_pairs`: the logits and hidden states of a Hugging Face
``ModelOutput``, each tensor of a tuple), and combined as one signal over one noise: the sum
of every leaf's squared float values over the sum of every leaf's squared errors. Integer and
bool leaves are not measured in dB; an element that is the same infinity in both outputs (a
``-inf`` attention mask) is equal, not noise. The figure is a number or says why not
(:meth:`OutputTotals.problem`: no floating-point output, a NaN or infinity in one output only,
an output that is zero everywhere), and what decides on it refuses it then
(:func:`check_figures`).

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

import torch

from qviz.errors import MeasurementError
from qviz.numeric.measure.batches import describe_leaves, output_pairs
from qviz.numeric.measure.streaming import ExactSum, PairStats


def single(out: Any) -> Any:
    """A one-element list or tuple of outputs as its element (what a metric expects)."""
    return out[0] if isinstance(out, list | tuple) and len(out) == 1 else out


def _finite_part(
    reference: torch.Tensor, test: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, int, str]:
    """The elements finite in both tensors, how many elements are NaN or infinite in one but
    not the same infinity in the other, and the first such pair (for a message)."""
    ref, out = reference.detach(), test.detach().to(reference.device)
    finite_ref, finite_out = torch.isfinite(ref), torch.isfinite(out)
    both = finite_ref & finite_out
    if bool(both.all()):
        return ref, out, 0, ""
    same_infinity = torch.isinf(ref) & (ref == out)
    odd = ~both & ~same_infinity
    count = int(odd.sum())
    example = ""
    if count:
        i = int(odd.reshape(-1).nonzero()[0])
        example = f"float {float(ref.reshape(-1)[i])} vs {float(out.reshape(-1)[i])}"
    return ref[both], out[both], count, example


@dataclass(kw_only=True)
class OutputTotals:
    """The model outputs compared so far (per floating-point leaf), the metric's sample-weighted
    sum (None: no metric), and the sample and batch counts (picklable, mergeable)."""

    leaves: dict[str, PairStats] = field(default_factory=dict)
    metric: ExactSum | None = None
    samples: int = 0
    count: int = 0
    #: per leaf: elements NaN or infinite in one output only, and the first such pair
    nonfinite: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: what the outputs held when no leaf is a floating-point tensor (for the message)
    unmeasured: str = ""

    @classmethod
    def for_metric(cls, metric: Callable | None) -> OutputTotals:
        return cls(metric=None if metric is None else ExactSum())

    def add(
        self, reference: Any, test: Any, size: int, metric_value: Any = None, where: str = "batch"
    ) -> None:
        """One batch: the reference and test outputs, its size, the metric's value on it
        (``where`` names the batch in an error)."""
        pairs = output_pairs(reference, test, where)
        if not pairs and not self.unmeasured:
            self.unmeasured = f"{type(reference).__name__}: {describe_leaves(reference)}"
        for path, f, q in pairs:
            f, q, odd, example = _finite_part(f, q)
            if odd:
                seen = self.nonfinite.get(path, (0, example))
                self.nonfinite[path] = (seen[0] + odd, seen[1])
            self.leaves.setdefault(path, PairStats()).update(f, q)
        if self.metric is not None and metric_value is not None:
            self.metric.add(float(metric_value) * size)
        self.samples += size
        self.count += 1

    def merge(self, other: OutputTotals) -> None:
        for path, stats in other.leaves.items():
            self.leaves.setdefault(path, PairStats()).merge(stats)
        for path, (odd, example) in other.nonfinite.items():
            seen = self.nonfinite.get(path, (0, example))
            self.nonfinite[path] = (seen[0] + odd, seen[1])
        self.unmeasured = self.unmeasured or other.unmeasured
        if self.metric is not None and other.metric is not None:
            self.metric.merge(other.metric)
        self.samples += other.samples
        self.count += other.count

    @property
    def outputs(self) -> PairStats:
        """Every floating-point leaf's statistics together: one signal, one noise."""
        pooled = PairStats()
        for stats in self.leaves.values():
            pooled.merge(stats)
        return pooled

    @property
    def metric_value(self) -> float | None:
        """The metric averaged over samples (None without a metric or samples)."""
        if self.metric is None or not self.samples:
            return None
        return self.metric.value / self.samples

    def problem(self) -> str | None:
        """Why the output SQNR is not a number (None when it is one: finite, or ``inf`` where
        every compared element is equal), with what to do."""
        if not self.count:
            return "no batch was compared; give at least one batch"
        if not self.leaves:
            return (
                f"the model outputs hold no floating-point tensor to measure ({self.unmeasured}); "
                f"return the float outputs (logits, hidden states) from the model's forward"
            )
        if self.nonfinite:
            path, (odd, example) = next(iter(self.nonfinite.items()))
            return (
                f"{path} has {odd} element(s) that are NaN or infinite in one model's output and "
                f"not the same in the other's ({example}); find the operator that makes them in "
                f"compare(...).df (the first non-finite cumulative_sqnr), or fix the float model"
            )
        pooled = self.outputs
        if pooled.ref_sq == 0.0 and pooled.err_sq > 0.0:
            return (
                f"the float model's outputs ({', '.join(self.leaves)}) are zero everywhere: there "
                f"is no signal to measure the quantization noise against; measure on batches "
                f"whose outputs are not all zero"
            )
        if math.isnan(pooled.sqnr) or not math.isfinite(pooled.ref_sq + pooled.err_sq):
            return (
                f"the outputs' squared values overflow ({', '.join(self.leaves)}: signal "
                f"{pooled.ref_sq}, noise {pooled.err_sq}); measure outputs of a sane range"
            )
        return None

    @property
    def output_sqnr(self) -> float:
        """The outputs' SQNR in dB; NaN when :meth:`problem` says why it is not a number."""
        return math.nan if self.problem() is not None else self.outputs.sqnr

    def figures(self) -> dict[str, Any]:
        """``output_sqnr``, ``output_problem``, ``output_leaves`` (each floating-point leaf's
        SQNR), ``metric``, ``batches``, ``samples`` for a NumericReport."""
        return {
            "output_sqnr": self.output_sqnr,
            "output_problem": self.problem(),
            "output_leaves": {p: s.sqnr for p, s in self.leaves.items() if s.count},
            "metric": self.metric_value,
            "batches": self.count,
            "samples": self.samples,
        }

    def checked(self, where: str) -> tuple[float, float | None]:
        """``(output SQNR, metric)``, refused with a MeasurementError (:func:`check_figures`)
        when either is not a number."""
        return check_figures(self.output_sqnr, self.problem(), self.metric_value, where)


def check_figures(
    output_sqnr: float, problem: str | None, metric: float | None, where: str
) -> tuple[float, float | None]:
    """``(output_sqnr, metric)`` when both are numbers to decide on: a finite SQNR, or ``inf``
    with no ``problem`` (every element equal: the float model itself); a finite metric or None.

    Args:
        output_sqnr: the outputs' SQNR in dB.
        problem: why it is not a number (:meth:`OutputTotals.problem`), or None.
        metric: the metric averaged over samples, or None without one.
        where: the figure's origin, ``"sensitivity: the fully quantized model"``.

    Raises:
        MeasurementError: naming the figure, ``where`` and why it is not a number, with the fix.

    Example:
        >>> check_figures(31.5, None, 0.9, "sensitivity: the fully quantized model")
        (31.5, 0.9)
        >>> check_figures(math.nan, "no batch was compared; give at least one batch", None,
        ...               "search_precision: the first guess")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.MeasurementError: search_precision: the first guess: the output SQNR is nan...
    """
    usable = not math.isnan(output_sqnr) and output_sqnr != -math.inf
    if problem is not None or not usable:
        why = problem or "the outputs' comparison gave no number"
        raise MeasurementError(
            f"{where}: the output SQNR is {output_sqnr} dB, not a figure to decide on: {why}"
        )
    if metric is not None and not math.isfinite(metric):
        raise MeasurementError(
            f"{where}: the metric averaged {metric} over the samples, not a figure to decide "
            f"on: metric(float_out, quant_out, target) returned a NaN or infinite value on some "
            f"batch; make it return a finite number for every batch"
        )
    return output_sqnr, metric
