"""Pure metric functions comparing a reference tensor with its quantized version.

Example:
    >>> import torch
    >>> x = torch.tensor([1.0, -2.0, 3.0])
    >>> round(sqnr(x, x + 0.01), 2)
    46.69
    >>> clipped_fraction(x, 2.5)
    0.3333333333333333
"""

from __future__ import annotations

import math

import torch

from qviz.errors import ConfigError

__all__ = ["clipped_fraction", "sqnr"]


def _pair(reference: torch.Tensor, test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if reference.shape != test.shape:
        raise ConfigError(
            f"cannot compare tensors of shapes {tuple(reference.shape)} and {tuple(test.shape)}"
        )
    return reference.detach().double(), test.detach().to(reference.device).double()


def sqnr(reference: torch.Tensor, test: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB: ``10 log10(sum(ref^2) / sum((ref - test)^2))``.

    ``inf`` when the two are equal; ``-inf`` when the reference is all zeros and the test is not.
    """
    ref, out = _pair(reference, test)
    signal = float(ref.square().sum())
    noise = float((ref - out).square().sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def clipped_fraction(x: torch.Tensor, amax: float | torch.Tensor) -> float:
    """Share of the elements of ``x`` with ``|x| > amax`` (a per-channel amax broadcasts)."""
    amax = torch.as_tensor(amax, dtype=x.dtype, device=x.device)
    return float((x.detach().abs() > amax).double().mean())
