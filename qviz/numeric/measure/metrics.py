"""Pure metric functions comparing a reference tensor with its quantized version.

Example:
    >>> import torch
    >>> x = torch.tensor([1.0, -2.0, 3.0])
    >>> round(sqnr(x, x + 0.01), 2)
    46.69
    >>> clipped_fraction(x, 2.5)  # int8 levels 2.5/127 apart: 3.0 lies past 2.5 + half a step
    0.3333333333333333
"""

from __future__ import annotations

import math

import torch

from qviz.engine.qparams import clip_limits, quant_range, symmetric_scale
from qviz.errors import ConfigError


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


def clipped_fraction(
    x: torch.Tensor,
    amax: float | torch.Tensor | None = None,
    *,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
    scale: float | torch.Tensor | None = None,
    zero_point: int | torch.Tensor = 0,
    quant_min: int | None = None,
    quant_max: int | None = None,
) -> float:
    """Share of the elements of ``x`` that quantizing clips: beyond the rounding boundary of the
    grid's last level (:func:`qviz.engine.qparams.clip_limits`, half a step past the end level).

    Give the grid either as the tensor toolkit does, by ``amax`` (symmetric, ``num_bits`` /
    ``unsigned`` / ``narrow_range`` with the same defaults as ``fake_tensor_quant``; a
    per-channel amax broadcasts), or as PT2E does, by ``scale``, ``zero_point``, ``quant_min``
    and ``quant_max``.

    Example:
        >>> import torch
        >>> x = torch.tensor([0.0, 12.74, 12.76, -12.9])
        >>> clipped_fraction(x, scale=0.1, zero_point=0, quant_min=-128, quant_max=127)
        0.5
    """
    if (amax is None) == (scale is None):
        raise ConfigError(
            "clipped_fraction needs the grid either as amax= (symmetric) or as scale=, "
            "zero_point=, quant_min=, quant_max= (affine), not both and not neither"
        )
    if amax is not None:
        quant_min, quant_max = quant_range(num_bits, unsigned=unsigned, narrow_range=narrow_range)
        amax_t = torch.as_tensor(amax, dtype=torch.float64, device=x.device)
        scale, zero_point = symmetric_scale(amax_t, num_bits=num_bits, unsigned=unsigned), 0
    elif quant_min is None or quant_max is None:
        raise ConfigError("clipped_fraction with scale= also needs quant_min= and quant_max=")
    scale_t = torch.as_tensor(scale, dtype=torch.float64, device=x.device)
    zp_t = torch.as_tensor(zero_point, dtype=torch.float64, device=x.device)
    low, high = clip_limits(scale_t, zp_t, quant_min, quant_max)
    values = x.detach().double()
    if not values.numel():
        return 0.0
    return float(((values < low) | (values > high)).double().mean())


def histogram_clipped_fraction(
    counts: torch.Tensor, edges: torch.Tensor, low: float, high: float
) -> tuple[float, float, float]:
    """``(estimate, least, most)``: the share of a histogram's values beyond ``(low, high)``
    (the :func:`~qviz.engine.qparams.clip_limits` of a grid), when only the counts are known.

    ``least`` counts the bins that lie wholly beyond a limit, ``most`` every bin that reaches
    past one, so the raw values' :func:`clipped_fraction` lies in ``[least, most]`` whatever
    they were. ``estimate`` spreads each bin's count evenly over its width and counts the part
    beyond the limit; it never grows when the range widens, so of two ranges the wider one never
    shows more clipping. The three agree unless a limit falls inside a bin that holds values.

    Example:
        >>> import torch
        >>> counts, edges = torch.tensor([2.0, 2.0]), torch.tensor([0.0, 1.0, 2.0])
        >>> histogram_clipped_fraction(counts, edges, -1.0, 1.5)
        (0.25, 0.0, 0.5)
    """
    counts = counts.detach().cpu().double().reshape(-1)  # an observer's, on the model's device
    edges = edges.detach().cpu().double().reshape(-1)
    total = float(counts.sum())
    if total <= 0:
        return 0.0, 0.0, 0.0
    a, b = edges[:-1], edges[1:]
    width = b - a
    safe = torch.where(width > 0, width, torch.ones_like(width))
    above = torch.where(width > 0, ((b - high) / safe).clamp(0, 1), (a > high).double())
    below = torch.where(width > 0, ((low - a) / safe).clamp(0, 1), (b < low).double())
    estimate = float((counts * (above + below).clamp(max=1)).sum()) / total
    least = float(counts[(a > high) | (b < low)].sum()) / total
    most = float(counts[(b > high) | (a < low)].sum()) / total
    return estimate, least, most
