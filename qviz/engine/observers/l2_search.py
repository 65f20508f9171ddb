"""The HistogramObserver's L2 search for the range to quantize with, vectorized and exact.

torch's HistogramObserver (after caffe2's ``NormMinimization``) narrows the histogram range from
both ends while the estimated L2 quantization error keeps falling:

1. Two quantile bounds start at ``alpha = 0`` and ``beta = 1`` and move by ``1e-5`` per step
   (floating-point sums, so the k-th bound is the k-fold sum, not ``k * 1e-5``). At each step
   the candidate start bin ``l`` is the first bin (from the current start) whose cumulative count
   reaches ``next_alpha * total`` and the candidate end bin ``r`` the last (from the current end)
   whose cumulative count stays within ``next_beta * total`` (float32 comparisons).
2. The side that would drop more bins moves (ties move the end); a step that moves nothing just
   advances ``beta``.
3. Each move that changes the bins is scored by the L2 error of quantizing the histogram onto
   ``dst_nbins`` levels spread over the candidate range (each source bin's mass spread uniformly,
   integrated against the squared distance to its level centres); the search stops at the first
   move whose error exceeds the best so far, and returns the last accepted ``(start, end)``.

Which bins move never depends on the errors, only on the cumulative counts. So :func:`_moves`
walks the moves with binary searches (jumping over whole runs of steps that move nothing, where
torch takes up to 100,000 Python iterations with a tensor read each), and
:func:`quantization_errors` scores a batch of candidate ranges in one ``(K, bins)`` computation
that performs torch's tensor operations element for element, so the errors and the chosen range
are bit-identical to torch's.

Worked example: 1,000 values in each of the lower 1024 of 2048 bins and one outlier in the
last bin (total 1,024,001). The first step's thresholds are ``1e-5 * total = 10.24`` and
``total - 10.24``: no bin can go at the start (bin 0 alone holds 1,000), while at the end every
bin from 1023 up lies above the upper threshold, so the end moves to 1022 in one go (the outlier
is clipped, the levels get twice as fine) and the error falls to 0.5773. The next move, to 1021,
raises it to 0.5798, so the search returns ``(0, 1022)``. On unimodal data without such gaps it
mostly stops after the first move (one bin at either end).

Example:
    >>> import torch
    >>> hist = torch.zeros(2048)
    >>> hist[:1024] = 1000.0
    >>> hist[2047] = 1.0                     # one outlier
    >>> l2_search(hist, 0.0, 1.0, dst_nbins=256)
    (0, 1022)
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
import struct
from collections.abc import Iterator, Sequence

import torch

_STEP = 1e-5  # quantile granularity of torch's search
_NUM_STEPS = 100_010  # more steps than the bounds can take before they meet
_FLOAT32 = struct.Struct("f")


def _to_float32(value: float) -> float:
    """``value`` rounded to float32 (how torch compares a Python float with a float32 tensor)."""
    return _FLOAT32.unpack(_FLOAT32.pack(value))[0]


@functools.lru_cache(maxsize=1)
def _quantile_bounds() -> tuple[list[float], list[float], list[float]]:
    """alpha_k, beta_k (k-fold float sums of the step, as torch's loop) and -beta_k."""
    steps = itertools.repeat(_STEP, _NUM_STEPS - 1)
    alphas = list(itertools.accumulate(steps, operator.add, initial=0.0))
    steps = itertools.repeat(_STEP, _NUM_STEPS - 1)
    betas = list(itertools.accumulate(steps, operator.sub, initial=1.0))
    return alphas, betas, [-b for b in betas]


def _moves(cumsum: list[float], total: float) -> Iterator[tuple[int, int]]:
    """Every ``(start, end)`` torch's search would score, in order (see the module docstring)."""
    alphas, betas, neg_betas = _quantile_bounds()

    def end_key(k: int) -> float:  # non-decreasing in k: -(float32 upper threshold of step k)
        return -_to_float32(betas[k] * total)

    i = j = start = 0
    end = len(cumsum) - 1
    while alphas[i] < betas[j]:
        low = bisect.bisect_left(cumsum, _to_float32(alphas[i + 1] * total))
        high = bisect.bisect_right(cumsum, _to_float32(betas[j + 1] * total)) - 1
        left = min(max(low, start), end)
        right = max(min(high, end), start)
        if left - start > end - right:
            start, i = left, i + 1
            yield start, end
        elif right != end:
            end, j = right, j + 1
            yield start, end
        else:  # nothing moves: beta advances until the end bin would move or the bounds meet
            stop = bisect.bisect_left(neg_betas, -alphas[i], lo=j + 1)
            if start < end:
                moves_end = bisect.bisect_right(
                    range(_NUM_STEPS), -cumsum[end], lo=j + 2, key=end_key
                )
                stop = min(stop, moves_end - 1)
            j = stop


def _cube_integral(begin: torch.Tensor, end: torch.Tensor, density: torch.Tensor) -> torch.Tensor:
    """``density * (end^3 - begin^3) / 3``: L2 mass of a uniform density between two offsets."""
    return density * ((end * end * end - begin * begin * begin) / 3)


def quantization_errors(
    hist: torch.Tensor,
    bin_width: float,
    dst_nbins: int,
    starts: Sequence[int],
    ends: Sequence[int],
) -> torch.Tensor:
    """L2 error of quantizing ``hist`` onto ``dst_nbins`` levels over each candidate bin range.

    Candidate ``k`` spans bins ``starts[k]..ends[k]``; the result ``(K,)`` float32 holds, element
    for element, what torch's ``HistogramObserver._compute_quantization_error`` returns (0 where
    the level width is 0).

    Example:
        >>> import torch
        >>> h = torch.ones(8)
        >>> quantization_errors(h, 0.25, 4, [0, 2], [7, 5]).tolist()
        [0.1666666567325592, 0.6666666269302368]
    """
    bins = hist.numel()
    first = torch.tensor(starts, dtype=torch.int64, device=hist.device)
    last = torch.tensor(ends, dtype=torch.int64, device=hist.device)
    dst_width64 = bin_width * (last - first + 1).to(torch.float64) / dst_nbins
    dst_width = dst_width64.to(torch.float32).unsqueeze(1)
    half = (dst_width64 / 2).to(torch.float32).unsqueeze(1)
    neg_half = (-dst_width64 / 2).to(torch.float32).unsqueeze(1)

    src_begin = (torch.arange(bins, device=hist.device) - first.unsqueeze(1)) * bin_width
    src_end = src_begin + bin_width
    level_begin = torch.clamp(
        torch.div(src_begin, dst_width, rounding_mode="floor"), 0, dst_nbins - 1
    )
    level_end = torch.clamp(torch.div(src_end, dst_width, rounding_mode="floor"), 0, dst_nbins - 1)
    density = hist / bin_width

    error = _cube_integral(
        src_begin - (level_begin + 0.5) * dst_width, half.expand_as(src_begin), density
    )
    error = error + (level_end - level_begin - 1) * _cube_integral(neg_half, half, density)
    error = error + _cube_integral(neg_half, src_end - (level_end * dst_width + half), density)
    return torch.where(dst_width64 == 0, 0.0, error.sum(1))


def l2_search(
    hist: torch.Tensor, min_val: float, max_val: float, dst_nbins: int
) -> tuple[int, int]:
    """torch's HistogramObserver search: the ``(start, end)`` bins of the range to quantize.

    Args:
        hist: float32 counts on CPU, ``bins`` equal bins over ``[min_val, max_val]``.
        min_val, max_val: the histogram range.
        dst_nbins: number of quantization levels (``2 ** bits`` of the dtype).

    Returns:
        The first and last bin kept; the range is ``min_val + width * start`` to
        ``min_val + width * (end + 1)``.

    Example:
        >>> import torch
        >>> l2_search(torch.ones(2048), 0.0, 1.0, dst_nbins=256)
        (0, 2046)
    """
    bins = hist.numel()
    if max_val == min_val:  # zero-width bins: every error is 0 and the range stays [min, min]
        return 0, bins - 1
    bin_width = (max_val - min_val) / bins
    moves = _moves(torch.cumsum(hist, dim=0).tolist(), float(torch.sum(hist)))
    best, best_error = (0, bins - 1), math.inf
    size = 16  # candidates scored per batch; the search usually stops within the first few
    while chunk := list(itertools.islice(moves, size)):
        starts, ends = zip(*chunk, strict=True)
        errors = quantization_errors(hist, bin_width, dst_nbins, starts, ends).tolist()
        for candidate, error in zip(chunk, errors, strict=True):
            if error > best_error:
                return best
            best, best_error = candidate, error
        size = min(4 * size, 256)
    return best
