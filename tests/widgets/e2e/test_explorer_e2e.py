"""CalibrationExplorer in JupyterLab in a real browser: the observer dropdown, the method toggle
buttons, the percentile slider driven by the keyboard and "Use this range" all reach the kernel,
and the table and status follow."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.widgets.e2e.conftest import labelled

pytestmark = pytest.mark.browser

SETUP = """
import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.widgets import CalibrationExplorer

calib = [x for x, _ in digits_loaders(batch_size=90).calibration]
gm = qviz.export(digits_model(), (calib[0],), dynamic_batch=True)
config = get_symmetric_quantization_config(is_per_channel=True, switchable=True)
prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
prepared = qviz.calibrate(prepared, calib, progress=False)
ex = CalibrationExplorer(prepared)
"""

SHOW = "ex"

OBSERVER = (
    "activation_post_process_7"  # relu_2, the residual block's output (not the first observer)
)


def _row(page: Any, method: str) -> Any:
    """The methods table's row of ``method``."""
    first = page.locator("td", has_text=re.compile(f"^{method}\\b"))
    return page.locator("table.qviz-calib tr").filter(has=first)


def _highlighted(page: Any) -> str:
    """The method of the table's highlighted row."""
    row = page.locator('table.qviz-calib tr[style*="background"]')
    return row.locator("td").first.inner_text().split()[0]


def _wait_highlighted(page: Any, method: str) -> None:
    page.wait_for_function(
        """(m) => {
             const row = document.querySelector('table.qviz-calib tr[style*="background"]');
             return row && row.cells[0].textContent.split(' ')[0] === m;
           }""",
        arg=method,
        timeout=10_000,
    )


def _wait_text_change(page: Any, selector: str, old: str) -> None:
    page.wait_for_function(
        "([s, old]) => { const e = document.querySelector(s); return e && e.textContent !== old; }",
        arg=[selector, old],
        timeout=10_000,
    )


def test_calibration_explorer_in_jupyterlab(lab: Any, screenshots: Path) -> None:
    page = lab.open_notebook([SETUP, SHOW], name="explorer.ipynb")
    page.evaluate("window.jupyterapp.commands.execute('application:toggle-left-area')")
    output = page.locator(".jp-Cell-outputArea").last
    table = page.locator("table.qviz-calib")
    table.wait_for(timeout=20_000)
    page.locator(".qviz-graph g.node").first.wait_for(timeout=20_000)
    assert _highlighted(page) == "l2"
    output.scroll_into_view_if_needed()
    page.screenshot(path=screenshots / "explorer-1-opened.png")

    # another observer from the dropdown: the table and histogram are the new observer's
    observer = labelled(page, "widget-dropdown", "observer").locator("select")
    old_table = table.inner_text()
    labels = observer.locator("option").all_inner_texts()
    observer.select_option(label=next(t for t in labels if t.startswith(f"{OBSERVER}:")))
    _wait_text_change(page, "table.qviz-calib", old_table)
    assert lab.kernel_json(page, "ex.state.observer") == OBSERVER

    # the entropy toggle button: the highlighted row follows
    toggles = page.locator(".widget-toggle-buttons button")
    toggles.filter(has_text=re.compile("^entropy$")).click()
    _wait_highlighted(page, "entropy")
    assert lab.kernel_json(page, "ex.state.method") == "entropy"
    page.screenshot(path=screenshots / "explorer-2-entropy.png")

    # percentile, then the slider moved with the keyboard: the percentile row's range moves
    slider = labelled(page, "widget-hslider", "percentile")
    toggles.filter(has_text=re.compile("^percentile$")).click()
    _wait_highlighted(page, "percentile")
    readout = slider.locator(".widget-readout")
    assert readout.inner_text().strip() == "99.990"
    before = _row(page, "percentile").inner_text()
    handle = slider.locator(".noUi-handle")
    handle.focus()
    for _ in range(10):
        handle.press("ArrowLeft")
    assert readout.inner_text().strip() == "99.980"  # ten steps of 0.001
    # the last key's value reached the kernel
    lab.wait_kernel(page, "round(ex.state.percentile, 6)", 99.98)
    high = lab.kernel_json(page, "next(r['high'] for r in ex.rows if r['method'] == 'percentile')")
    expected = f"{high:.4g}]"
    _row(page, "percentile").filter(has_text=expected).wait_for(timeout=10_000)
    assert _row(page, "percentile").inner_text() != before
    assert float(re.search(r"([-\d.e]+)\]", before).group(1)) > high  # 99.98 clips more
    page.screenshot(path=screenshots / "explorer-3-percentile.png")

    # "Use this range": the status says the user chose, and the plan records it
    page.get_by_role("button", name="Use this range").click()
    page.get_by_text(re.compile("user choice: percentile 99.98")).wait_for(timeout=10_000)
    _row(page, "percentile").filter(has_text="★").wait_for(timeout=10_000)
    assert lab.kernel_json(page, "ex.choices") == {OBSERVER: "percentile 99.98"}
    page.screenshot(path=screenshots / "explorer-4-chosen.png")
    output.screenshot(path=screenshots / "explorer-4-widget.png")

    assert lab.blocked == [], f"the page tried to reach the network: {lab.blocked}"
    assert lab.errors == [], f"JavaScript errors: {lab.errors}"
