"""Statistics that accumulate batch by batch, so that no activation is kept between batches.

:class:`PairStats` compares a reference tensor with a test tensor (SQNR, MSE, cosine similarity,
max abs error) over any number of batches; :class:`GridStats` measures a float tensor against an
affine quantization grid (its range, the share of values beyond the grid, the rounding error in
steps). Sums are kept in float64.

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
from dataclasses import dataclass

import torch

__all__ = ["GridStats", "PairStats"]


def _sum_sq(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t, dtype=torch.float64) ** 2)


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.sum(a.double() * b.double()))


@dataclass
class PairStats:
    """Running comparison of a reference (float) tensor with a test (quantized) one.

    SQNR is ``10 log10(sum(ref^2) / sum((ref - test)^2))`` over every element of every batch:
    the float tensor is the signal.
    """

    count: int = 0
    ref_sq: float = 0.0
    test_sq: float = 0.0
    err_sq: float = 0.0
    dot: float = 0.0
    max_abs: float = 0.0

    def update(self, reference: torch.Tensor, test: torch.Tensor) -> None:
        """Add one batch; both tensors must have the same number of elements."""
        ref = reference.detach().reshape(-1)
        out = test.detach().reshape(-1).to(ref.device, ref.dtype)
        err = out - ref
        self.count += ref.numel()
        self.ref_sq += _sum_sq(ref)
        self.test_sq += _sum_sq(out)
        self.err_sq += _sum_sq(err)
        self.dot += _dot(ref, out)
        if err.numel():
            self.max_abs = max(self.max_abs, float(err.abs().max()))

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


@dataclass
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
    err_sq: float = 0.0

    @property
    def grid_min(self) -> float:
        return self.scale * (self.quant_min - self.zero_point)

    @property
    def grid_max(self) -> float:
        return self.scale * (self.quant_max - self.zero_point)

    def update(self, x: torch.Tensor) -> None:
        """Add one batch of float values."""
        x = x.detach().reshape(-1).float()
        if not x.numel():
            return
        self.count += x.numel()
        self.low = min(self.low, float(x.min()))
        self.high = max(self.high, float(x.max()))
        half = self.scale / 2
        beyond = (x < self.grid_min - half) | (x > self.grid_max + half)
        self.outside += int(beyond.sum())
        q = torch.clamp(
            torch.round(x / self.scale) + self.zero_point, self.quant_min, self.quant_max
        )
        self.err_sq += _sum_sq((q - self.zero_point) * self.scale - x)

    @property
    def clipped(self) -> float:
        return self.outside / self.count if self.count else math.nan

    @property
    def rmse_scale(self) -> float:
        if not self.count or self.scale <= 0:
            return math.nan
        return math.sqrt(self.err_sq / self.count) / self.scale
