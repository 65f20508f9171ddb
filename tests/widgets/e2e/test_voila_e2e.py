"""The widgets render in Voilà too (a dashboard app without the notebook), with no network."""

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
]


def test_editor_and_explorer_render_in_voila(voila, screenshots):
    app = voila(CELLS)
    page = app.context.new_page()
    page.on("pageerror", lambda error: app.errors.append(str(error)))
    page.goto(f"{app.url}/", timeout=120_000)
    graph = page.locator(".qviz-graph svg").first  # the editor's graph widget
    graph.wait_for(timeout=120_000)
    assert page.locator(".qviz-graph svg g.node").count() > 10
    page.locator("table.qviz-calib").first.wait_for(timeout=60_000)  # the explorer's table
    assert page.locator("text=Use this range").count() == 1
    page.screenshot(path=str(screenshots / "voila.png"), full_page=True)
    # Voila's own page template links Font Awesome's CSS (icons) from a CDN; offline it fails
    # without effect. Nothing else may leave 127.0.0.1: the widgets' code ships in the packages.
    assert all("fontawesome" in url for url in app.blocked), app.blocked
    assert app.errors == []
