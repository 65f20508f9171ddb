"""The tensor-quantization lesson's figures draw what PyTorch's own fake-quantize ops compute."""

from __future__ import annotations

import pytest
import torch

from qviz.engine.tensor.calib import HistogramCalibrator
from qviz.errors import ConfigError
from qviz.numeric import sqnr
from qviz.viz import clipping_tradeoff_plot, per_channel_gain_plot, ste_plot


def _texts(fig):
    return [t for t in fig.findobj(lambda a: hasattr(a, "get_fontsize")) if t.get_text()]


def test_ste_plot_draws_torchs_staircase_and_a_gradient_of_one_inside_the_range() -> None:
    fig = ste_plot(amax=1.0, num_bits=3, span=2.0)
    forward, backward = fig.axes
    x = torch.tensor(forward.lines[1].get_xdata(), dtype=torch.float32)
    y = torch.tensor(forward.lines[1].get_ydata(), dtype=torch.float32)
    reference = torch.fake_quantize_per_tensor_affine(x, 1.0 / 3, 0, -3, 3)
    assert torch.allclose(y, reference, atol=1e-6)
    grad = torch.tensor(backward.lines[0].get_ydata())
    inside = x.abs() <= 1.0
    assert grad[inside].eq(1).all() and grad[~inside].eq(0).all()


def test_per_channel_gain_matches_torchs_per_channel_fake_quantize() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, 3, 3, 3, generator=gen) * torch.linspace(0.1, 1.0, 6).reshape(6, 1, 1, 1)
    fig = per_channel_gain_plot(w, num_bits=8)
    amax = w.abs().amax(dim=(1, 2, 3))
    per_channel = torch.fake_quantize_per_channel_affine(
        w, amax / 127, torch.zeros(6, dtype=torch.int32), 0, -127, 127
    )
    per_tensor = torch.fake_quantize_per_tensor_affine(w, float(amax.max()) / 127, 0, -127, 127)
    expected = [sqnr(w[c], per_channel[c]) - sqnr(w[c], per_tensor[c]) for c in range(6)]
    assert fig.qviz_gain.tolist() == pytest.approx(expected, abs=1e-3)
    assert fig.qviz_gain[amax.argmax()] == pytest.approx(0.0, abs=1e-6)  # the widest: no gain
    assert fig.qviz_gain[amax.argmin()] > 15  # 10x narrower: about 20 dB finer


def test_clipping_tradeoff_marks_each_methods_amax_and_splits_the_error() -> None:
    x = torch.randn(5000, generator=torch.Generator().manual_seed(1)).abs()
    fig = clipping_tradeoff_plot(x, num_bits=(4,), methods=("max", "mse"))
    (ax,) = fig.axes
    calib = HistogramCalibrator(num_bits=4)
    calib.collect(x)
    marked = {line.get_label(): line.get_xdata()[0] for line in ax.lines[4:]}
    assert marked == pytest.approx({m: float(calib.compute_amax(m)) for m in ("max", "mse")})
    amax = torch.tensor(ax.lines[0].get_xdata())
    rounding, clipping, total = (torch.tensor(ax.lines[i].get_ydata()) for i in range(3))
    assert torch.allclose(rounding + clipping, total)
    k = 40  # one candidate, against torch's op
    error = torch.fake_quantize_per_tensor_affine(x, float(amax[k]) / 7, 0, -7, 7) - x
    assert float(total[k]) == pytest.approx(float(error.square().sum()), rel=1e-3)


def test_every_text_is_at_least_11_points() -> None:
    w = torch.randn(4, 2)
    for fig in (ste_plot(), per_channel_gain_plot(w), clipping_tradeoff_plot(w)):
        assert min(t.get_fontsize() for t in _texts(fig)) >= 11


@pytest.mark.parametrize(
    "call",
    [
        lambda: ste_plot(amax=3.0, span=2.0),
        lambda: per_channel_gain_plot(torch.randn(5)),
        lambda: per_channel_gain_plot([[1.0]]),
        lambda: clipping_tradeoff_plot(torch.randn(8), methods=("l1",)),
        lambda: clipping_tradeoff_plot(torch.randn(8), num_bits=()),
    ],
)
def test_bad_input_is_a_config_error(call) -> None:
    with pytest.raises(ConfigError):
        call()
