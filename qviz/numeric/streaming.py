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

from qviz.engine.qparams import clip_limits

__all__ = ["GridStats", "PairStats"]


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
    ref_sq: float = 0.0
    test_sq: float = 0.0
    err_sq: float = 0.0
    dot: float = 0.0
    max_abs: float = 0.0

    def update(self, reference: torch.Tensor, test: torch.Tensor) -> None:
        """Add one batch; both tensors must have the same number of elements.

        Each batch's sums are taken in the tensors' precision (float32 sums are cascade sums)
        and accumulated across batches in Python floats (float64).
        """
        ref = _float(reference)
        out = _float(test).to(ref.device, ref.dtype)
        err = out - ref
        self.count += ref.numel()
        self.ref_sq += _sum_of_products(ref, ref)
        self.test_sq += _sum_of_products(out, out)
        self.err_sq += _sum_of_products(err, err)
        self.dot += _sum_of_products(ref, out)
        if err.numel():
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
        x = _float(x).float()
        if not x.numel():
            return
        self.count += x.numel()
        low, high = torch.aminmax(x)
        self.low, self.high = min(self.low, float(low)), max(self.high, float(high))
        below, above = clip_limits(self.scale, self.zero_point, self.quant_min, self.quant_max)
        if float(low) < below or float(high) > above:
            wide = x.double()
            beyond = (wide < below) | (wide > above)
            self.outside += int(beyond.sum())
        q = torch.fake_quantize_per_tensor_affine(
            x, self.scale, self.zero_point, self.quant_min, self.quant_max
        )
        err = q - x
        self.err_sq += _sum_of_products(err, err)

    @property
    def clipped(self) -> float:
        return self.outside / self.count if self.count else math.nan

    @property
    def rmse_scale(self) -> float:
        if not self.count or self.scale <= 0:
            return math.nan
        return math.sqrt(self.err_sq / self.count) / self.scale
