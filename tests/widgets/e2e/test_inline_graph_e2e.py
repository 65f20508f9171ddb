"""A drawn graph in JupyterLab: inline SVG (its tooltips are ``<title>`` elements in the page, not
lost in an ``<img>``), no wider than the output, a tall one folded until its summary is clicked.
Screenshots at 1280 and 1920 px wide go to ``QVIZ_SCREENSHOTS``."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser

CELLS = [
    "import torch, qviz\n"
    "from qviz.data import digits_model\n"
    "from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config\n"
    "gm = qviz.export(digits_model(), (torch.randn(2, 1, 8, 8),))\n"
    "quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())\n"
    "annotated = qviz.annotate_pt2e(gm, quantizer)\n"
    "prepared = qviz.prepare_pt2e(gm, quantizer)\n"
    "qviz.calibrate(prepared, [torch.randn(2, 1, 8, 8)], progress=False)\n"
    "converted = qviz.convert_pt2e(prepared)",
    "qviz.viz.graph(gm, collapse=1)",  # 383 x 869 px: shown as is
    "qviz.viz.graph(converted)",  # 589 x 4053 px, taller than 2200 px: folded
    "qviz.viz.graph(annotated, fold=False)",  # 1201 x 2521 px: wider than the output, unfolded
]

#: Per cell: its output's inline SVG, and the output area around it.
_OUTPUT = ".jp-Notebook .jp-CodeCell >> nth={} >> .jp-OutputArea-output"

#: The smallest text of an SVG as drawn, in CSS px.
_SMALLEST_TEXT = """s => Math.min(...[...s.querySelectorAll('text')].map((t) =>
  parseFloat(getComputedStyle(t).fontSize) * Math.hypot(t.getScreenCTM().a, t.getScreenCTM().b)))"""


def _box(locator) -> dict[str, float]:
    box = locator.bounding_box()
    assert box is not None, "not laid out"
    return box


def _check_fits(page, cell: int) -> None:
    """The cell's graph is inline SVG, its aspect ratio kept, and no wider than the output; or,
    where the output is too narrow for its text to stay legible, at that legible width in a box
    as wide as the output and no taller than the window, which scrolls."""
    output = page.locator(_OUTPUT.format(cell))
    svg = output.locator("svg.qviz-inline-graph")
    assert svg.count() == 1 and output.locator("img").count() == 0
    width, outer = _box(svg)["width"], _box(output)["width"]
    ratio = svg.evaluate("s => s.getBoundingClientRect().height / s.getBoundingClientRect().width")
    view = svg.evaluate("s => s.viewBox.baseVal.height / s.viewBox.baseVal.width")
    assert abs(ratio - view) < 0.01, (cell, ratio, view)  # the aspect ratio is kept
    smallest = svg.evaluate(_SMALLEST_TEXT)
    assert smallest >= 9.9, (cell, smallest)  # fitting never shrinks text under 10 px
    if width <= outer + 0.5:
        assert width > 100, (cell, width)
        return
    legible = svg.evaluate("s => parseFloat(s.style.minWidth)")
    assert abs(width - legible) < 1, (cell, width, legible, outer)
    box = _box(output.locator(".qviz-graph-box"))
    assert box["width"] <= outer + 0.5 and box["height"] <= 0.9 * page.viewport_size["height"] + 1


def test_graph_output_is_inline_fitted_and_tall_one_folds(lab, screenshots):
    page = lab.open_notebook(CELLS, name="inline_graph.ipynb")
    # 1: inline, tooltips as <title> under each node, no wider than the output area
    _check_fits(page, 1)
    small = page.locator(_OUTPUT.format(1))
    assert small.locator("details").count() == 0
    assert small.locator("g.node title").count() > 5
    # two drawings on one page share no id
    ids = page.evaluate(
        "() => [...document.querySelectorAll('svg.qviz-inline-graph [id]')].map(e => e.id)"
    )
    assert len(ids) == len(set(ids)) > 20
    # 2: folded: the summary names the stage, node count, size and the widget to explore it
    fold = page.locator(_OUTPUT.format(2)).locator("details.qviz-graph-fold")
    summary = fold.locator("summary")
    assert "converted graph" in summary.inner_text() and "GraphWidget" in summary.inner_text()
    assert fold.get_attribute("open") is None
    assert not fold.locator("svg").is_visible()
    summary.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "inline_graph_1280_folded.png"))
    summary.click()
    assert fold.get_attribute("open") is not None and fold.locator("svg").is_visible()
    _check_fits(page, 2)
    assert _box(fold.locator("svg"))["height"] > 1000
    # 3: wider than the output: shrunk to fit, but its text stays at 10 px or more, scrolling in
    # its box past that; each op's tooltip (node and specs) is a <title> under the node
    _check_fits(page, 3)
    titles = page.locator(_OUTPUT.format(3)).locator("g.node a > title").all_text_contents()
    assert any("aten.conv2d" in t and "int8" in t for t in titles), titles[:3]
    for width in (1280, 1920):
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(500)
        for cell in (1, 2, 3):
            _check_fits(page, cell)
        for cell, name in ((1, "small"), (2, "unfolded"), (3, "wide")):
            page.locator(_OUTPUT.format(cell)).locator("svg").scroll_into_view_if_needed()
            page.wait_for_timeout(700)  # the notebook draws the cells scrolled into view
            page.screenshot(path=str(screenshots / f"inline_graph_{width}_{name}.png"))
    assert lab.blocked == [] and lab.errors == []
