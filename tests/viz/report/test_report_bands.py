"""Fixed colour bands (qviz.display.bands) in the HTML report's graph and tables, the graph's
metric_bands option, the Model Explorer export's thresholds, and the report's reading guide."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
import torch

import qviz
from qviz.display.bands import (
    CLIPPED,
    GREEN,
    LIGHT_GREEN,
    ORANGE,
    RED,
    SQNR,
    YELLOW,
    Bands,
    bands_for,
)
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import ConfigError
from qviz.numeric.compare.report import COLUMNS, NumericReport
from qviz.viz import graph, report
from qviz.viz.model_explorer import SQNR_CAP, node_data
from qviz.viz.report.guide import TABLE_TERMS


@pytest.mark.parametrize(
    ("db", "colour"),
    [(-1.3, RED), (-math.inf, RED), (10.0, RED), (10.01, ORANGE), (20.0, ORANGE),
     (25.0, YELLOW), (36.9, LIGHT_GREEN), (40.0, LIGHT_GREEN), (40.5, GREEN), (math.inf, GREEN)],
)  # fmt: skip
def test_sqnr_bands_are_fixed_db_bands(db, colour):
    """36.9 dB is a healthy layer whatever the rest of the model does: never red."""
    assert SQNR.colour(db) == colour
    assert SQNR.colour(math.nan) is None


def test_band_legend_states_the_bounds():
    assert [label for _, label in SQNR.legend()] == [
        "≤ 10 dB", "10–20 dB", "20–30 dB", "30–40 dB", "> 40 dB"]  # fmt: skip
    assert [label for _, label in CLIPPED.legend()] == [
        "0 %", "0–0.01 %", "0.01–0.1 %", "0.1–1 %", "1–100 %"]  # fmt: skip
    assert [c for c, _ in SQNR.legend()] == [RED, ORANGE, YELLOW, LIGHT_GREEN, GREEN]
    assert bands_for("local_sqnr") is SQNR and bands_for("SQNR dB") is SQNR
    assert bands_for("clipped") is CLIPPED and bands_for("clip_error_share") is None
    with pytest.raises(ConfigError, match="strictly ascending"):
        Bands("bad", ((2.0, RED), (1.0, GREEN)))


def _threshold_colour(value: float, data: dict) -> str | None:
    """Model Explorer's rule: the first threshold the value does not exceed."""
    return next((t["bgColor"] for t in data["thresholds"] if value <= t["value"]), None)


@pytest.mark.parametrize("column", ["local_sqnr", "cumulative_sqnr", "weight_sqnr", "clipped"])
def test_model_explorer_colours_are_the_reports(column):
    bands = bands_for(column)
    values = (
        [-5.0, 0.0, 0.5e-4, 1e-4, 5e-4, 5e-3, 0.02, 1.0]
        if bands is CLIPPED
        else [-1.3, 9.9, 10.0, 15.0, 25.0, 36.9, 40.0, 55.0, math.inf]
    )
    data = node_data(column, {f"n{i}": v for i, v in enumerate(values)})["graph"]
    for i, value in enumerate(values):
        written = data["results"][f"n{i}"]["value"]
        assert _threshold_colour(written, data) == bands.colour(value), (column, value)
    assert data["thresholds"][-1]["value"] == (SQNR_CAP if bands is SQNR else 1.0)


def _small_prepared():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()  # fmt: skip
    gm = qviz.export(model, (torch.randn(8, 4),))
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = qviz.prepare_pt2e(gm, quantizer)
    return qviz.calibrate(prepared, [torch.randn(8, 4) for _ in range(2)], progress=False)


def _svg_fill(svg: str, node: str) -> str:
    """The fill of a graph node's box in graphviz's SVG (the first filled polygon)."""
    block = re.search(rf"<title>{node}</title>(.*?)</g>", svg, re.S)
    assert block, node
    return re.search(r'<polygon fill="(#[0-9a-f]{6})"', block.group(1)).group(1)


def test_graph_metric_bands_colour_by_fixed_bands_and_list_them():
    gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()),
                     (torch.ones(1, 2),))  # fmt: skip
    values = {"linear": 36.9, "relu": 38.0}  # the gradient would paint 36.9 red
    drawn = graph(gm, metrics=values, metric_column="local_sqnr", metric_bands=SQNR)
    assert _svg_fill(drawn.svg(), "linear") == LIGHT_GREEN == _svg_fill(drawn.svg(), "relu")
    assert "local_sqnr: fixed SQNR bands" in drawn.dot and "&gt; 40 dB" in drawn.dot
    relative = graph(gm, metrics=values, metric_column="local_sqnr")  # default: unchanged
    assert _svg_fill(relative.svg(), "linear") == "#f46d43"  # the gradient's low end
    broken = graph(gm, metrics={"linear": -1.3, "relu": 45.0}, metric_bands=SQNR)
    assert (_svg_fill(broken.svg(), "linear"), _svg_fill(broken.svg(), "relu")) == (RED, GREEN)
    with pytest.raises(ConfigError, match="not both"):
        graph(gm, metrics=values, metric_range=(0, 50), metric_bands=SQNR)
    with pytest.raises(ConfigError, match=r"qviz\.display\.bands\.Bands"):
        graph(gm, metrics=values, metric_bands=[(10, "#ff0000")])


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A report with a numeric table: one healthy (36.9 dB) and one broken (-1.3 dB) layer."""
    prepared = _small_prepared()
    rows = [{"node": "linear", "op": "linear", "local_sqnr": 36.9, "cumulative_sqnr": 36.9,
             "clipped": 0.0}, {"node": "linear_1", "op": "linear", "local_sqnr": -1.3,
             "cumulative_sqnr": -1.2, "clipped": 0.05}]  # fmt: skip
    ns = NumericReport.from_table(rows, output_sqnr=-1.2)
    out = tmp_path_factory.mktemp("bands") / "r.html"
    return report(prepared, out, ns=ns).read_text(encoding="utf-8")


def _cell_colour(page: str, text: str) -> str | None:
    colour = r'(?: style="background:(#[0-9a-f]{6})")?'
    cell = re.search(f'<td class="num"{colour}>{re.escape(text)}<', page)
    assert cell, text
    return cell.group(1)


def test_report_graph_and_table_colour_sqnr_by_the_fixed_bands(page):
    graph_svg = page[page.index('<div class="graph">') :]
    assert _svg_fill(graph_svg, "linear") == LIGHT_GREEN == SQNR.colour(36.9)
    assert _svg_fill(graph_svg, "linear_1") == RED == SQNR.colour(-1.3)
    assert "local_sqnr: fixed SQNR bands" in graph_svg and "≤ 10 dB" in graph_svg
    table = page[page.index("<h2>Numeric suite") :]
    assert _cell_colour(table, "36.9") == LIGHT_GREEN and _cell_colour(table, "-1.3") == RED
    assert _cell_colour(table, "0.05") == CLIPPED.colour(0.05) == RED
    assert _cell_colour(table, "0") == GREEN  # clipped 0: green
    assert table.count('<td class="num" style="background:') == 6  # SQNR, clipped: no other


def test_report_has_no_inner_scroll_box(page):
    """The graph and the tables are shown whole: no fixed height with its own scroll bar."""
    assert "max-height" not in page
    assert not re.search(r"overflow(?:-[xy])?\s*:\s*(?:auto|scroll)", page)
    assert 'class="scroll"' not in page
    assert ".graph svg { max-width: 100%; height: auto; }" in page


def test_report_explains_its_notation(page):
    guide = page[page.index("How to read this report") : page.index("<h2>Summary")]
    assert "Higher is better" in guide and "dB" in guide
    for _, label in SQNR.legend():
        assert label.replace(">", "&gt;") in guide
    assert "gN" in guide and "zero_point (<b>zp</b>)" in guide
    assert "the bracket bounds the true share" in page  # clipped 4.579% (0–9.16%)
    for term in ("local_sqnr", "cumulative_sqnr", "clipped", "qscheme", "ch_axis", "members"):
        assert f"<dt>{term}</dt>" in page


def test_every_numeric_report_column_is_explained():
    from qviz.viz.report.guide import _SAME_AS

    assert [c for c in COLUMNS if c not in TABLE_TERMS and c not in _SAME_AS] == []


def test_a_plain_frame_keeps_its_index_and_colours_its_sqnr_column(tmp_path):
    frame = pd.DataFrame({"sqnr_db": [31.5, 8.0]}, index=pd.Index(["conv", "fc"], name="layer"))
    text = report(_small_prepared(), tmp_path / "r.html", ns=frame).read_text()
    section = text[text.index("<h2>Numeric suite") :]
    assert "<th>layer</th>" in section and "<td>conv</td>" in section
    assert _cell_colour(section, "31.5") == LIGHT_GREEN and _cell_colour(section, "8") == RED


def test_the_lowering_table_is_explained_in_its_own_terms():
    from qviz.viz.report.guide import LOWERING_TERMS
    from qviz.viz.report.tables import frame_tables

    row = {"tensor": "quantize_per_tensor_default", "op": "relu", "elements": 4, "differing": 1,
           "share": 0.25, "max_steps": 1}  # fmt: skip
    frame = pd.DataFrame([row])
    page = frame_tables(frame, terms=LOWERING_TERMS)
    assert "<dt>op</dt><dd>the node whose output it quantizes</dd>" in page
    assert "<dt>elements</dt>" in page and "<dt>differing</dt>" not in page  # under elements
    assert "<dt>max_steps</dt>" in page and 'style="background' not in page  # no bands here


def test_the_graph_shrinks_to_the_page_no_further_than_10_px_text(page):
    """The SVG fits the page's width (max-width:100%, height:auto) down to a min-width at which
    its smallest text is 10 px; ids are prefixed and tooltips are <title>s, as in notebooks."""
    from qviz.viz.graph.inline_svg import svg_size, text_px

    start = page.index('<div class="graph">') + len('<div class="graph">')
    svg = page[start : page.index("</svg>", start) + len("</svg>")]
    floor = float(re.match(r'<svg style="min-width:(\d+)px"', svg).group(1))
    width, smallest = svg_size(svg)[0], text_px(svg)
    assert smallest * floor / width == pytest.approx(10.0, abs=0.1) and floor < width
    assert 'id="graph-node1"' in svg and "<title>local_sqnr = 36.9" in svg
