"""AnnotationEditor in JupyterLab in a real browser: a click on the graph selects a node, the
dtype dropdown and Apply re-plan in the kernel and redraw the graph, a refused edit shows the
engine's message and changes nothing, and a module cluster collapses and expands again."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest

from tests.widgets.e2e.conftest import graph_group, labelled

pytestmark = pytest.mark.browser

SETUP = """
import torch

import qviz
from qviz.data import digits_model
from qviz.widgets import AnnotationEditor

gm = qviz.export(digits_model(), (torch.randn(4, 1, 8, 8),), dynamic_batch=True)
ed = AnnotationEditor(gm)
"""

SHOW = "ed"


def _svg_digest(page: Any) -> str:
    html = page.locator(".qviz-graph svg").first.evaluate("e => e.innerHTML")
    return hashlib.sha256(html.encode()).hexdigest()


def _wait_svg_change(page: Any, digest: str) -> None:
    page.wait_for_function(
        """async (old) => {
             const svg = document.querySelector('.qviz-graph svg');
             const bytes = new TextEncoder().encode(svg ? svg.innerHTML : '');
             const hash = await crypto.subtle.digest('SHA-256', bytes);
             const hex = [...new Uint8Array(hash)].map(b => b.toString(16).padStart(2, '0'));
             return hex.join('') !== old;
           }""",
        arg=digest,
        timeout=15_000,
    )


def test_annotation_editor_in_jupyterlab(lab: Any, screenshots: Path) -> None:
    page = lab.open_notebook([SETUP, SHOW], name="editor.ipynb")
    page.evaluate("window.jupyterapp.commands.execute('application:toggle-left-area')")
    output = page.locator(".jp-Cell-outputArea").last
    page.locator(".qviz-graph g.node").first.wait_for(timeout=20_000)
    page.get_by_text("Click a node, an edge or an observer in the graph, or choose").wait_for()
    output.scroll_into_view_if_needed()
    page.screenshot(path=screenshots / "editor-1-opened.png")

    # a click on the relu node selects it: the panel shows its annotation
    relu = graph_group(page, "node", "relu")
    relu.scroll_into_view_if_needed()
    relu.click()
    page.locator("b", has_text=re.compile(r"^node relu$")).wait_for(timeout=10_000)
    assert page.locator("table.qviz-annotation").count() == 1
    assert labelled(page, "widget-dropdown", "edit").locator("select").input_value() == "relu"
    page.screenshot(path=screenshots / "editor-2-relu-selected.png")

    # dtype uint8 + Apply: the kernel re-plans and the graph is redrawn
    before = _svg_digest(page)
    labelled(page, "widget-dropdown", "dtype").locator("select").select_option("uint8")
    page.get_by_role("button", name="Apply").click()
    _wait_svg_change(page, before)
    page.get_by_text("your edits:").wait_for(timeout=10_000)
    page.locator("table.qviz-annotation td", has_text=re.compile("^uint8\\b")).first.wait_for()
    assert (
        labelled(page, "widget-dropdown", "dtype").locator("select").input_value() == "(keep)"
    )  # the controls reset after Apply
    expected = {"relu": {"dtype": "uint8"}}
    state = lab.kernel_json(
        page,
        "{'overrides': ed.overrides, 'quantizer': ed.quantizer.overrides, 'error': ed.error,"
        " 'quant_max': ed.plan.group_of('relu').spec.quant_max}",
    )
    assert state == {"overrides": expected, "quantizer": expected, "error": None, "quant_max": 255}
    page.screenshot(path=screenshots / "editor-3-uint8-applied.png")
    output.screenshot(path=screenshots / "editor-3-widget.png")

    # an edit the engine refuses (relu shares with itself): the message, and nothing changes
    after_edit = _svg_digest(page)
    labelled(page, "widget-dropdown", "share with").locator("select").select_option("relu")
    page.get_by_role("button", name="Apply").click()
    warning = page.get_by_text(re.compile("⚠ .*sharing cycle"))
    warning.wait_for(timeout=10_000)
    state = lab.kernel_json(page, "{'overrides': ed.overrides, 'error': ed.error}")
    assert state["overrides"] == expected
    assert "sharing cycle" in state["error"]
    assert _svg_digest(page) == after_edit  # a refusal does not redraw
    page.screenshot(path=screenshots / "editor-4-refused.png")

    # a click on the block cluster's label collapses it; a click on the box expands it again
    graph_group(page, "cluster", "cluster_block").locator("text").first.click()
    box = graph_group(page, "node", "module/block")
    box.wait_for(state="attached", timeout=15_000)
    assert graph_group(page, "cluster", "cluster_block").count() == 0
    assert graph_group(page, "node", "conv2d_1").count() == 0  # block.conv1 is inside the box
    assert lab.kernel_json(page, "ed.collapsed") == ["block"]
    page.screenshot(path=screenshots / "editor-5-block-collapsed.png")
    box.click()
    graph_group(page, "cluster", "cluster_block").wait_for(state="attached", timeout=15_000)
    assert graph_group(page, "node", "module/block").count() == 0
    assert graph_group(page, "node", "conv2d_1").count() == 1
    assert lab.kernel_json(page, "{'collapsed': ed.collapsed, 'overrides': ed.overrides}") == {
        "collapsed": [],
        "overrides": expected,
    }
    page.screenshot(path=screenshots / "editor-6-block-expanded.png")

    assert lab.blocked == [], f"the page tried to reach the network: {lab.blocked}"
    assert lab.errors == [], f"JavaScript errors: {lab.errors}"


def test_a_click_on_an_edge_selects_it(lab: Any, screenshots: Path) -> None:
    """Issue 25: notebook 05's "click the edge conv2d_2 -> add". The drawing splits it at its
    observer (``conv2d_2 -> obs/conv2d_2 -> add``); a click on either arrow selects the edge."""
    page = lab.open_notebook([SETUP, SHOW], name="editor-edge.ipynb")
    page.evaluate("window.jupyterapp.commands.execute('application:toggle-left-area')")
    page.locator(".qviz-graph g.node").first.wait_for(timeout=20_000)
    for title, expected in (
        ("conv2d_2->obs/conv2d_2", "conv2d_2 -> add"),
        ("obs/relu->add", "relu -> add"),
    ):
        page.locator(".qviz-graph-search").fill("add")  # the search centres the node add
        page.locator(".qviz-graph-search").press("Enter")
        page.screenshot(path=screenshots / "editor-edge-before.png")
        graph_group(page, "edge", title).locator("polygon").first.click()
        heading = page.locator("b", has_text=re.compile(f"^edge {re.escape(expected)}$"))
        heading.wait_for(timeout=10_000)
        state = lab.kernel_json(page, "{'selection': ed.selection, 'error': ed.error}")
        assert state == {"selection": expected, "error": None}
        assert labelled(page, "widget-dropdown", "edit").locator("select").input_value() == expected
        assert page.locator(".qviz-graph g.edge.qviz-selected title").text_content() == title
    page.locator(".jp-Cell-outputArea").last.screenshot(path=screenshots / "editor-edge.png")
    assert lab.blocked == [], f"the page tried to reach the network: {lab.blocked}"
    assert lab.errors == [], f"JavaScript errors: {lab.errors}"
