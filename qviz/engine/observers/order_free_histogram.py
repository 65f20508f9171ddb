"""OrderFreeHistogramObserver: a histogram that is the same for any batch order or sharding.

torch's HistogramObserver keeps ``bins`` bins over the running ``[min_val, max_val]`` and, when a
batch widens the range, spreads the old counts onto the new bins (a lossy re-binning); so its
histogram, and the range its L2 search picks, depend on the order of the batches, and a merge of
several processes' histograms can only approximate one process's.

This observer fixes the bin edges instead. Its histogram has ``2 * bins`` equal bins over
``[-R, R)``, value ``x`` in bin ``floor(x * bins / R) + bins``, where ``R`` is a power of two:
the smallest strictly above the largest ``|x|`` seen. When a batch exceeds ``R``, the range
doubles ``k`` times and each new bin is the exact sum of ``2**k`` old ones (on each side of
zero, see :mod:`~qviz.engine.tensor.calib.pow2_ranges`), which is where binning the old values
directly on the new range would have put them. Counts are int64. So the histogram is a function
of the multiset of values seen, bit for bit: any order of the batches and any split into shards
give the same counts, and histograms of several processes merge exactly (grow each to the
largest range, add the counts: :mod:`qviz.engine.distributed.merge_rules`).

qparams come from the same L2 search as HistogramObserver
(:func:`~qviz.engine.observers.l2_search.l2_search`), run on the bins from the first to the last
non-empty one, and the chosen range is clipped to the observed ``[min_val, max_val]``. The
histogram's resolution differs from torch's: its bin width is ``R / bins``, with ``R`` up to
twice the largest ``|x|``, so the observed range spans between ``bins / 2`` and ``2 * bins`` bins
(torch: always ``bins``). Use it where calibration must give the same model for any batch order
or any number of processes (``qviz.calibrate(..., group=...)``); HistogramObserver remains the
one that matches torch's qparams bit for bit.

Example:
    >>> import torch
    >>> a, b = OrderFreeHistogramObserver(bins=8), OrderFreeHistogramObserver(bins=8)
    >>> for x in (torch.tensor([-0.5, 0.25]), torch.tensor([3.0])):
    ...     _ = a(x)
    >>> for x in (torch.tensor([3.0]), torch.tensor([-0.5, 0.25])):
    ...     _ = b(x)
    >>> torch.equal(a.counts, b.counts), float(a.hist_range)
    (True, 4.0)
    >>> a.calculate_qparams()
    (tensor([0.0137]), tensor([36], dtype=torch.int32))
"""

from __future__ import annotations

from typing import Any

import torch

from qviz.engine.observers.base import check_int
from qviz.engine.observers.l2_search import l2_search
from qviz.engine.observers.uniform import UniformQuantizationObserverBase
from qviz.engine.tensor.calib.pow2_ranges import (
    grow_exponents,
    merge_bins,
    merge_exponents,
    pow2_above,
)
from qviz.errors import ConfigError

_BLOCK = 1 << 17  # elements binned per step: the scratch buffers stay in cache
_F32_SCALES = (2.0**-120, 2.0**120)  # a float32 multiplier is exact (a normal power of two) here


def regrid_signed(counts: torch.Tensor, old_range: float, new_range: float) -> torch.Tensor:
    """Signed counts (``2 * bins`` bins over ``[-old_range, old_range)``) moved onto the wider
    ``[-new_range, new_range)``, both powers of two: each side merged outward from zero.

    Example:
        >>> regrid_signed(torch.tensor([0, 1, 2, 0]), 1.0, 2.0).tolist()
        [0, 1, 2, 0]
        >>> regrid_signed(torch.tensor([3, 1, 2, 5]), 1.0, 2.0).tolist()
        [0, 4, 7, 0]
    """
    if old_range <= 0 or new_range == old_range:
        return counts
    bins = counts.numel() // 2
    old, new = (torch.tensor([r], dtype=torch.float64) for r in (old_range, new_range))
    k = grow_exponents(old, new)
    k = merge_exponents(k.expand(2), bins).to(counts.device)
    sides = torch.stack([counts[:bins].flip(0), counts[bins:]])  # both from zero outward
    merged = merge_bins(sides, k)
    return torch.cat([merged[0].flip(0), merged[1]])


def signed_counts(x: torch.Tensor, bins: int, hist_range: float) -> torch.Tensor:
    """int64 counts of ``x`` in ``2 * bins`` equal bins over ``[-hist_range, hist_range)``
    (``hist_range`` a power of two above every ``|x|``, or 0 when ``x`` is all zeros).

    The index ``floor(x * bins / hist_range) + bins`` is exact: the multiplier is a power of two
    (computed in float64 where float32 could not hold it), so a product is exact unless it
    underflows, and an underflowing product (``|x * bins / hist_range| < 1``) only needs its
    sign: a negative one that rounded to zero is put in bin ``bins - 1``.

    Example:
        >>> signed_counts(torch.tensor([-0.75, -0.0, 0.1, 0.5]), 2, 1.0).tolist()
        [1, 0, 2, 1]
    """
    counts = torch.zeros(2 * bins, dtype=torch.int64, device=x.device)
    if hist_range == 0:
        counts[bins] = x.numel()
        return counts
    scale = bins / hist_range
    fits = x.dtype == torch.float32 and _F32_SCALES[0] <= scale <= _F32_SCALES[1]
    work = torch.float32 if fits else torch.float64
    flat = x.reshape(-1)
    size = min(flat.numel(), _BLOCK)
    scaled = torch.empty(size, dtype=work, device=x.device)
    index = torch.empty(size, dtype=torch.int64, device=x.device)
    for start in range(0, flat.numel(), _BLOCK):
        block = flat[start : start + _BLOCK]
        pos = scaled[: block.numel()]
        if block.dtype == work:
            torch.mul(block, scale, out=pos)
        else:
            pos.copy_(block).mul_(scale)
        if scale < 1:  # a tiny negative product may underflow to -0.0; its bin is still -1
            pos.masked_fill_((pos == 0) & (block < 0), -0.5)
        pos.floor_().add_(bins)
        idx = index[: block.numel()]
        idx.copy_(pos)
        counts += torch.bincount(idx, minlength=2 * bins)
    return counts


class OrderFreeHistogramObserver(UniformQuantizationObserverBase):
    """Per-tensor qparams by HistogramObserver's L2 search on an order-free histogram.

    The histogram does not depend on the order of the batches or on how they are split between
    processes: distributed calibration merges it exactly (see the module docstring).

    Args:
        bins: bins on each side of zero (a power of two; ``2 * bins`` in all).
        dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps: see
            :class:`~qviz.engine.observers.uniform.UniformQuantizationObserverBase`;
            ``qscheme`` is per-tensor affine (default) or symmetric.
        is_dynamic: must be False.

    Attributes:
        counts: int64, ``2 * bins`` equal bins over ``[-hist_range, hist_range)``.
        hist_range: float64 power of two above every ``|x|`` seen (0 before data or while every
            value seen was 0).

    Example:
        >>> import torch
        >>> obs = OrderFreeHistogramObserver.with_args(eps=2**-12, dtype=torch.int8)()
        >>> _ = obs(torch.linspace(-1.0, 1.0, 1001))
        >>> obs.calculate_qparams()
        (tensor([0.0078]), tensor([-1], dtype=torch.int32))
        >>> obs
        OrderFreeHistogramObserver(int8 per_tensor_affine [-128, 127] bins=2048 range=2 \
batches=1 min=-1 max=1)
    """

    counts: torch.Tensor
    hist_range: torch.Tensor

    def __init__(
        self,
        bins: int = 2048,
        dtype: torch.dtype = torch.quint8,
        qscheme: torch.qscheme | None = torch.per_tensor_affine,
        reduce_range: bool = False,
        quant_min: int | None = None,
        quant_max: int | None = None,
        factory_kwargs: dict[str, Any] | None = None,
        eps: float = torch.finfo(torch.float32).eps,
        is_dynamic: bool = False,
    ) -> None:
        super().__init__(
            dtype, qscheme, reduce_range, quant_min, quant_max, factory_kwargs, eps, is_dynamic
        )
        owner = type(self).__name__
        if self.is_dynamic:
            raise ConfigError(
                f"{owner} does not support dynamic quantization (is_dynamic=True); use "
                f"MovingAverageMinMaxObserver(averaging_constant=1) or PlaceholderObserver"
            )
        check_int(owner, "bins", bins)
        if bins < 2 or bins & (bins - 1):
            raise ConfigError(
                f"{owner}: bins must be a power of two >= 2 (its bins merge in pairs when the "
                f"range doubles), got {bins}; use e.g. bins=2048"
            )
        self.bins = bins
        self.dst_nbins = 2 ** torch.iinfo(self.dtype).bits
        device = self._device
        self.register_buffer("counts", torch.zeros(2 * bins, dtype=torch.int64, device=device))
        self.register_buffer("hist_range", torch.zeros((), dtype=torch.float64, device=device))
        self.register_buffer("min_val", torch.tensor(float("inf"), device=device))
        self.register_buffer("max_val", torch.tensor(float("-inf"), device=device))

    @torch.no_grad()
    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Add ``x_orig`` to the histogram, growing its range by doubling; return it unchanged."""
        x = self._input(x_orig)
        if x is None:
            return x_orig
        if x.dtype != torch.float64:
            x = x.to(torch.float32)  # exact for every narrower dtype
        x_min, x_max = torch.aminmax(x)
        self._check_finite(x, x_min, x_max)
        self._follow(x_min.device)
        amax = torch.max(-x_min, x_max).to(torch.float64)
        old = float(self.hist_range)
        new = max(old, float(pow2_above(amax)))
        self.counts.copy_(regrid_signed(self.counts, old, new))
        self.hist_range.fill_(new)
        self.counts.add_(signed_counts(x, self.bins, new))
        self._fold(x_min.to(torch.float32), x_max.to(torch.float32))
        self._count(x)
        return x_orig

    def _reset_statistics(self) -> None:
        super()._reset_statistics()
        self.counts.zero_()
        self.hist_range.zero_()

    def histogram(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Counts ``(2 * bins,)`` int64 and bin edges ``(2 * bins + 1,)`` float64, on CPU.

        Example:
            >>> obs = OrderFreeHistogramObserver(bins=2)
            >>> _ = obs(torch.tensor([-0.75, 0.1, 0.5]))
            >>> [t.tolist() for t in obs.histogram()]
            [[1, 0, 1, 1], [-1.0, -0.5, 0.0, 0.5, 1.0]]
        """
        edges = torch.linspace(-1.0, 1.0, 2 * self.bins + 1, dtype=torch.float64)
        return self.counts.detach().cpu(), edges * float(self.hist_range)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, zero_point)``, each of shape ``(1,)``: the L2 search on the non-empty span
        of the histogram, clipped to the observed range.

        Raises:
            CalibrationError: nothing was observed yet.
        """
        if not self._has_range():
            raise self._no_data_error()
        counts = self.counts.detach().cpu()
        seen = torch.nonzero(counts).flatten()
        first, last = int(seen[0]), int(seen[-1])
        width = float(self.hist_range) / self.bins  # a power of two: the edges below are exact
        low_edge = (first - self.bins) * width
        high_edge = (last + 1 - self.bins) * width
        hist = counts[first : last + 1].to(torch.float32)
        start, end = l2_search(hist, low_edge, high_edge, self.dst_nbins)
        low = torch.tensor(low_edge + width * start, device=self.min_val.device)
        high = torch.tensor(low_edge + width * (end + 1), device=self.min_val.device)
        return self._calculate_qparams(torch.max(low, self.min_val), torch.min(high, self.max_val))

    def extra_repr(self) -> str:
        return (
            f"{self._config_repr()} bins={self.bins} range={float(self.hist_range):.4g} "
            f"{self._range_repr()}"
        )
