"""Pure amax pickers: histogram of |x| in, clipping threshold out.

Every function takes a batch of histograms ``counts`` of shape ``(C, N)`` (one row per channel,
``C == 1`` for per-tensor calibration) whose bins split ``[0, hist_range[c]]`` into ``N`` equal
bins, and returns the chosen amax per row as a float64 tensor of shape ``(C,)``. They never loop
over bins or elements in Python (DESIGN rule 10); the loops that remain run over channels only
where a per-channel matrix would be too large.

The three searches, with a worked example on a 2048-bin histogram of a ReLU activation:

* **percentile** (``99.99``): the smallest bin edge with 99.99 % of the |x| mass below it.
* **entropy** (TensorRT's KL-divergence calibration): bin 0 takes bin 1's count (so the spike of
  exact zeros a ReLU makes does not dominate), then for every candidate threshold bin ``i``
  (``start_bin, start_bin + stride, ..., N``) the reference distribution ``P`` is the first ``i``
  bins with everything beyond folded into bin ``i - 1``; ``Q`` squeezes those ``i`` bins into
  ``2^(num_bits-1)`` levels and spreads each level's count evenly back over its non-empty bins.
  The threshold with the smallest ``KL(P || Q)`` wins (the last one on ties, as TensorRT does).
  Here it is computed in closed form from prefix sums, so all ~1,900 candidates cost one
  ``(candidates x levels)`` gather instead of one Python loop over bins per candidate.
* **mse**: every candidate amax (a bin centre from ``start_bin`` on) fake-quantizes all bin
  centres; the expected squared error weighs them by their counts. Symmetric fake quantization
  is scale-invariant, so the squared-error matrix is built once in bin units and the whole search
  is one matrix product ``counts @ err.T``.

Example:
    >>> import torch
    >>> counts = torch.zeros(1, 2048, dtype=torch.int64)
    >>> counts[0, :1024] = 1                     # uniform |x| on [0, 0.5), range 1.0
    >>> round(float(percentile_amax(counts, torch.tensor([1.0]), 100.0)[0]), 4)
    0.5
"""

from __future__ import annotations

import functools
import math

import torch

from qviz.errors import ConfigError


def _check_counts(counts: torch.Tensor, hist_range: torch.Tensor) -> None:
    if counts.dim() != 2 or hist_range.shape != counts.shape[:1]:
        raise ConfigError(
            f"histograms must be (C, N) with one range per row; got counts {tuple(counts.shape)} "
            f"and hist_range {tuple(hist_range.shape)}"
        )


def _check_search(start_bin: int, stride: int, *, lowest: int, highest: int) -> None:
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ConfigError(f"stride must be a positive int, got {stride!r}")
    if (
        isinstance(start_bin, bool)
        or not isinstance(start_bin, int)
        or not lowest <= start_bin <= highest
    ):
        raise ConfigError(
            f"start_bin={start_bin!r} must be an int in {lowest}..{highest} for a histogram of "
            f"{highest + (1 if lowest == 0 else 0)} bins; lower start_bin or collect with more bins"
        )


def percentile_amax(
    counts: torch.Tensor, hist_range: torch.Tensor, percentile: float
) -> torch.Tensor:
    """Smallest bin edge with at least ``percentile`` % of the |x| mass at or below it.

    Taking the upper edge of the bin where the cumulative count reaches the target guarantees
    that at most ``100 - percentile`` % of the values are clipped (the left edge, NVIDIA's
    choice, clips a whole bin more, and interpolating inside the bin misplaces point masses
    such as saturated pixels); the result is within one bin width of ``numpy.percentile``.

    Args:
        counts: ``(C, N)`` bin counts of |x|.
        hist_range: ``(C,)`` upper edge of each row's histogram.
        percentile: in ``(0, 100]``.

    Example:
        >>> import torch
        >>> c = torch.tensor([[2, 2, 0, 0]])
        >>> float(percentile_amax(c, torch.tensor([4.0]), 50.0)[0])
        1.0
    """
    _check_counts(counts, hist_range)
    if not isinstance(percentile, int | float) or not 0.0 < float(percentile) <= 100.0:
        raise ConfigError(f"percentile must be in (0, 100], got {percentile!r}")
    cum = torch.cumsum(counts.to(torch.int64), dim=1)
    total = cum[:, -1:]
    # integer target: the smallest count that is at least `percentile` % of the total; a product
    # that float rounding lifts just above an integer (200000 * 0.999) is snapped back to it
    raw = total.to(torch.float64) * float(percentile) / 100.0
    snapped = torch.where((raw - raw.round()).abs() <= 1e-9 * raw.clamp(min=1.0), raw.round(), raw)
    target = torch.ceil(snapped).to(torch.int64)
    idx = torch.searchsorted(cum, target).clamp_(max=counts.shape[1] - 1).squeeze(1)
    width = hist_range.to(torch.float64) / counts.shape[1]
    amax = (idx + 1).to(torch.float64) * width
    return torch.where(total.squeeze(1) > 0, amax, torch.zeros_like(amax))


def _xlogx(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t > 0, t * torch.log(t.clamp(min=1e-300)), torch.zeros_like(t))


def _kl_divergences(h: torch.Tensor, candidates: torch.Tensor, levels: int) -> torch.Tensor:
    """KL(P_i || Q_i) for one histogram ``h`` (N,) and every candidate bin count ``i``: (K,)."""
    zero = h.new_zeros(1)
    c0 = torch.cat([zero, torch.cumsum(h, 0)])
    cnz = torch.cat([zero, torch.cumsum((h > 0).to(h.dtype), 0)])
    clog = torch.cat([zero, torch.cumsum(_xlogx(h), 0)])
    total = c0[-1]

    i = candidates.unsqueeze(1)  # (K, 1)
    g = torch.arange(levels + 1, dtype=torch.int64).unsqueeze(0)  # (1, levels+1)
    bounds = (g * i + levels - 1) // levels  # ceil(g * i / levels): first bin of each level
    sums = c0[bounds[:, 1:]] - c0[bounds[:, :-1]]
    nonzero = cnz[bounds[:, 1:]] - cnz[bounds[:, :-1]]
    log_q = torch.where(nonzero > 0, torch.log(sums.clamp(min=1e-300) / nonzero.clamp(min=1)), zero)

    inside = c0[candidates]  # mass of the first i bins: sum of Q before normalising
    tail = total - inside
    last = h[candidates - 1]
    p_log_p = clog[candidates] - _xlogx(last) + _xlogx(last + tail)
    last_level = ((candidates - 1) * levels).div(candidates, rounding_mode="floor")
    p_log_q = (sums * log_q).sum(1) + tail * log_q.gather(1, last_level.unsqueeze(1)).squeeze(1)
    kl = (p_log_p - p_log_q) / total - torch.log(total) + torch.log(inside.clamp(min=1e-300))
    # Mass folded into an empty last bin, or no mass inside at all, cannot be represented by Q.
    impossible = ((last == 0) & (tail > 0)) | (inside == 0)
    return torch.where(impossible, torch.full_like(kl, math.inf), kl)


def entropy_amax(
    counts: torch.Tensor,
    hist_range: torch.Tensor,
    *,
    num_bits: int = 8,
    unsigned: bool = False,
    start_bin: int = 128,
    stride: int = 1,
) -> torch.Tensor:
    """Threshold minimising KL(P || Q) between the histogram and its quantized version (TensorRT).

    Bin 0 is replaced by bin 1's count first (TensorRT's treatment of the zero spike).
    Candidates are bin edges ``i * width`` for ``i = start_bin, start_bin + stride, ..., N``;
    on ties the largest threshold wins.

    Example:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(100_000, generator=g).abs()   # heavy enough tail to clip
        >>> counts = torch.histc(x, 2048, 0, float(x.max())).to(torch.int64).unsqueeze(0)
        >>> amax = entropy_amax(counts, x.max().reshape(1))
        >>> bool(amax[0] < x.max())
        True
    """
    _check_counts(counts, hist_range)
    num_bins = counts.shape[1]
    _check_search(start_bin, stride, lowest=1, highest=num_bins)
    levels = 1 << (num_bits - 1 + int(unsigned))
    candidates = torch.arange(start_bin, num_bins + 1, stride, dtype=torch.int64)
    hist = counts.detach().to("cpu", torch.float64)  # a copy: the caller's counts stay intact
    hist[:, 0] = hist[:, 1]  # as TensorRT: the zero spike of a ReLU must not dominate the KL
    out = torch.zeros(counts.shape[0], dtype=torch.float64)
    for c in range(hist.shape[0]):  # one closed-form search per channel
        if hist[c].sum() == 0:
            continue
        kl = _kl_divergences(hist[c], candidates, levels)
        last_best = kl.numel() - 1 - int(torch.argmin(kl.flip(0)))
        out[c] = float(candidates[last_best])
    return out * (hist_range.detach().to("cpu", torch.float64) / num_bins)


@functools.lru_cache(maxsize=16)
def _mse_error_matrix(
    num_bins: int, num_bits: int, unsigned: bool, start_bin: int, stride: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate amax positions and their squared-error matrix, in bin units: (K,), (K, N)."""
    centers = torch.arange(num_bins, dtype=torch.float64) + 0.5
    cand = centers[start_bin::stride]
    quant_max = float(2 ** (num_bits - 1 + int(unsigned)) - 1)
    mult = (quant_max / cand).unsqueeze(1)
    # one (K, N) buffer worked in place: fresh temporaries of this size cost 4x more to fault in
    err = centers.unsqueeze(0) * mult
    err.round_().clamp_(0.0, quant_max).div_(mult).sub_(centers).square_()
    return cand, err


def mse_amax(
    counts: torch.Tensor,
    hist_range: torch.Tensor,
    *,
    num_bits: int = 8,
    unsigned: bool = False,
    start_bin: int = 128,
    stride: int = 1,
) -> torch.Tensor:
    """Threshold minimising the expected squared fake-quantization error over the histogram.

    Candidates are the centres of bins ``start_bin, start_bin + stride, ...`` (0-based) up to the
    last bin, as in NVIDIA's toolkit; the first minimum wins.

    Example:
        >>> import torch
        >>> counts = torch.zeros(1, 2048, dtype=torch.int64)
        >>> counts[0, :1000] = 5                       # uniform mass on the lower half
        >>> amax = mse_amax(counts, torch.tensor([2.0]))
        >>> 0.9 < float(amax[0]) < 1.0
        True
    """
    _check_counts(counts, hist_range)
    num_bins = counts.shape[1]
    _check_search(start_bin, stride, lowest=0, highest=num_bins - 1)
    cand, err = _mse_error_matrix(num_bins, num_bits, bool(unsigned), start_bin, stride)
    hist = counts.detach().to("cpu", torch.float64)
    expected = hist @ err.T  # (C, K)
    best = torch.argmin(expected, dim=1)
    amax = cand[best] * (hist_range.detach().to("cpu", torch.float64) / num_bins)
    return torch.where(hist.sum(1) > 0, amax, torch.zeros_like(amax))
