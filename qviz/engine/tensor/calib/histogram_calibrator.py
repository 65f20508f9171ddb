"""HistogramCalibrator: an exact histogram of |x| from which every amax method can be computed.

Counts are int64, so no bin ever saturates (float counters stop counting at 2^24). The histogram has
a fixed number of bins over ``[0, range]``, where the range is a power of two: the smallest that
covers the largest |x| seen. Bins are right-closed, ``(lo, hi]`` (bin 0 also holds 0): a value equal
to the range belongs to the last bin by the binning rule itself, so it stays in the right bin when
the range grows, and a bin's upper edge as an amax clips none of its values. When a later tensor
exceeds it, the range doubles ``k`` times and each new bin is the exact sum of ``2^k`` old bins, so
many collects of growing range stay exact and never grow the bin count. Because the range depends
only on the largest |x|, never on which tensor came first, the histogram is the same for any order
of the same tensors, and histograms of disjoint shards merge exactly
(``qviz.engine.distributed.sharded``). The exact running max is kept beside it, and no method
returns an amax above it.

Example:
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> calib = HistogramCalibrator(8)
    >>> calib.collect(torch.randn(10_000, generator=g))
    >>> {m: round(float(calib.compute_amax(m)), 2) for m in ("max", "percentile", "mse")}
    {'max': 4.34, 'percentile': 4.1, 'mse': 4.16}
"""

from __future__ import annotations

import copy

import torch

from qviz.engine.qparams import validate_num_bits
from qviz.engine.tensor.calib.base import CalibMethod, Calibrator
from qviz.engine.tensor.calib.pickers import entropy_amax, mse_amax, percentile_amax
from qviz.engine.tensor.calib.pow2_ranges import (
    grow_exponents,
    merge_bins,
    merge_exponents,
    pow2_ceil,
)
from qviz.errors import ConfigError

_BLOCK = 1 << 20  # elements binned per step: 4 MiB of float32 scratch, fits in cache


class HistogramCalibrator(Calibrator):
    """Collect a histogram of |x| (per tensor or per kept axis); pick amax by any method.

    Args:
        num_bits: bit width the amax is chosen for.
        axis: axes that keep their own histogram and amax (None: one for the whole tensor).
        unsigned: negative inputs are an error.
        num_bins: bins per histogram (2048, as TensorRT uses).
        skip_zeros: leave exact zeros out of the histogram (e.g. the zeros a ReLU makes).
        name: what error messages call the tensor.
        skip_nonfinite: skip NaN/Inf tensors with a warning instead of raising.

    Example:
        >>> import torch
        >>> calib = HistogramCalibrator(8, num_bins=4)
        >>> calib.collect(torch.tensor([0.1, 0.2, -0.9, 2.0]))
        >>> calib.histogram()[0].tolist()
        [2, 1, 0, 1]
    """

    def __init__(
        self,
        num_bits: int = 8,
        axis: int | tuple[int, ...] | None = None,
        unsigned: bool = False,
        num_bins: int = 2048,
        skip_zeros: bool = False,
        *,
        name: str | None = None,
        skip_nonfinite: bool = False,
    ) -> None:
        if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 2:
            raise ConfigError(f"num_bins must be an int >= 2, got {num_bins!r}")
        self._num_bins = num_bins
        self._skip_zeros = bool(skip_zeros)
        super().__init__(num_bits, axis, unsigned, name=name, skip_nonfinite=skip_nonfinite)

    def reset(self) -> None:
        super().reset()
        self._counts: torch.Tensor | None = None  # (C, num_bins) int64
        self._range: torch.Tensor | None = None  # (C,) float64, upper edge of each histogram
        self._calib_amax: torch.Tensor | None = None  # (C,) float32, exact running max

    @property
    def num_bins(self) -> int:
        return self._num_bins

    def collect(self, x: torch.Tensor) -> None:
        """Add |x| to the histogram, growing its range exactly when x exceeds it."""
        flat, keep = self._channels_first(x)
        local = self._extremes(flat, x.shape)
        if local is None:
            return
        device = self._bind(keep, flat.device)
        hist_range = self._grow(local.to(device, torch.float64))
        counts = self._bin(flat, hist_range.to(flat.device))
        self._counts += counts.to(device)
        local = local.to(device, torch.float32)
        self._calib_amax = (
            local if self._calib_amax is None else torch.maximum(self._calib_amax, local)
        )
        self.num_batches += 1
        self.num_elements += int(counts.sum()) if self._skip_zeros else flat.numel()

    def _grow(self, amax: torch.Tensor) -> torch.Tensor:
        if self._range is None:
            self._range = pow2_ceil(amax)
            self._counts = torch.zeros(
                amax.numel(), self._num_bins, dtype=torch.int64, device=amax.device
            )
            return self._range
        empty = self._range == 0
        k = grow_exponents(self._range, amax)
        if bool((k > 0).any()):
            merge = merge_exponents(torch.where(empty, 0, k), self._num_bins)
            self._counts = merge_bins(self._counts, merge)
        grown = self._range * torch.exp2(k.to(torch.float64))
        # A histogram that saw only zeros takes the new range as is: its counts sit in bin 0.
        self._range = torch.where(empty, pow2_ceil(amax), grown)
        return self._range

    def _bin(self, flat: torch.Tensor, hist_range: torch.Tensor) -> torch.Tensor:
        """Bin counts of |flat| per row, in cache-sized blocks through two reused scratch buffers.

        Working block by block (about a million elements) is 4x faster than whole-tensor passes,
        which spend their time faulting in fresh temporaries, and bounds the extra memory.
        """
        channels, m = flat.shape
        n = self._num_bins
        mult = torch.where(hist_range > 0, n / hist_range.clamp(min=1e-300), 0.0).to(flat.dtype)
        rows_per_block = max(1, _BLOCK // m)
        cols = min(m, _BLOCK)
        size = min(flat.numel(), rows_per_block * cols)
        fbuf = torch.empty(size, dtype=flat.dtype, device=flat.device)
        ibuf = torch.empty(size, dtype=torch.int32, device=flat.device)
        offsets = (
            torch.arange(rows_per_block, device=flat.device, dtype=torch.int32).unsqueeze(1) * n
        )
        counts = torch.zeros(channels, n, dtype=torch.int64, device=flat.device)
        for r0 in range(0, channels, rows_per_block):
            rows = flat[r0 : r0 + rows_per_block]
            k = rows.shape[0]
            for c0 in range(0, m, cols):
                block = rows[:, c0 : c0 + cols]
                scaled = fbuf[: block.numel()].view(block.shape)
                torch.abs(block, out=scaled).mul_(mult[r0 : r0 + k].unsqueeze(1))
                # right-closed bins: ceil(v) - 1 (0 and the first bin's values: bin 0)
                scaled.ceil_().sub_(1).clamp_(min=0, max=n - 1)
                idx = ibuf[: block.numel()].view(block.shape)
                idx.copy_(scaled)
                if k > 1:
                    idx += offsets[:k]
                counts[r0 : r0 + k] += torch.bincount(idx.view(-1), minlength=k * n).view(k, n)
        if self._skip_zeros:
            counts[:, 0] -= (flat == 0).sum(1)
        return counts

    def compute_amax(
        self,
        method: CalibMethod | str,
        *,
        percentile: float = 99.99,
        start_bin: int = 128,
        stride: int = 1,
    ) -> torch.Tensor:
        """Pick amax from the histogram.

        Args:
            method: ``"max"``, ``"percentile"``, ``"entropy"`` or ``"mse"`` (or a CalibMethod).
            percentile: for ``"percentile"``, the share of |x| mass to keep unclipped.
            start_bin: for ``"entropy"``/``"mse"``, the smallest candidate threshold, in bins.
            stride: for ``"entropy"``/``"mse"``, the step between candidate thresholds, in bins.
        """
        method = CalibMethod.parse(method)
        self._require_data()
        if method is CalibMethod.MAX:
            return self._shape_amax(self._calib_amax)
        common = {"num_bits": self._num_bits, "unsigned": self._unsigned}
        if method is CalibMethod.PERCENTILE:
            amax = percentile_amax(self._counts, self._range, percentile)
        elif method is CalibMethod.ENTROPY:
            amax = entropy_amax(
                self._counts, self._range, start_bin=start_bin, stride=stride, **common
            )
        else:
            amax = mse_amax(self._counts, self._range, start_bin=start_bin, stride=stride, **common)
        # A threshold above the largest |x| seen clips nothing more and only coarsens the grid.
        capped = torch.minimum(amax.to(self._device), self._calib_amax.to(torch.float64))
        return self._shape_amax(capped)

    def with_num_bits(self, num_bits: int) -> HistogramCalibrator:
        """A copy with the same statistics and another bit width: what would ``num_bits`` pick?

        Example:
            >>> calib = HistogramCalibrator(8)
            >>> calib.collect(torch.randn(10_000, generator=torch.Generator().manual_seed(0)))
            >>> four = calib.with_num_bits(4)
            >>> four.num_bits, bool(four.compute_amax("mse") < calib.compute_amax("mse"))
            (4, True)
        """
        other = copy.deepcopy(self)
        other._num_bits = validate_num_bits(num_bits, unsigned=self._unsigned)
        return other

    def histogram(self, channel: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Counts ``(num_bins,)`` int64 and bin edges ``(num_bins + 1,)`` of one channel, on CPU."""
        self._require_data()
        if not 0 <= channel < self._counts.shape[0]:
            raise ConfigError(
                f"{self._label()} has {self._counts.shape[0]} channel histogram(s); "
                f"channel={channel} is out of range"
            )
        edges = torch.linspace(
            0.0, float(self._range[channel]), self._num_bins + 1, dtype=torch.float64
        )
        return self._counts[channel].cpu(), edges

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", num_bins={self._num_bins})"
