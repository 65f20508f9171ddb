"""GraphWidget in JupyterLab in a real browser: clicks reach the kernel, modules expand, search
outlines, the wheel zooms, and nothing is fetched from outside 127.0.0.1."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.widgets.e2e.conftest import graph_group

pytestmark = pytest.mark.browser

SETUP = """
import ipywidgets as widgets
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.viz import graph
from qviz.widgets.kit.graph_widget import GraphWidget


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU())
        self.block2 = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.block2(self.block1(x)).mean((2, 3)))


gm = qviz.export(Blocks().eval(), (torch.randn(1, 1, 6, 6),))
model = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config()))
"""

SHOW = """
collapsed = {"block1", "block2", "head"}
w = GraphWidget(height="560px").show(graph(model, collapse=1))
status = widgets.Label("ready", layout={"min_width": "40em"})


def on_selected(change):
    status.value = f"selected={change['new']}"


def on_module(change):  # the owner re-renders: a click toggles the module open or shut
    path = change["new"]["path"]
    collapsed.symmetric_difference_update({path})
    w.show(graph(model, collapse=sorted(collapsed)))
    status.value = f"module={path} n={change['new']['n']}"


w.observe(on_selected, "selected")
w.observe(on_module, "module_click")
w.selected = "x"  # from Python: the browser outlines the input
widgets.VBox([status, w])
"""


def _status(page: Any, text: str) -> None:
    page.locator(".widget-label", has_text=text).wait_for(timeout=10_000)


def _transform(page: Any) -> str:
    return str(page.locator(".qviz-graph g.qviz-viewport").get_attribute("transform"))


def test_graph_widget_in_jupyterlab(lab: Any, screenshots: Path) -> None:
    page = lab.open_notebook([SETUP, SHOW])
    nodes = page.locator(".qviz-graph g.node")
    nodes.first.wait_for(timeout=20_000)
    before = nodes.count()
    assert graph_group(page, "node", "module/block1").count() == 1
    _status(page, "selected=x")
    assert graph_group(page, "node", "x").get_attribute("class") == "node qviz-selected"
    page.locator(".qviz-graph").scroll_into_view_if_needed()
    page.screenshot(path=screenshots / "1-collapsed.png")

    graph_group(page, "node", "mean").click()  # an op: its name reaches the kernel
    _status(page, "selected=mean")
    assert page.locator(".qviz-graph .qviz-selected-outline").count() == 1

    graph_group(page, "node", "obs/relu").click()  # an observer marker: its first plan tensor
    _status(page, "selected=relu")

    graph_group(page, "node", "module/block1").click()  # the owner expands the module
    _status(page, "module=block1 n=1")
    graph_group(page, "cluster", "cluster_block1").wait_for(state="attached", timeout=10_000)
    assert nodes.count() > before
    assert graph_group(page, "node", "conv2d").count() == 1
    assert graph_group(page, "node", "module/block1").count() == 0

    page.locator(".qviz-graph .qviz-graph-search").fill("conv2d")
    match = page.locator(".qviz-graph g.node.qviz-match")
    match.first.wait_for(state="attached", timeout=5_000)
    assert "conv2d" in {t.strip() for t in match.locator("title").all_text_contents()}
    page.screenshot(path=screenshots / "2-expanded-search.png")

    zoom = _transform(page)
    box = page.locator(".qviz-graph .qviz-graph-viewport").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, -400)
    page.wait_for_function(
        "old => document.querySelector('.qviz-graph g.qviz-viewport')"
        ".getAttribute('transform') !== old",
        arg=zoom,
        timeout=5_000,
    )
    old_scale = float(re.search(r"scale\(([\d.e-]+)\)", zoom).group(1))
    new_scale = float(re.search(r"scale\(([\d.e-]+)\)", _transform(page)).group(1))
    assert new_scale > old_scale
    page.screenshot(path=screenshots / "3-zoomed.png")

    assert lab.blocked == [], f"the page tried to reach the network: {lab.blocked}"
    assert lab.errors == [], f"JavaScript errors: {lab.errors}"
