"""qviz.viz.histogram: lines at the calibrators' amax, table numbers, every input kind, errors."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from qviz.engine.observers import HistogramObserver, MinMaxObserver
from qviz.engine.tensor.calib import HistogramCalibrator, MaxCalibrator
from qviz.engine.tensor.descriptor import QuantDescriptor
from qviz.engine.tensor.tensor_quant import fake_tensor_quant
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import CalibrationError, ConfigError
from qviz.numeric import clipped_fraction, sqnr

histogram = importlib.import_module("qviz.viz.ranges.histograms").histogram

METHODS = ("max", "percentile", "entropy", "mse")


@pytest.fixture
def x() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.cat([torch.randn(50_000, generator=g), 12 * torch.rand(20, generator=g)])


def _method_lines(fig) -> dict[str, float]:
    ax = fig.axes[0]
    found = {}
    for line in ax.lines:
        gid = line.get_gid() or ""
        if gid.startswith("method:"):
            xs = line.get_xdata()
            assert xs[0] == xs[1]
            found[gid.split(":", 1)[1]] = float(xs[0])
    return found


def test_lines_are_the_calibrators_amax(x):
    calib = HistogramCalibrator(8)
    calib.collect(x)
    fig = histogram(calib)
    lines = _method_lines(fig)
    assert list(lines) == list(METHODS)
    for method in METHODS:
        assert lines[method] == float(calib.compute_amax(method))
    assert [r["amax"] for r in fig.qviz_rows] == [lines[m] for m in METHODS]


def test_table_matches_raw_tensor_metrics(x):
    for bits, tolerance_db in ((8, 0.3), (4, 0.2)):
        fig = histogram(x, num_bits=bits)
        calib = HistogramCalibrator(bits)
        calib.collect(x)
        for row in fig.qviz_rows:
            amax = float(calib.compute_amax(row["method"]))
            assert row["amax"] == amax
            assert row["scale"] == pytest.approx(amax / (2 ** (bits - 1) - 1))
            assert row["zero_point"] == 0
            expected = sqnr(x, fake_tensor_quant(x, amax, bits))
            assert row["sqnr_db"] == pytest.approx(expected, abs=tolerance_db), row
            clipped = clipped_fraction(x, amax, num_bits=bits)
            assert row["clipped_fraction"] == pytest.approx(clipped, abs=2e-4), row
            assert row["clipped_least"] <= clipped <= row["clipped_most"], row


def test_every_input_kind_gives_the_same_lines(x):
    calib = HistogramCalibrator(8)
    calib.collect(x)
    tq = TensorQuantizer(QuantDescriptor(calib_method="histogram"))
    tq.enable_calib()
    tq.disable_quant()
    tq(x)
    obs = HistogramObserver(dtype=torch.int8, qscheme=torch.per_tensor_symmetric, switchable=True)
    obs(x)
    expected = _method_lines(histogram(calib))
    for source in (x, tq, obs):
        assert _method_lines(histogram(source)) == pytest.approx(expected, rel=0, abs=0)


def test_observer_rows_are_its_qparams(x):
    obs = HistogramObserver(dtype=torch.int8, switchable=True)
    obs(x)
    fig = histogram(obs, methods=("entropy", "mse"), log=True)
    assert [r["method"] for r in fig.qviz_rows] == ["entropy", "mse", "l2"]
    for row in fig.qviz_rows:
        scale, zero_point = obs.calculate_qparams(method=row["method"])
        assert row["scale"] == float(scale)
        assert row["zero_point"] == int(zero_point)
        assert row["low"] == pytest.approx(float(scale) * (-128 - int(zero_point)))
        assert row["high"] == pytest.approx(float(scale) * (127 - int(zero_point)))
    assert [r["current"] for r in fig.qviz_rows] == [False, False, True]
    gids = {line.get_gid() for line in fig.axes[0].lines}
    assert "observer:range" in gids


def test_l2_only_observer_draws_its_signed_histogram(x):
    obs = HistogramObserver(dtype=torch.int8, quant_min=-8, quant_max=7)
    obs(x)
    fig = histogram(obs)
    (row,) = fig.qviz_rows
    assert row["method"] == "l2" and row["amax"] is None
    scale, _ = obs.calculate_qparams()
    assert row["scale"] == float(scale)
    ax = fig.axes[0]
    by_gid = {line.get_gid(): float(line.get_xdata()[0]) for line in ax.lines}
    assert by_gid["observer:low"] == pytest.approx(row["low"])
    assert by_gid["observer:high"] == pytest.approx(row["high"])
    assert ax.get_xlabel() == "x"
    assert "switchable=True" in ax.get_title("left")
    assert any(c.get_gid() == "grid" for c in ax.collections)  # 16 levels: grid drawn
    assert math.isfinite(row["sqnr_db"])


def test_an_order_free_observer_draws_its_histogram_and_own_range(x):
    """The observer's power-of-two histogram (counts summed exactly) and its L2 range, with
    the calibrator methods said to be not kept; the same figure for any batch order."""
    from qviz.engine.observers import OrderFreeHistogramObserver

    obs, shuffled = (
        OrderFreeHistogramObserver(dtype=torch.int8),
        OrderFreeHistogramObserver(dtype=torch.int8),
    )
    for part in x.chunk(4):
        obs(part)
    for part in reversed(x.chunk(4)):
        shuffled(part)
    fig = histogram(obs)
    (row,) = fig.qviz_rows
    scale, zero_point = obs.calculate_qparams()
    assert row["method"] == "l2" and row["current"] and row["scale"] == float(scale)
    assert row["zero_point"] == int(zero_point)
    by_gid = {line.get_gid(): float(line.get_xdata()[0]) for line in fig.axes[0].lines}
    assert by_gid["observer:low"] == pytest.approx(row["low"])
    assert "not kept by this observer" in fig.axes[0].get_title("left")
    assert histogram(shuffled).qviz_rows == fig.qviz_rows


def test_grid_only_when_few_levels(x):
    assert not any(c.get_gid() == "grid" for c in histogram(x).axes[0].collections)
    assert any(c.get_gid() == "grid" for c in histogram(x, num_bits=4).axes[0].collections)


def test_per_channel_calibrator_channel():
    w = torch.stack([torch.linspace(-1, 1, 101), torch.linspace(-3, 3, 101)])
    calib = HistogramCalibrator(8, axis=0)
    calib.collect(w)
    assert _method_lines(histogram(calib, methods=("max",), channel=1)) == {"max": 3.0}


@pytest.mark.parametrize(
    ("bad", "kwargs", "match"),
    [
        ("a string", {}, "HistogramObserver"),
        (MinMaxObserver(), {}, "ranges"),
        (MaxCalibrator(), {}, "HistogramCalibrator"),
        (torch.ones(3), {"methods": ("kl",)}, "unknown calibration method"),
        (torch.ones(3), {"methods": ()}, "non-empty"),
        (torch.ones(3), {"percentile": "high"}, "percentile"),
        (HistogramCalibrator(8), {"num_bits": 4}, "num_bits"),
    ],
)
def test_bad_input_is_a_config_error(bad, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        histogram(bad, **kwargs)


def test_returns_a_figure_that_saves(tmp_path, x):
    from matplotlib.figure import Figure

    fig = histogram(x, log=True)
    assert isinstance(fig, Figure) and fig._repr_png_()[:4] == b"\x89PNG"  # shows as an image
    fig.savefig(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 10_000


@pytest.mark.parametrize("empty", [HistogramObserver(), HistogramCalibrator(8)])
def test_nothing_observed_is_a_calibration_error(empty):
    with pytest.raises(CalibrationError, match="calibrat"):
        histogram(empty)


def test_clipped_rows_of_the_digits_input_agree_with_the_raw_tensor(calibrated_digits):
    """The digits pixels sit exactly at 1.0: the L2 range [-1.003, 0.9956] and the mse range
    [-1.004, 0.9958] both clip them. Both rows are counted the same way, against the raw input."""
    from qviz.data import digits_loaders
    from qviz.viz.ranges.histograms import histogram_data

    prepared = calibrated_digits(switchable=True)
    observer = getattr(prepared, prepared.plan.group_of("x -> conv2d").observer)
    x = torch.cat([b for b, _ in digits_loaders(batch_size=90).calibration])
    rows = {r["method"]: r for r in histogram_data(observer, methods=("l2", "mse")).rows}
    for method in ("l2", "mse"):
        r = rows[method]
        grid = {"quant_min": observer.quant_min, "quant_max": observer.quant_max}
        exact = clipped_fraction(x, scale=r["scale"], zero_point=r["zero_point"], **grid)
        assert exact > 0.05, method  # the pixels at 1.0 lie past both ranges' last boundary
        assert r["clipped_least"] <= exact <= r["clipped_most"], (method, exact, r)
    wider, narrower = sorted(rows.values(), key=lambda r: r["high"] - r["low"], reverse=True)
    assert wider["clipped_fraction"] <= narrower["clipped_fraction"]


def test_no_text_smaller_than_9_points(x):
    from matplotlib.text import Text

    fig = histogram(x, num_bits=4)  # with the grid's note, the legend and the table
    fig.draw_without_rendering()
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    assert any("quantization levels" in t.get_text() for t in texts)
    # 9 pt: 12.5 px in a notebook (100 dpi), 10 px at a widget's 80 px per inch
    assert min(t.get_fontsize() for t in texts) >= 9
