"""What the integer grid does to one tensor, drawn: the figures of the tensor-quantization lesson.

Three pictures, each a pure function of a tensor that returns a matplotlib Figure (shown as a
PNG in a notebook, never through pyplot):

* :func:`ste_plot`: the fake-quantize staircase and the straight-through gradient, for a
  sweep of inputs;
* :func:`per_channel_gain_plot`: each output channel's range against the tensor's, and the SQNR
  each channel gains from its own scale, beside the rule ``20·log10(r)``;
* :func:`clipping_tradeoff_plot`: the squared error of fake quantization split into rounding
  (values inside ``[-amax, amax]``) and clipping (values beyond), for a sweep of amax, with the
  amax each calibration method picks.

All three use the symmetric, narrow-range grid of
:func:`~qviz.engine.tensor_quant.fake_tensor_quant` (``amax`` maps to ``2**(bits-1) - 1``). Text is
set at 11 pt or more,
so a figure shrunk to fit a narrow notebook output still reads at 10 px or more.

Example:
    >>> import torch
    >>> fig = clipping_tradeoff_plot(torch.randn(4096).abs(), num_bits=(8,), methods=("max",))
    >>> [ax.get_title() for ax in fig.axes]
    ['8 bits: squared error against amax']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from qviz.engine.tensor.calib import HistogramCalibrator
from qviz.engine.tensor.tensor_quant import fake_tensor_quant
from qviz.errors import ConfigError
from qviz.numeric.measure.metrics import sqnr
from qviz.viz.ranges.histograms import new_figure

#: Colour and line style of each calibration method's amax line.
METHOD_STYLE = {
    "max": ("tab:red", "-"),
    "percentile": ("tab:orange", "--"),
    "entropy": ("tab:green", "-."),
    "mse": ("tab:blue", ":"),
}
#: Points: a figure about 1100 px wide shown in an 850 px output still draws them at 12 px or more.
_FONT = 12


def _checked_tensor(x: Any, what: str, min_dim: int = 1) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() < min_dim or x.numel() == 0:
        raise ConfigError(
            f"{what} must be a non-empty torch.Tensor with at least {min_dim} dimension(s), got "
            f"{type(x).__name__}{tuple(x.shape) if isinstance(x, torch.Tensor) else ''}"
        )
    return x.detach().float()


def ste_plot(amax: float = 1.0, num_bits: int = 3, span: float = 2.0) -> Any:
    """The forward staircase of fake quantization and its straight-through gradient.

    Args:
        amax: the range ``[-amax, amax]`` of the grid.
        num_bits: bit width (3 makes the steps visible).
        span: the inputs drawn run over ``[-span, span]``; beyond ``amax`` they are clipped.

    Returns:
        A Figure with two axes: forward (identity and fake quantization) and backward (the
        gradient: 1 inside the range, 0 where values are clipped).

    Example:
        >>> fig = ste_plot(amax=1.0, num_bits=3)
        >>> [ax.get_title() for ax in fig.axes]
        ['forward: 3-bit grid, amax = 1', 'backward: straight-through estimator']
    """
    if not 0 < amax < span:
        raise ConfigError(f"ste_plot: need 0 < amax < span, got amax={amax}, span={span}")
    xs = torch.linspace(-span, span, 2001, requires_grad=True)
    ys = fake_tensor_quant(xs, amax, num_bits=num_bits)
    ys.sum().backward()
    x, grad = xs.detach(), xs.grad
    fig = new_figure(figsize=(10, 3.6), layout="constrained")
    ax_fwd, ax_bwd = fig.subplots(1, 2)
    for ax in (ax_fwd, ax_bwd):
        ax.axvspan(-span, -amax, color="0.9")
        ax.axvspan(amax, span, color="0.9", label="clipped: |x| > amax")
        ax.set_xlabel("x", fontsize=_FONT)
    ax_fwd.plot(x, x, "--", color="0.4", lw=1, label="identity")
    ax_fwd.plot(x, ys.detach(), color="tab:blue", lw=2, label="fake_tensor_quant")
    ax_fwd.set_title(f"forward: {num_bits}-bit grid, amax = {amax:g}", fontsize=_FONT + 1)
    ax_fwd.set_ylabel("output", fontsize=_FONT)
    ax_bwd.plot(x, grad, color="tab:orange", lw=2, label="d output / dx (STE)")
    ax_bwd.set_ylim(-0.1, 1.2)
    ax_bwd.set_title("backward: straight-through estimator", fontsize=_FONT + 1)
    ax_bwd.set_ylabel("gradient", fontsize=_FONT)
    for ax in (ax_fwd, ax_bwd):
        ax.legend(loc="upper left", fontsize=_FONT - 1)
        ax.tick_params(labelsize=_FONT - 1)
    return fig


def per_channel_gain_plot(weight: torch.Tensor, num_bits: int = 8, name: str = "weight") -> Any:
    """Each output channel's amax against the tensor's, and the SQNR a channel gains from its
    own scale, one dot per channel beside ``20·log10(r)`` (``r``: tensor amax / channel amax).

    Args:
        weight: a weight with output channels on axis 0, e.g. a conv's ``(C, C_in, kh, kw)``.
        num_bits: bit width of both quantizations.
        name: what to call the weight in the title.

    Returns:
        A Figure with two axes; ``fig.qviz_gain`` holds the measured gain (dB) per channel.

    Example:
        >>> w = torch.randn(8, 4) * torch.linspace(0.2, 1.0, 8).reshape(8, 1)
        >>> fig = per_channel_gain_plot(w)
        >>> len(fig.qviz_gain), bool(fig.qviz_gain.max() > 10)
        (8, True)
    """
    w = _checked_tensor(weight, "weight", min_dim=2)
    reduce = tuple(range(1, w.dim()))
    channel_amax = w.abs().amax(dim=reduce).clamp_min(torch.finfo(torch.float32).tiny)
    tensor_amax = float(channel_amax.max())
    per_tensor = fake_tensor_quant(w, tensor_amax, num_bits)
    per_channel = fake_tensor_quant(w, channel_amax.reshape(-1, *[1] * (w.dim() - 1)), num_bits)
    gain = torch.tensor(
        [sqnr(w[c], per_channel[c]) - sqnr(w[c], per_tensor[c]) for c in range(len(w))]
    )
    ratio = tensor_amax / channel_amax
    order = torch.argsort(channel_amax, descending=True)
    fig = new_figure(figsize=(10.5, 3.8), layout="constrained")
    ax_amax, ax_gain = fig.subplots(1, 2)
    ax_amax.bar(
        range(len(order)), channel_amax[order].tolist(), color="tab:blue", label="per-channel amax"
    )
    ax_amax.axhline(tensor_amax, color="tab:red", lw=2, label="per-tensor amax")
    ax_amax.set_ylim(0, 1.3 * tensor_amax)
    ax_amax.set_title(f"amax of each output channel of {name}", fontsize=_FONT + 1)
    ax_amax.set_xlabel("output channel (sorted by amax)", fontsize=_FONT)
    ax_amax.set_ylabel("amax", fontsize=_FONT)
    ax_amax.legend(loc="upper right", fontsize=_FONT - 1, ncol=2)
    r = torch.linspace(1, float(ratio.max()) * 1.02, 50)
    rule = (20 * torch.log10(r)).numpy()
    ax_gain.plot(r.numpy(), rule, "--", color="0.3", label="20·log10(r): finer step only")
    ax_gain.plot(
        ratio.numpy(), gain.numpy(), "o", color="tab:blue", label="measured, one dot per channel"
    )
    ax_gain.set_title(
        f"SQNR gain of per-channel over per-tensor, {num_bits} bits", fontsize=_FONT + 1
    )
    ax_gain.set_xlabel("r = per-tensor amax / channel amax", fontsize=_FONT)
    ax_gain.set_ylabel("gain (dB)", fontsize=_FONT)
    ax_gain.legend(loc="upper left", fontsize=_FONT - 1)
    for ax in (ax_amax, ax_gain):
        ax.tick_params(labelsize=_FONT - 1)
    fig.qviz_gain = gain
    return fig


def _error_split(x: torch.Tensor, num_bits: int, candidates: torch.Tensor) -> tuple[Any, Any]:
    """Squared error of fake quantization per candidate amax: (rounding, clipping). A column
    of candidates broadcasts against the row of values, like a per-channel amax."""
    xs, amax = x.reshape(1, -1), candidates.reshape(-1, 1)
    err2 = (fake_tensor_quant(xs, amax, num_bits) - xs).square()
    inside = xs.abs() <= amax
    return (err2 * inside).sum(1), (err2 * ~inside).sum(1)


def clipping_tradeoff_plot(
    x: torch.Tensor,
    num_bits: Sequence[int] = (8, 4),
    methods: Sequence[str] = tuple(METHOD_STYLE),
    steps: int = 150,
) -> Any:
    """Rounding error against clipping error over a sweep of amax, one panel per bit width,
    with the amax each calibration method picks (a HistogramCalibrator fed ``x``).

    Args:
        x: the tensor (an activation, say); its |x| is what the grid must cover.
        num_bits: one panel per bit width.
        methods: calibration methods whose amax to mark, from ``METHOD_STYLE``.
        steps: how many amax values, from a quarter of max |x| to max |x|.

    Returns:
        A Figure; the total error's minimum is marked on each panel.

    Example:
        >>> fig = clipping_tradeoff_plot(torch.randn(4096), num_bits=(8, 4), methods=("mse",))
        >>> len(fig.axes)
        2
    """
    values = _checked_tensor(x, "x").flatten()
    unknown = sorted(set(methods) - set(METHOD_STYLE))
    if unknown or not num_bits:
        raise ConfigError(
            f"clipping_tradeoff_plot: methods must come from {list(METHOD_STYLE)} (unknown: "
            f"{unknown}) and num_bits must name at least one bit width"
        )
    top = float(values.abs().max())
    candidates = torch.linspace(0.25 * top, top, steps)
    fig = new_figure(figsize=(4.8 * len(num_bits) + 1.8, 4), layout="constrained")
    axes = fig.subplots(1, len(num_bits), squeeze=False)[0]
    for ax, bits in zip(axes, num_bits, strict=True):
        calib = HistogramCalibrator(num_bits=bits)
        calib.collect(values)
        rounding, clipping = _error_split(values, bits, candidates)
        total = rounding + clipping
        ax.plot(candidates, rounding, color="tab:purple", lw=1.5, label="rounding error (inside)")
        ax.plot(candidates, clipping, color="tab:brown", lw=1.5, label="clipping error (outside)")
        ax.plot(candidates, total, color="black", lw=2.5, label="total")
        best = int(torch.argmin(total))
        ax.plot(candidates[best], total[best], "o", color="black", ms=8, label="minimum of total")
        for method in methods:
            colour, style = METHOD_STYLE[method]
            ax.axvline(
                float(calib.compute_amax(method)), color=colour, ls=style, lw=2, label=method
            )
        ax.set_yscale("log")
        ax.set_title(f"{bits} bits: squared error against amax", fontsize=_FONT + 1)
        ax.set_xlabel("amax", fontsize=_FONT)
        ax.set_ylabel("sum of squared errors (log scale)", fontsize=_FONT)
        ax.tick_params(labelsize=_FONT - 1)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right center", fontsize=_FONT - 1)
    return fig
