"""PrecisionExplorer without a kernel: open on the chosen point, select, use, refuse another
model; the plot has one clickable element per front point; the table and the point's line."""

from __future__ import annotations

import re
import shutil

import pytest
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.quantizers.override import OverrideQuantizer
from qviz.errors import ConfigError
from qviz.numeric import search_precision
from qviz.widgets import PrecisionExplorer
from qviz.widgets.precision.view import plot_svg
from tests.helpers.fork import fork_data

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs graphviz's dot")


@pytest.fixture(scope="module")
def searched():
    model, data = fork_data()
    gm = qviz.export(model, (data[0],), dynamic_batch=True)
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    result = search_precision(gm, q, data, min_sqnr=40.0, progress=False)
    assert result.chosen is not None and len(result.front) > 3
    return gm, data, result


def test_opens_on_the_chosen_point_and_selects_another(searched):
    gm, _, result = searched
    ex = PrecisionExplorer(result, gm, graph=False)
    assert ex.selected == result.chosen and ex.point is None and ex.quantizer is None
    assert ex.select(0).selected == 0 and ex.error is None
    assert ex.table().equals(result.table(0))
    assert ex.select(-1).selected == len(result.front) - 1
    before = ex.selected
    assert ex.select(len(result.front)).selected == before  # refused: the selection stays
    assert "the front has" in ex.error
    assert ex.select("two").error == "point='two': give an index of result.front"
    assert ex.select(1).error is None


def test_a_click_on_the_plot_selects_and_use_hands_back_the_quantizer(searched):
    gm, _, result = searched
    ex = PrecisionExplorer(result, gm, graph=False)
    ex.view.plot.picked = {"index": 2, "n": 1}  # what the browser sends on a click
    assert ex.selected == 2
    assert "<circle" not in ex.view.plot.svg  # matplotlib's markers are paths
    assert ex.view.use.description == "use this"
    ex.view.use.click()
    assert ex.point == 2 and isinstance(ex.quantizer, OverrideQuantizer)
    assert ex.quantizer.overrides == result.quantizer(2).overrides
    assert ex.view.use.description == "in use" and "using point 2" in ex.view.used.value
    q = ex.use(result.chosen)
    assert q is ex.quantizer and ex.point == ex.selected == result.chosen
    with pytest.raises(ConfigError, match="the front has"):
        ex.use(99)
    assert ex.point == result.chosen  # unchanged by the refused use


def test_the_quantizer_reproduces_the_point(searched):
    gm, data, result = searched
    ex = PrecisionExplorer(result, gm, graph=False)
    chosen = ex.use()
    quantized = qviz.convert_pt2e(
        qviz.calibrate(qviz.prepare_pt2e(gm, chosen), data, progress=False)
    )
    from qviz.numeric import sqnr

    measured = [e.output_sqnr for e in result.evaluations if e.point == result.chosen][-1]
    got = float(sqnr(gm(data[0]), quantized(data[0])))
    assert got == pytest.approx(measured, abs=6.0)  # one batch against the search's mean


def test_refuses_another_model_and_what_is_not_a_result(searched):
    gm, data, result = searched
    other = qviz.export(nn.Sequential(nn.Conv2d(3, 4, 1)).eval(), (data[0],))
    with pytest.raises(ConfigError, match="the search ran on another model") as info:
        PrecisionExplorer(result, other, graph=False)
    assert str(result.float_fingerprint) in str(info.value)
    with pytest.raises(ConfigError, match=r"takes what qviz\.numeric\.search_precision returns"):
        PrecisionExplorer(result.table(), gm, graph=False)
    quantized = result.model
    with pytest.raises(ConfigError, match="float_model"):
        PrecisionExplorer(result, quantized, graph=False)


def test_the_svg_has_one_clickable_element_per_front_point(searched):
    _, _, result = searched
    svg = plot_svg(result, 3)
    ids = re.findall(r'id="(qviz-point-\d+)"', svg)
    assert ids == [f"qviz-point-{i}" for i in range(len(result.front))]
    assert svg.startswith("<svg")
    assert plot_svg(result, 4) != svg  # the ring moves


def test_the_plots_smallest_text_is_10_px_at_its_narrowest(searched):
    """matplotlib writes text as glyph paths scaled by font size / 100 (points: SVG units); the
    style sheet's min-width keeps the smallest of them at 10 CSS pixels or more."""
    from qviz.widgets.precision.view import ParetoWidget

    _, _, result = searched
    svg = plot_svg(result, 3)
    smallest_pt = 100 * min(float(v) for v in re.findall(r"scale\((0\.\d+) -0\.\d+\)", svg))
    view_width = float(re.search(r'viewBox="0 0 ([\d.]+) ', svg).group(1))
    css = ParetoWidget()._css  # the shipped static/pareto_widget.css, read by anywidget
    narrowest = float(re.search(r"min-width: (\d+)px", css).group(1))
    assert smallest_pt * narrowest / view_width >= 10


def test_point_line_table_and_summary(searched):
    gm, _, result = searched
    ex = PrecisionExplorer(result, gm, graph=False)
    view = ex.view
    assert view.summary.value.count(result.summary().split(":")[0]) == 1
    line = view.point.value
    assert f"<b>point {result.chosen}</b> (the search's choice)" in line
    assert "meets</b> output SQNR &gt;= 40 dB" in line and "measured <b>output SQNR" in line
    assert ex.evaluation is not None and ex.evaluation.meets
    missed = [e.point for e in result.evaluations if e.point is not None and not e.meets]
    if missed:
        assert "misses</b>" in ex.select(missed[-1]).view.point.value
    estimated_only = next(
        i for i in range(len(result.front)) if i not in {e.point for e in result.evaluations}
    )
    assert "not evaluated" in ex.select(estimated_only).view.point.value
    assert ex.evaluation is None
    table = view.table.value
    for node in result.table(estimated_only)["node"]:
        assert f"<td>{node}</td>" in table
    assert table.count("<tr>") == len(result.layers) + 1
    assert "screened w4a8" in table and "background:#" in table
    labels = view.plot.labels
    assert len(labels) == len(result.front) and labels[result.chosen].endswith("(chosen)")
    assert repr(ex).startswith(f"PrecisionExplorer({len(result.front)} points")


@needs_dot
def test_the_graph_shows_the_selected_point(searched):
    gm, _, result = searched
    ex = PrecisionExplorer(result, gm)
    first = ex.view.graph.svg
    assert "w8a8" in first and "w4a8" in first  # the legend names the precisions shown
    cheapest = ex.select(0).view.graph.svg
    assert cheapest != first
    choice = result.front[0].choice
    assert set(choice) == {"w4a8"}  # the cheapest point puts every unit at w4a8
    w8a8 = "#a6d96a"
    assert first.count(w8a8) > cheapest.count(w8a8)
