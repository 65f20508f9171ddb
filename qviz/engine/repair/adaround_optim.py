"""AdaRound's per-layer optimization (Nagel et al. 2020, "Up or Down? Adaptive Rounding").

Each weight ``w`` on a grid of step ``s`` and zero point ``z`` is rounded down or up:
``q = clamp(floor(w / s) + h + z, qmin, qmax)`` with ``h`` in {0, 1}. AdaRound relaxes ``h`` to
the rectified sigmoid ``h(V) = clip(sigmoid(V) * (zeta - gamma) + gamma, 0, 1)`` (zeta 1.1,
gamma -0.1) and learns ``V`` by minimizing, over cached inputs ``x`` of the quantized model,

    || f(W~ x) - f(W x_float) ||^2  +  lambda * sum(1 - |2 h(V) - 1| ** beta)

(``f``: the relu after the layer if there is one). The regularizer is off for a warm start
(the first 20 % of the iterations), then ``beta`` is annealed from 20 to 2 (cosine), which pushes
every ``h`` to 0 or 1; the result rounds up where ``h >= 0.5``. ``V`` starts where ``h`` equals
the fractional part of ``w / s``, so the soft weight starts at the float weight.

Example:
    >>> v = initial_v(torch.tensor([0.0, 0.25, 1.0]))
    >>> rectified_sigmoid(v)
    tensor([0.0000, 0.2500, 1.0000])
    >>> annealed_beta(20, 100, (20, 2), 0.2), annealed_beta(99, 100, (20, 2), 0.2) < 2.01
    (20.0, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from qviz.engine.repair.options import AdaRoundSettings  # defined with the other options
from qviz.errors import CalibrationError

ZETA, GAMMA = 1.1, -0.1


def rectified_sigmoid(v: torch.Tensor) -> torch.Tensor:
    """``h(V) = clip(sigmoid(V) * (zeta - gamma) + gamma, 0, 1)``.

    Example:
        >>> rectified_sigmoid(torch.tensor([-10.0, 0.0, 10.0]))
        tensor([0.0000, 0.5000, 1.0000])
    """
    return torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def initial_v(rest: torch.Tensor) -> torch.Tensor:
    """The ``V`` whose ``h(V)`` is ``rest`` (the fractional part of ``w / s``, in [0, 1]).

    Example:
        >>> rectified_sigmoid(initial_v(torch.tensor([0.5, 0.9])))
        tensor([0.5000, 0.9000])
    """
    return -torch.log((ZETA - GAMMA) / (rest - GAMMA) - 1.0)


def annealed_beta(
    step: int, iterations: int, beta_range: tuple[float, float], warm: float
) -> float:
    """``beta`` at ``step``: cosine from ``beta_range[0]`` (warm start over) to ``[1]`` (end).

    Example:
        >>> annealed_beta(60, 100, (20, 2), 0.2)
        11.0
    """
    start, end = beta_range
    first = warm * iterations
    rel = (step - first) / max(iterations - first, 1e-12)
    return end + 0.5 * (start - end) * (1.0 + math.cos(rel * math.pi))


def reconstruction_loss(out: torch.Tensor, ref: torch.Tensor, channel_dim: int) -> torch.Tensor:
    """Squared error summed over the channel dimension, averaged over the others.

    Example:
        >>> float(reconstruction_loss(torch.ones(2, 3), torch.zeros(2, 3), 1))
        3.0
    """
    return (out - ref).pow(2).sum(dim=channel_dim).mean()


def learn_rounding(
    layer: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    floor_q: torch.Tensor,
    rest: torch.Tensor,
    to_weight: Callable[[torch.Tensor], torch.Tensor],
    data: tuple[torch.Tensor, torch.Tensor],
    settings: AdaRoundSettings,
    name: str,
) -> torch.Tensor:
    """Learn one layer's rounding; returns ``h`` in {0, 1} (1: round up), shaped as the weight.

    Args:
        layer: ``layer(x, weight)``: the layer's output, channels last (relu applied if one
            follows it).
        floor_q: ``floor(w / s)`` of every weight; ``rest``: ``w / s - floor(w / s)``.
        to_weight: the dequantized weight for integer-valued (``floor_q + h``) codes, clamped
            to the grid.
        data: ``(inputs, reference outputs)``, samples along dimension 0, outputs channels last.
        settings: the optimization settings.
        name: the layer's node, named by errors.

    Example:
        >>> w = torch.tensor([[0.4, -1.3]])
        >>> x = torch.randn(64, 2)
        >>> h = learn_rounding(lambda x, w: x @ w.T, torch.floor(w), w - torch.floor(w),
        ...                    lambda q: q, (x, x @ w.T), AdaRoundSettings(iterations=50), "fc")
        >>> sorted(set(h.flatten().tolist())) <= [0.0, 1.0]
        True
    """
    inputs, ref = data
    gen = torch.Generator().manual_seed(settings.seed)
    v = initial_v(rest).detach().clone().requires_grad_(True)
    optimizer = torch.optim.Adam([v], lr=settings.lr)
    warm_end = settings.warm_start * settings.iterations
    for step in range(int(settings.iterations)):
        pick = torch.randint(
            0, inputs.shape[0], (min(settings.batch_size, inputs.shape[0]),), generator=gen
        )
        h = rectified_sigmoid(v)
        loss = reconstruction_loss(layer(inputs[pick], to_weight(floor_q + h)), ref[pick], -1)
        if step >= warm_end:
            beta = annealed_beta(
                step, int(settings.iterations), settings.beta_range, settings.warm_start
            )
            loss = loss + settings.reg_param * (1.0 - (2.0 * h - 1.0).abs().pow(beta)).sum()
        if not torch.isfinite(loss):
            raise CalibrationError(
                f"adaround: {name}: the loss is {float(loss)} at iteration {step}; nothing was "
                f"written (check the data and the float model)"
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (rectified_sigmoid(v.detach()) >= 0.5).to(floor_q.dtype)
