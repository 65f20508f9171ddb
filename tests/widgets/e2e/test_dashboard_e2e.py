"""NumericDashboard in JupyterLab: pick the worst layer, toggle its fallback in the browser, and
the history row shows the model's output SQNR before and after."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

SETUP = """
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.widgets import NumericDashboard


class ThreeConvs(nn.Module):  # conv2 holds one huge weight on a dead input channel
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = torch.relu(self.conv3(x))
        return self.fc(x.mean((2, 3)))


torch.manual_seed(0)
model = ThreeConvs().eval()
with torch.no_grad():
    model.conv1.bias[0] = -100.0
    model.conv2.weight[0, 0, 1, 1] = 200 * model.conv2.weight.abs().max()
data = [torch.randn(8, 3, 12, 12) for _ in range(3)]
gm = qviz.export(model, (data[0],), dynamic_batch=True)
q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
quantized = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), data, progress=False))


def agreement(float_out, quant_out, target):  # top-1 agreement with the float model
    return float((float_out.argmax(1) == quant_out.argmax(1)).float().mean())


dash = NumericDashboard.from_models(
    gm, quantized, data, metric=agreement, quantizer=q, progress=False
)
dash
"""


def _sqnr_pair(page: Any) -> tuple[float, float]:
    text = page.locator("text=before → after").first.inner_text()
    low, high = re.search(r"([-\d.]+) → ([-\d.]+) dB", text).groups()
    return float(low), float(high)


def test_fallback_toggle_in_the_browser(lab: Any, screenshots: Path) -> None:
    page = lab.open_notebook([SETUP])
    page.locator(".qviz-graph svg g.node").first.wait_for(timeout=30_000)
    page.locator("text=before → after").first.wait_for(timeout=10_000)
    before, after = _sqnr_pair(page)
    assert before == after  # one run so far
    selected = page.locator(".widget-select select").first.input_value()
    assert selected.startswith("conv2d_1")  # the dashboard opens on the worst local SQNR
    page.screenshot(path=screenshots / "dashboard-before.png", full_page=True)

    page.get_by_role("button", name="fallback this layer").click()
    page.wait_for_function(
        "() => /→ ([-\\d.]+) dB/.test(document.body.innerText) && "
        "document.querySelectorAll('table.qviz-dash-history tr').length >= 3",
        timeout=60_000,
    )
    before, after = _sqnr_pair(page)
    assert after > before + 20.0  # keeping the broken conv in float repairs the model
    history = page.locator("table.qviz-dash-history").first.inner_text()
    rows = [line.split("\t") for line in history.splitlines() if line.startswith(("0", "1"))]
    assert rows[1][1] == "conv2d_1"  # the run with the layer in float
    first_metric, last_metric = float(rows[0][4]), float(rows[1][4])
    assert last_metric >= first_metric and last_metric == 1.0  # the metric row: agreement
    page.screenshot(path=screenshots / "dashboard-after.png", full_page=True)
    assert lab.blocked == [] and lab.errors == []
