"""The three widgets fit a JupyterLab at 1280 pixels (file browser open, default zoom) and at
1920: no panel spills past the cell, nothing inside a panel is cut off, tables wrap or scroll
inside their panel, the dashboard's header is whole, and the graph opens with labels a reader
can read (at least 10 pixels high) in a pane whose edge can be dragged wider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

SETUP = """
import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.widgets import AnnotationEditor, CalibrationExplorer, NumericDashboard

calib = [x for x, _ in digits_loaders(batch_size=90).calibration][:2]
gm = qviz.export(digits_model(), (calib[0],), dynamic_batch=True)
q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), calib, progress=False)
quantized = qviz.convert_pt2e(prepared)
"""

WIDGETS = {
    "editor": "ed = AnnotationEditor(gm)\ned.select('conv2d')\ned",
    "explorer": "CalibrationExplorer(prepared)",
    "dashboard": "NumericDashboard.from_models(gm, quantized, calib, quantizer=q, progress=False)",
}

#: Per panel: how far its content reaches past its own box, and past the notebook's output area.
_OVERFLOW = """
() => [...document.querySelectorAll('.qviz-panel')].map((panel) => {
  const area = panel.closest('.jp-OutputArea-output').getBoundingClientRect();
  const box = panel.getBoundingClientRect();
  const right = panel.getBoundingClientRect().right;
  const wide = [...panel.querySelectorAll('*')]
    .filter((e) => e.getBoundingClientRect().right > right + 1 && !e.closest('.qviz-scroll'))
    .slice(0, 3).map((e) => `${e.tagName}.${e.className}`);
  return {
    inside: panel.scrollWidth - panel.clientWidth,
    wide,
    past_cell: box.right - area.right,
    text: panel.innerText.slice(0, 60),
  };
})
"""

#: The rendered height (CSS pixels) of the graph's median node label.
_LABEL_PX = """
() => {
  const heights = [...document.querySelectorAll('.qviz-graph svg g.node text')]
    .map((t) => t.getBoundingClientRect().height).filter((h) => h > 0).sort((a, b) => a - b);
  return heights.length ? heights[Math.floor(heights.length / 2)] : 0;
}
"""

#: Table columns whose header ends past the right edge of the table's panel (at the widths
#: tested, every column of these panels fits without scrolling).
_CUT_COLUMNS = """
() => [...document.querySelectorAll('.qviz-panel table th')].filter((th) => {
  const panel = th.closest('.qviz-panel').getBoundingClientRect();
  return th.getBoundingClientRect().right > panel.right + 1;
}).map((th) => th.textContent)
"""


def _check_layout(page: Any, name: str, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 1000})
    page.wait_for_timeout(500)  # JupyterLab re-lays out the notebook on resize
    panels = page.evaluate(_OVERFLOW)
    assert panels, f"{name}: no .qviz-panel in the page"
    for panel in panels:
        assert panel["inside"] <= 1, f"{name} at {width}px: panel content overflows: {panel}"
        assert panel["past_cell"] <= 1, f"{name} at {width}px: panel spills past the cell: {panel}"
    assert page.evaluate(_CUT_COLUMNS) == [], f"{name} at {width}px: table columns cut off"


@pytest.mark.parametrize("name", list(WIDGETS))
def test_each_widget_fits_1280_and_1920_and_opens_readable(
    lab: Any, screenshots: Path, name: str
) -> None:
    page = lab.open_notebook([SETUP, WIDGETS[name]], name=f"layout-{name}.ipynb")
    page.locator(".qviz-graph svg g.node").first.wait_for(timeout=30_000)
    page.locator(".qviz-panel").first.wait_for(timeout=30_000)
    page.wait_for_timeout(500)
    label = page.evaluate(_LABEL_PX)
    assert label >= 10, f"{name}: the graph opens with labels {label:.1f} px high"
    for width in (1280, 1920):
        _check_layout(page, name, width)
        page.locator(".qviz-graph").first.scroll_into_view_if_needed()
        page.screenshot(path=screenshots / f"layout-{name}-{width}.png")
    if name == "dashboard":
        header = page.locator(".qviz-dash-mono").first
        assert header.evaluate("e => e.scrollWidth <= e.clientWidth + 1")
        assert "weight" in header.inner_text()

    # the splitter: dragging the graph pane's edge to the right widens it
    graph = page.locator(".qviz-graph").first
    before = graph.bounding_box()["width"]
    grip = page.locator(".qviz-graph-splitter").first.bounding_box()
    x, y = grip["x"] + grip["width"] / 2, grip["y"] + 40
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + 150, y, steps=5)
    page.mouse.up()
    page.wait_for_timeout(300)
    assert graph.bounding_box()["width"] > before + 100
    _check_layout(page, name, 1920)  # the panel still fits beside the wider graph
    assert lab.errors == []
