"""The three widgets fit a JupyterLab at 1280 pixels (1280x800, file browser open, default
zoom) and at 1920 (1920x1080): no pane spills past the cell, nothing inside a panel is cut off,
tables wrap or scroll inside their panel, the dashboard's header is whole, and the graph opens
with labels a reader can read (at least 10 pixels high) in a pane whose edge can be dragged
wider. The panes grow with the window (wider and taller at 1920), no text of the widget (HTML
or SVG, the graph's included, also after "reset") is under 10 CSS pixels, and a PNG figure is
shown no wider than its natural size, with its aspect ratio."""

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


#: The smallest text of the widget (the output area holding its panel), in CSS pixels: HTML text
#: at its computed font size, SVG text at its font size times the drawing's scale on screen.
_SMALLEST_TEXT = """
() => {
  const area = document.querySelector('.qviz-panel').closest('.jp-OutputArea-output');
  const found = [];
  const walker = document.createTreeWalker(area, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!node.textContent.trim() || !el || el.closest('style, script, title')) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    const box = range.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;
    const style = getComputedStyle(el);
    if (style.visibility === 'hidden' || style.opacity === '0') continue;
    let px = parseFloat(style.fontSize);
    if (el instanceof SVGElement) {
      const m = el.getScreenCTM();
      px *= Math.hypot(m.a, m.b);
    }
    found.push({ px, text: node.textContent.trim().slice(0, 40), tag: el.tagName });
  }
  found.sort((a, b) => a.px - b.px);
  return { count: found.length, smallest: found.slice(0, 3) };
}
"""

#: The smallest text of the graph drawing on screen (font size times the pane's scale).
_GRAPH_TEXT_PX = """
() => Math.min(...[...document.querySelectorAll('.qviz-graph svg text')].map((t) => {
  const m = t.getScreenCTM();
  return parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b);
}))
"""

#: Each pane's box, and how far past the notebook's output area it reaches.
_PANES = """
() => {
  const panel = document.querySelector('.qviz-panel');
  const area = panel.closest('.jp-OutputArea-output').getBoundingClientRect();
  const graph = document.querySelector('.qviz-graph');
  const pane = document.querySelector('.qviz-graph-viewport').getBoundingClientRect();
  const boxes = [graph.getBoundingClientRect(), panel.getBoundingClientRect()];
  return {
    graph: boxes[0].width, panel: boxes[1].width, height: pane.height,
    past_cell: Math.max(...boxes.map((b) => b.right - area.right)),
  };
}
"""

#: Each PNG figure of the widget: its displayed and natural sizes.
_IMAGES = """
() => [...document.querySelector('.qviz-panel').closest('.jp-OutputArea-output')
  .querySelectorAll('img')].filter((img) => img.naturalWidth > 0).map((img) => {
  const box = img.getBoundingClientRect();
  return { width: box.width, height: box.height, natural: [img.naturalWidth, img.naturalHeight] };
})
"""

#: The viewport of each width tested: a 1280x800 laptop and a 1920x1080 screen.
SIZES = {1280: 800, 1920: 1080}
#: Image pixels per CSS pixel of a figure (qviz.widgets.kit.layout.PIXEL_DENSITY).
DENSITY = 2


def _check_text(page: Any, name: str, width: int) -> float:
    text = page.evaluate(_SMALLEST_TEXT)
    assert text["count"] > 20, f"{name}: no text found in the widget: {text}"
    smallest = text["smallest"][0]
    assert smallest["px"] >= 10 - 0.05, f"{name} at {width}px: text under 10 px: {text}"
    for image in page.evaluate(_IMAGES):
        natural_w, natural_h = image["natural"]
        assert image["width"] <= natural_w, f"{name} at {width}px: a PNG is stretched: {image}"
        ratio = image["height"] / image["width"]
        assert ratio == pytest.approx(natural_h / natural_w, rel=0.02), image
        # shown at its CSS size (natural / density): its text is at the size it was drawn for
        assert image["width"] >= natural_w / DENSITY - 1, f"{name}: a PNG is shrunk: {image}"
    return float(smallest["px"])


def _check_layout(page: Any, name: str, width: int) -> dict[str, float]:
    page.set_viewport_size({"width": width, "height": SIZES[width]})
    page.wait_for_timeout(500)  # JupyterLab re-lays out the notebook on resize
    panes = page.evaluate(_PANES)
    assert panes["past_cell"] <= 1, f"{name} at {width}px: a pane spills past the cell: {panes}"
    panels = page.evaluate(_OVERFLOW)
    assert panels, f"{name}: no .qviz-panel in the page"
    for panel in panels:
        assert panel["inside"] <= 1, f"{name} at {width}px: panel content overflows: {panel}"
        assert panel["past_cell"] <= 1, f"{name} at {width}px: panel spills past the cell: {panel}"
    assert page.evaluate(_CUT_COLUMNS) == [], f"{name} at {width}px: table columns cut off"
    return dict(panes)


def _reset_keeps_text_legible(page: Any, name: str) -> float:
    page.locator(".qviz-graph-button", has_text="reset").first.click()
    page.wait_for_timeout(200)
    smallest = page.evaluate(_GRAPH_TEXT_PX)
    assert smallest >= 10 - 0.05, f"{name}: after reset the graph's text is {smallest:.1f} px"
    return float(smallest)


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
    panes = {}
    for width in (1280, 1920):
        panes[width] = _check_layout(page, name, width)
        panes[width]["smallest text"] = _check_text(page, name, width)
        page.locator(".qviz-graph").first.scroll_into_view_if_needed()
        page.screenshot(path=screenshots / f"layout-{name}-{width}.png")
        panes[width]["graph text after reset"] = _reset_keeps_text_legible(page, name)
        page.screenshot(path=screenshots / f"layout-{name}-{width}-reset.png")
        if name == "dashboard":
            page.locator(".qviz-panel").first.evaluate(
                "e => e.closest('.jp-OutputArea-output').querySelector('img').scrollIntoView()"
            )
            page.screenshot(path=screenshots / f"layout-{name}-{width}-detail.png")
    print(name, {w: {k: round(v, 1) for k, v in p.items()} for w, p in panes.items()})
    small, large = panes[1280], panes[1920]
    assert large["graph"] > small["graph"] + 100, f"{name}: the graph pane did not widen: {panes}"
    assert large["panel"] > small["panel"] + 100, f"{name}: the panel did not widen: {panes}"
    assert large["height"] > small["height"] + 50, f"{name}: the graph did not grow taller: {panes}"
    if name == "dashboard":
        header = page.locator(".qviz-dash-mono").first
        assert header.evaluate("e => e.scrollWidth <= e.clientWidth + 1")
        assert "weight" in header.inner_text()

    # the splitter: dragging the graph pane's edge to the right widens it
    graph = page.locator(".qviz-graph").first
    graph.evaluate("e => e.scrollIntoView({block: 'center'})")
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
