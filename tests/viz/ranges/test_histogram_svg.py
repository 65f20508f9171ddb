"""The widgets' fast SVG histogram draws the same numbers as the matplotlib one."""

import re

import pytest
import torch

from qviz.engine.tensor.calib import HistogramCalibrator
from qviz.errors import ConfigError
from qviz.viz import histogram
from qviz.viz.ranges.histogram_svg import histogram_svg
from qviz.viz.ranges.histograms import histogram_data


def _calibrator():
    calib = HistogramCalibrator(8)
    calib.collect(torch.randn(20_000, generator=torch.Generator().manual_seed(0)) ** 3)
    return calib


def test_lines_sit_at_the_calibrators_amax():
    calib = _calibrator()
    data = histogram_data(calib)
    svg = histogram_svg(data)
    drawn = dict(re.findall(r'data-gid="method:(\w+)" data-x="([^"]+)"', svg))
    for method in ("max", "percentile", "entropy", "mse"):
        expected = float(calib.compute_amax(method, percentile=99.99))
        assert float(drawn[method]) == float(f"{expected:.6g}"), method
    assert [r["method"] for r in data.rows] == [r["method"] for r in histogram(calib).qviz_rows]


def test_highlight_log_and_legend():
    data = histogram_data(_calibrator(), methods=("max", "entropy"))
    svg = histogram_svg(data, log=True, highlight="entropy", width=500, height=200)
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" width="500" height="200"')
    widths = dict(
        re.findall(
            r'stroke-width="([\d.]+)" stroke-dasharray="[\d,]+" data-gid="method:(\w+)"', svg
        )
    )
    assert widths == {"1.6": "max", "3.2": "entropy"}
    assert "max  amax=" in svg and svg.count('data-gid="observed"') == 1


def test_no_text_under_10_px_however_narrow_the_fluid_drawing_gets():
    data = histogram_data(_calibrator(), methods=("max", "entropy"))
    fixed = histogram_svg(data, width=480, height=240)
    assert "style=" not in fixed  # a fixed drawing: shown at its own size
    sizes = [float(v) for v in re.findall(r'font-size="([\d.]+)"', fixed)]
    assert min(sizes) >= 11
    fluid = histogram_svg(data, width=480, height=240, min_text_px=10)
    narrowest = float(re.search(r"min-width:([\d.]+)px", fluid).group(1))
    widest = float(re.search(r"max-width:([\d.]+)px", fluid).group(1))
    assert min(sizes) * narrowest / 480 >= 10  # the smallest text, shown at the narrowest width
    assert widest == 600 and "width:100%" in fluid


def test_bad_sizes_are_refused():
    data = histogram_data(_calibrator(), methods=("max",))
    with pytest.raises(ConfigError, match="min_text_px"):
        histogram_svg(data, min_text_px=0)
    with pytest.raises(ConfigError, match="width"):
        histogram_svg(data, width=-1)
