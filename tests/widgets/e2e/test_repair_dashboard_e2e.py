"""NumericDashboard.from_session in JupyterLab: the broken layer's diagnosis (cause, evidence,
prescription), the graph coloured by cause, "apply" of the prescription with its before and
after, and "undo"."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.widgets.e2e.test_dashboard_e2e import SETUP

pytestmark = pytest.mark.browser

SESSION = (
    SETUP.rsplit("dash = NumericDashboard.from_models", 1)[0]
    + """
from qviz.numeric import RepairSession

session = RepairSession(gm, q, data, data, metric=agreement, progress=False)
dash = NumericDashboard.from_session(session)
dash
"""
)


def _history(page: Any) -> list[list[str]]:
    text = page.locator("table.qviz-dash-history").first.inner_text()
    return [line.split("\t") for line in text.splitlines() if re.match(r"\d", line)]


def _shot(page: Any, path: Path) -> None:
    """The dashboard's output area (scrolled into view), not the code above it."""
    page.locator(".jp-Cell-outputArea").first.screenshot(path=path)


def _click(page: Any, button: str, rows: int) -> list[list[str]]:
    """Click ``button``, wait until the history has ``rows`` rows (its header included)."""
    page.get_by_role("button", name=button).click()
    page.wait_for_function(
        f"() => document.querySelectorAll('table.qviz-dash-history tr').length >= {rows}",
        timeout=90_000,
    )
    return _history(page)


def test_apply_and_undo_a_prescription_in_the_browser(lab: Any, screenshots: Path) -> None:
    page = lab.open_notebook([SESSION])
    page.locator(".qviz-graph svg g.node").first.wait_for(timeout=60_000)
    diagnosis = page.locator(".qviz-dash-diagnosis").first
    diagnosis.wait_for(timeout=10_000)
    text = diagnosis.inner_text()
    assert text.startswith("conv2d_1") and "outlier channels" in text
    assert "prescription: quantize" in text and "per channel" in text
    page.get_by_role("combobox", name="colour by").select_option("cause")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.qviz-graph svg text')]"
        ".some(t => t.textContent.includes('cause: outlier channels'))",
        timeout=30_000,
    )
    _shot(page, screenshots / "repair-dashboard-before.png")

    rows = _click(page, "apply", 3)
    assert rows[1][1] == "override"
    assert float(rows[1][2]) > float(rows[0][2]) + 10  # output SQNR, dB
    page.locator("text=after override").first.wait_for(timeout=10_000)
    _shot(page, screenshots / "repair-dashboard-after.png")

    rows = _click(page, "undo", 4)
    assert rows[2][1] == "undo override" and rows[2][2] == rows[0][2]
    assert lab.kernel_json(page, "len(session.history)") == 0
    _shot(page, screenshots / "repair-dashboard-undo.png")
    assert lab.blocked == [] and lab.errors == []
