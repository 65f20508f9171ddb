"""The widgets render in Voilà too (a dashboard app without the notebook), with no network:
launched as the widgets guide says (``python -m qviz.apps.voila``, see the ``voila`` fixture), the
page asks nothing of any other host and logs no console error."""

import pytest

pytestmark = pytest.mark.browser

CELLS = [
    "import torch, qviz\n"
    "from qviz.data import digits_loaders, digits_model\n"
    "from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config\n"
    "from qviz.widgets import AnnotationEditor, CalibrationExplorer\n"
    "calib = [x for x, _ in digits_loaders(batch_size=90).calibration]\n"
    "gm = qviz.export(digits_model(), (calib[0],), dynamic_batch=True)",
    "AnnotationEditor(gm)",
    "config = get_symmetric_quantization_config(switchable=True)\n"
    "prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))\n"
    "qviz.calibrate(prepared, calib, progress=False)\n"
    "CalibrationExplorer(prepared, graph=False)",
    "qviz.viz.graph(gm, collapse=1)",
]


def test_editor_and_explorer_render_in_voila(voila, screenshots):
    app = voila(CELLS)
    page = app.context.new_page()
    page.on("pageerror", lambda error: app.errors.append(str(error)))
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.goto(f"{app.url}/", timeout=120_000)
    graph = page.locator(".qviz-graph svg").first  # the editor's graph widget
    graph.wait_for(timeout=120_000)
    assert page.locator(".qviz-graph svg g.node").count() > 10
    page.locator("table.qviz-calib").first.wait_for(timeout=60_000)  # the explorer's table
    assert page.locator("text=Use this range").count() == 1
    # a drawn graph is SVG inline in the page (Voila prefers the text/html), not an <img>
    inline = page.locator(".jp-OutputArea-output svg.qviz-inline-graph")
    assert inline.count() == 1 and inline.locator("g.node title").count() > 5
    assert page.locator('.jp-OutputArea-output img[src^="data:image/svg"]').count() == 0
    inline.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "voila_graph.png"))
    page.screenshot(path=str(screenshots / "voila.png"), full_page=True)
    # qviz's Voila template drops the Font Awesome stylesheets Voila's own links from a CDN;
    # nothing leaves 127.0.0.1: the widgets' code and icon font ship in the packages
    assert app.blocked == []
    assert app.errors == [] and console == []
    # the icons still come from a font: Font Awesome, bundled with Voila's widget manager
    assert page.evaluate("[...document.fonts].some(f => /Font Awesome/.test(f.family))")
    assert page.locator('link[href*="jsdelivr"]').count() == 0
