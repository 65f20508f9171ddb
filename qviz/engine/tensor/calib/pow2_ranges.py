"""Histograms over power-of-two ranges: growing a range by doubling merges bins exactly.

A histogram of ``num_bins`` equal bins over ``[0, R)``, with ``R`` a power of two and the bin of
a value ``v >= 0`` being ``floor(v * num_bins / R)``, has a useful property: when ``R`` grows to
``R * 2**k``, bin ``j`` of the new histogram is exactly the sum of old bins ``j * 2**k`` to
``(j + 1) * 2**k - 1`` (``floor(floor(y) / 2**k) == floor(y / 2**k)``, and scaling by a power of
two is exact in floating point). The same holds for right-closed bins ``(lo, hi]``, where the
bin of ``v > 0`` is ``ceil(v * num_bins / R) - 1`` (``ceil(ceil(y) / 2**k) == ceil(y / 2**k)``):
those let the range be the power of two at or above the largest value, which then sits in the
last bin by the rule itself, not by a clamp. So a histogram that grew its range while it
collected equals, count for count, the histogram of the same values binned directly on the final
range: it does not depend on the order of the tensors, and histograms of disjoint shards merge
exactly by growing each to the largest range and summing. This is the shared core of
:class:`~qviz.engine.tensor.calib.HistogramCalibrator` (``|x|`` per channel, right-closed bins)
and :class:`~qviz.engine.observers.OrderFreeHistogramObserver` (signed values), and of their merge
rules in :mod:`qviz.engine.distributed.merge_rules`.

Worked example: 8 bins over ``[0, 1)`` hold ``0.1`` (bin 0) and ``0.7`` (bin 5); a batch with
``1.5`` grows the range to 2 (``k = 1``): pairs of bins merge, ``0.1`` stays in bin 0, ``0.7``
moves to bin 2, exactly where binning ``0.7 * 8 / 2 = 2.8`` puts it.

Example:
    >>> import torch
    >>> counts = torch.tensor([[1, 0, 0, 0, 0, 1, 0, 0]])
    >>> regrid(counts, torch.tensor([1.0], dtype=torch.float64),
    ...        torch.tensor([2.0], dtype=torch.float64)).tolist()
    [[1, 0, 1, 0, 0, 0, 0, 0]]
"""

from __future__ import annotations

import math

import torch


def pow2_ceil(amax: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= each value (0 stays 0), exactly (from the binary exponent).

    Example:
        >>> pow2_ceil(torch.tensor([0.0, 0.3, 0.5, 3.0], dtype=torch.float64)).tolist()
        [0.0, 0.5, 0.5, 4.0]
    """
    mantissa, exponent = torch.frexp(amax)  # amax = mantissa * 2**exponent, mantissa in [0.5, 1)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    return torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), exponent), amax)


def pow2_above(amax: torch.Tensor) -> torch.Tensor:
    """The smallest power of two strictly above each value (0 stays 0), exactly.

    A range strictly above every value never puts a value on its upper edge, so no value needs
    clamping into the last bin (a clamped value would land one bin low once the range grows).

    Example:
        >>> pow2_above(torch.tensor([0.0, 0.3, 0.5, 3.0], dtype=torch.float64)).tolist()
        [0.0, 0.5, 1.0, 4.0]
    """
    _, exponent = torch.frexp(amax)  # 2**(exponent - 1) <= amax < 2**exponent
    return torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), exponent), amax)


def grow_exponents(old_range: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Smallest ``k >= 0`` per channel with ``old_range * 2**k >= amax``.

    Example:
        >>> grow_exponents(torch.tensor([1.0, 1.0]), torch.tensor([0.5, 3.0])).tolist()
        [0, 2]
    """
    ratio = torch.where(old_range > 0, amax / old_range.clamp(min=1e-300), torch.ones_like(amax))
    k = torch.ceil(torch.log2(ratio.clamp(min=1.0))).to(torch.int64)
    return torch.where(old_range * torch.exp2(k.to(old_range.dtype)) < amax, k + 1, k)


def merge_exponents(k: torch.Tensor, num_bins: int) -> torch.Tensor:
    """``k`` capped where merging ``2**k`` bins already puts every count in bin 0.

    Example:
        >>> merge_exponents(torch.tensor([1, 40]), 8).tolist()
        [1, 4]
    """
    return k.clamp(max=int(math.log2(num_bins)) + 1)


def merge_bins(counts: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Re-bin each row of ``counts`` by merging ``2**k[row]`` neighbouring bins (exact sums).

    Example:
        >>> merge_bins(torch.tensor([[1, 2, 3, 4]]), torch.tensor([1])).tolist()
        [[3, 7, 0, 0]]
    """
    num_bins = counts.shape[1]
    factor = torch.pow(2, k).unsqueeze(1)
    cum = torch.cat([counts.new_zeros(counts.shape[0], 1), torch.cumsum(counts, 1)], 1)
    j = torch.arange(num_bins + 1, device=counts.device).unsqueeze(0)
    edges = (j * factor).clamp_(max=num_bins)
    bounded = cum.gather(1, edges)
    return bounded[:, 1:] - bounded[:, :-1]


def regrid(counts: torch.Tensor, old_range: torch.Tensor, new_range: torch.Tensor) -> torch.Tensor:
    """Rows of ``counts`` over ``[0, old_range)`` moved onto the wider ``[0, new_range)``.

    Both ranges are powers of two per row (``new >= old``); a row whose old range is 0 saw only
    zeros, which sit in bin 0 on any range, and stays as it is.

    Args:
        counts: ``(C, num_bins)`` integer counts.
        old_range, new_range: ``(C,)`` float64 ranges.

    Returns:
        The ``(C, num_bins)`` counts on ``new_range``, exactly those of binning the same values
        there directly.

    Example:
        >>> regrid(torch.tensor([[4, 4, 0, 2]]), torch.tensor([2.0], dtype=torch.float64),
        ...        torch.tensor([8.0], dtype=torch.float64)).tolist()
        [[10, 0, 0, 0]]
    """
    k = torch.where(old_range > 0, grow_exponents(old_range, new_range), 0)
    if not bool((k > 0).any()):
        return counts
    return merge_bins(counts, merge_exponents(k, counts.shape[1]))
