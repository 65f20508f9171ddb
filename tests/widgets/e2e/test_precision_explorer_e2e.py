"""PrecisionExplorer in JupyterLab: click a point of the Pareto plot, the graph and the table
change to that assignment; "use this" hands its quantizer to the kernel."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import fork

pytestmark = pytest.mark.browser

SETUP = (
    inspect.getsource(fork)
    + """
import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.numeric import search_precision
from qviz.widgets import PrecisionExplorer

model, data = fork_data()
gm = qviz.export(model, (data[0],), dynamic_batch=True)
q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
result = search_precision(gm, q, data, min_sqnr=40.0, progress=False)
ex = PrecisionExplorer(result, gm)
ex
"""
)  # the model's module first: its docstring and __future__ import open the cell

#: The fill colour of w8a8 layers in the graph (PRECISION_COLOURS).
_W8A8 = "#a6d96a"
_GRAPH_W8A8 = (
    "() => [...document.querySelectorAll('.qviz-graph svg g.node [fill]')]"
    f".filter(e => e.getAttribute('fill').toLowerCase() === '{_W8A8}').length"
)

#: The Pareto plot's smallest text in CSS px (matplotlib's SVG units are points: 9 pt legend),
#: and how far the panel and the table spill past their boxes.
_SIZES = """() => {
  const svg = document.querySelector('.qviz-pareto svg');
  const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  const spill = (s) => {
    const e = document.querySelector(s);
    return e.scrollWidth - e.clientWidth;
  };
  return { legend_px: 9 * scale, panel_overflow: spill('.qviz-panel'),
           table_overflow: spill('.jp-OutputArea-output') };
}"""


def _shot(page: Any, path: Path) -> None:
    """The explorer's output area (scrolled into view), not the code above it."""
    page.locator(".jp-Cell-outputArea").first.screenshot(path=path)


def _click_point(page: Any, index: int) -> None:
    """Click front point ``index`` where it is drawn, as a user does."""
    box = page.locator(f".qviz-pareto #qviz-point-{index}").first.bounding_box()
    assert box is not None, f"point {index} is not drawn"
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)


def test_pick_a_point_and_use_it_in_the_browser(lab: Any, screenshots: Path) -> None:
    page = lab.open_notebook([SETUP])
    page.locator(".qviz-graph svg g.node").first.wait_for(timeout=60_000)
    page.locator(".qviz-pareto svg").first.wait_for(timeout=10_000)
    front, chosen = lab.kernel_json(page, "[len(result.front), result.chosen]")
    assert page.locator(".qviz-pareto [id^='qviz-point-']").count() == front
    line = page.locator(".qviz-precision-point").first
    assert line.inner_text().startswith(f"point {chosen} (the search's choice)")
    table_before = page.locator("table.qviz-precision-table").first.inner_text()
    w8a8_before = page.evaluate(_GRAPH_W8A8)
    assert w8a8_before > 0  # the chosen point keeps most layers at w8a8
    _shot(page, screenshots / "precision-explorer-chosen.png")
    sizes = page.evaluate(_SIZES)
    assert sizes["legend_px"] >= 10, sizes  # the plot's smallest text (9 pt) at its drawn size
    assert sizes["panel_overflow"] <= 1 and sizes["table_overflow"] <= 1, sizes

    _click_point(page, 0)  # the cheapest: every unit at w4a8
    page.wait_for_function(
        "() => document.querySelector('.qviz-precision-point').innerText.startsWith('point 0')",
        timeout=30_000,
    )
    assert lab.kernel_json(page, "ex.selected") == 0
    page.wait_for_function(f"() => ({_GRAPH_W8A8})() === 0", timeout=30_000)
    table_after = page.locator("table.qviz-precision-table").first.inner_text()
    assert table_after != table_before and "w8a8" not in table_after.split("screened")[0]
    assert "w4a8" in table_after
    assert "not evaluated" in line.inner_text() or "measured" in line.inner_text()
    _shot(page, screenshots / "precision-explorer-point0.png")

    page.get_by_role("button", name="use this").click()
    page.locator("text=using point 0").first.wait_for(timeout=30_000)
    used = lab.kernel_json(page, "[ex.point, type(ex.quantizer).__name__]")
    assert used == [0, "OverrideQuantizer"]
    same = "ex.quantizer.overrides == result.quantizer(0).overrides"
    assert lab.kernel_json(page, same) is True
    _shot(page, screenshots / "precision-explorer-used.png")
    assert lab.blocked == [] and lab.errors == []
