"""Statistics that accumulate batch by batch, so that no activation is kept between batches.

:class:`PairStats` compares a reference tensor with a test tensor (SQNR, MSE, cosine similarity,
max abs error) over any number of batches; :class:`GridStats` measures a float tensor against an
affine quantization grid (its range, the share of values beyond the grid, the rounding error in
steps). Each batch's sums are added exactly (:class:`ExactSum`), so the result does not depend
on the order of the batches, and statistics of shards merge (``merge``) into the statistics of
one run over all of them, bit for bit.

Example:
    >>> import torch
    >>> s = PairStats()
    >>> x = torch.linspace(-1, 1, 101)
    >>> s.update(x, x + 0.01)
    >>> s.update(2 * x, 2 * x - 0.01)
    >>> round(s.sqnr, 2), round(s.max_abs, 3)
    (39.29, 0.01)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from qviz.engine.pt2e.simulation import fake_quantize
from qviz.engine.qparams import clip_limits


class ExactSum:
    """A float sum that does not depend on the order of its terms: Shewchuk's partials (a few
    non-overlapping floats, as ``math.fsum`` keeps them), read correctly rounded. Sums kept on
    several processes and merged give the one-process sum bit for bit.

    Example:
        >>> a, b = ExactSum(), ExactSum()
        >>> for x in (1e16, 1.0, -1e16):
        ...     a.add(x)
        >>> b.add(1.0)
        >>> a.merge(b); a.value
        2.0
    """

    __slots__ = ("partials",)

    def __init__(self) -> None:
        self.partials: list[float] = []

    def add(self, x: float) -> None:
        i = 0
        for y in self.partials:
            if abs(x) < abs(y):
                x, y = y, x
            high = x + y
            low = y - (high - x)
            if low:
                self.partials[i] = low
                i += 1
            x = high
        self.partials[i:] = [x]

    def merge(self, other: ExactSum) -> None:
        for x in other.partials:
            self.add(x)

    @property
    def value(self) -> float:
        return math.fsum(self.partials)

    def __getstate__(self) -> list[float]:
        return self.partials

    def __setstate__(self, state: list[float]) -> None:
        self.partials = state


#: Elements per block when a statistic passes over a tensor. A block's temporaries stay small
#: enough for the allocator to hand back the memory it just freed; a fresh temporary of many
#: megabytes is page-faulted in on every call, which on resnet18 at 224x224 cost compare more
#: than its arithmetic. A tensor up to this size is one block.
BLOCK = 1 << 18


def blocks(n: int, size: int = BLOCK) -> range:
    """The start of each block of ``size`` elements in ``n`` (none for ``n == 0``)."""
    return range(0, n, size)


def _float(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().reshape(-1)
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _sum_of_products(a: torch.Tensor, b: torch.Tensor) -> float:
    """``sum(a * b)``; torch's float32 sum is a cascade sum, accurate to ~1e-8 relative here."""
    return float(torch.sum(a * b))


@dataclass
class PairStats:
    """Running comparison of a reference (float) tensor with a test (quantized) one.

    SQNR is ``10 log10(sum(ref^2) / sum((ref - test)^2))`` over every element of every batch:
    the float tensor is the signal.
    """

    count: int = 0
    max_abs: float = 0.0
    sums: dict[str, ExactSum] = field(
        default_factory=lambda: {k: ExactSum() for k in ("ref_sq", "test_sq", "err_sq", "dot")}
    )

    @property
    def ref_sq(self) -> float:
        return self.sums["ref_sq"].value

    @property
    def test_sq(self) -> float:
        return self.sums["test_sq"].value

    @property
    def err_sq(self) -> float:
        return self.sums["err_sq"].value

    @property
    def dot(self) -> float:
        return self.sums["dot"].value

    def merge(self, other: PairStats) -> None:
        """Add another process's (or shard's) statistics: the same as one run over both."""
        self.count += other.count
        self.max_abs = max(self.max_abs, other.max_abs)
        for key, value in other.sums.items():
            self.sums[key].merge(value)

    def update(self, reference: torch.Tensor, test: torch.Tensor) -> None:
        """Add one batch; both tensors must have the same number of elements.

        Each batch's sums are taken in the tensors' precision (float32 sums are cascade sums)
        and accumulated across batches in Python floats (float64).
        """
        ref = _float(reference)
        out = _float(test).to(ref.device, ref.dtype)
        self.count += ref.numel()
        for start in blocks(ref.numel()):  # each block's sums are added exactly
            a, b = ref[start : start + BLOCK], out[start : start + BLOCK]
            err = b - a
            self.sums["ref_sq"].add(_sum_of_products(a, a))
            self.sums["test_sq"].add(_sum_of_products(b, b))
            self.sums["err_sq"].add(_sum_of_products(err, err))
            self.sums["dot"].add(_sum_of_products(a, b))
            low, high = torch.aminmax(err)
            self.max_abs = max(self.max_abs, -float(low), float(high))

    @property
    def sqnr(self) -> float:
        """dB; ``inf`` when equal, ``-inf`` when the reference is zero and the test is not."""
        if self.err_sq == 0.0:
            return math.inf
        if self.ref_sq == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.ref_sq / self.err_sq)

    @property
    def mse(self) -> float:
        return self.err_sq / self.count if self.count else math.nan

    @property
    def cosine(self) -> float:
        norm = math.sqrt(self.ref_sq * self.test_sq)
        return self.dot / norm if norm > 0 else (1.0 if self.err_sq == 0.0 else 0.0)


@dataclass(kw_only=True)
class GridStats:
    """Running statistics of a float tensor against the grid ``scale * (q - zero_point)``.

    ``clipped`` counts values more than half a step beyond the grid's ends (clamping, not
    rounding, sets their error); ``rmse_scale`` is the RMS error of fake-quantizing, in steps:
    about ``1/sqrt(12) = 0.29`` for pure rounding noise, much more when values are clipped.

    Example:
        >>> import torch
        >>> g = GridStats(scale=0.1, zero_point=0, quant_min=-128, quant_max=127)
        >>> g.update(torch.rand(100_000, generator=torch.Generator().manual_seed(0)) * 10)
        >>> round(g.rmse_scale, 2), g.clipped > 0
        (0.29, False)
    """

    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    count: int = 0
    low: float = math.inf
    high: float = -math.inf
    outside: int = 0
    error: ExactSum = field(default_factory=ExactSum)
    #: The part of ``error`` carried by the clipped values (the rest is rounding).
    clip_error: ExactSum = field(default_factory=ExactSum)

    @property
    def err_sq(self) -> float:
        return self.error.value

    def merge(self, other: GridStats) -> None:
        """Add another process's (or shard's) statistics of the same tensor and grid."""
        self.count += other.count
        self.low, self.high = min(self.low, other.low), max(self.high, other.high)
        self.outside += other.outside
        self.error.merge(other.error)
        self.clip_error.merge(other.clip_error)

    @property
    def grid_min(self) -> float:
        return self.scale * (self.quant_min - self.zero_point)

    @property
    def grid_max(self) -> float:
        return self.scale * (self.quant_max - self.zero_point)

    def update(self, x: torch.Tensor) -> None:
        """Add one batch of float values."""
        x = _float(x).float()
        if not x.numel():
            return
        self.count += x.numel()
        low, high = torch.aminmax(x)
        self.low, self.high = min(self.low, float(low)), max(self.high, float(high))
        below, above = clip_limits(self.scale, self.zero_point, self.quant_min, self.quant_max)
        clips = float(low) < below or float(high) > above
        for start in blocks(x.numel()):  # each block's sums are added exactly
            part = x[start : start + BLOCK]
            q = fake_quantize(  # the converted model's own q/dq arithmetic, bit for bit
                part, self.scale, self.zero_point, self.quant_min, self.quant_max, torch.int32
            )
            err = q.sub_(part)  # q - part, in q's memory
            if clips:
                wide = part.double()
                beyond = (wide < below) | (wide > above)
                self.outside += int(beyond.sum())
                clipped = err[beyond]
                self.clip_error.add(_sum_of_products(clipped, clipped))
            self.error.add(float(torch.sum(err.mul_(err))))  # sum(err * err), in place

    @property
    def clipped(self) -> float:
        return self.outside / self.count if self.count else math.nan

    @property
    def clip_error_share(self) -> float:
        """Share of the fake-quantization error energy carried by the clipped values: near 1
        when clipping sets the error, 0 when rounding alone does."""
        total = self.err_sq
        return self.clip_error.value / total if total > 0 else (0.0 if self.count else math.nan)

    @property
    def rmse_scale(self) -> float:
        if not self.count or self.scale <= 0:
            return math.nan
        return math.sqrt(self.err_sq / self.count) / self.scale
