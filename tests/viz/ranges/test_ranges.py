"""qviz.viz.ranges: one row per observer group, bars equal to the observers' qparams ranges."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import CalibrationError, ConfigError

ranges = importlib.import_module("qviz.viz.ranges.range_view").ranges


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)).mean((2, 3))
        return self.fc(y) * 50.0  # an outlier range at the end


def _prepared(calibrate: bool = True):
    x = torch.randn(2, 2, 6, 6)
    gm = qviz.export(Net().eval(), (x,), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True)
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    if calibrate:
        qviz.calibrate(prepared, [torch.randn(4, 2, 6, 6) for _ in range(3)], progress=False)
    return prepared


def test_one_row_per_group_with_the_qparams_range():
    prepared = _prepared()
    fig = ranges(prepared)
    rows = fig.qviz_rows
    assert sorted(r["group"] for r in rows) == [g.group for g in prepared.plan.groups]
    ax = fig.axes[0]
    bars = {p.get_gid(): p for p in ax.patches if (p.get_gid() or "").startswith("range:")}
    assert len(bars) == len(prepared.plan.groups)
    for y, row in enumerate(rows):
        obs = prepared.get_submodule(row["observer"])
        scale, zero_point = obs.calculate_qparams()
        low = (scale.double() * (obs.quant_min - zero_point.double())).min()
        high = (scale.double() * (obs.quant_max - zero_point.double())).max()
        bar = bars[f"range:{row['group']}"]
        assert bar.get_x() == pytest.approx(float(low))
        assert bar.get_x() + bar.get_width() == pytest.approx(float(high))
        assert bar.get_y() + bar.get_height() / 2 == pytest.approx(y)
        assert row["observed_min"] == float(obs.min_val.min())
        assert row["observed_max"] == float(obs.max_val.max())
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].startswith("g0: ")  # the model input comes first
    assert all(f"g{r['group']}:" in label for r, label in zip(rows, labels, strict=True))


def test_outlier_is_flagged():
    rows = ranges(_prepared(), outlier=4.0).qviz_rows
    by_members = {r["members"]: r for r in rows}
    assert by_members[("mul",)]["outlier"]
    assert not by_members[("conv_weight -> conv2d",)]["outlier"]


def test_uncalibrated_and_wrong_inputs():
    with pytest.raises(CalibrationError, match=r"qviz\.calibrate"):
        ranges(_prepared(calibrate=False))
    with pytest.raises(ConfigError, match="prepare_pt2e"):
        ranges(nn.Linear(2, 2))


def test_a_converted_model_is_refused_naming_what_to_pass():
    """Issue 25: ``ranges(converted)`` raised AttributeError (no activation_post_process_0)."""
    converted = qviz.convert_pt2e(_prepared())
    with pytest.raises(
        ConfigError, match=r"prepared.*converted GraphModule.*before qviz.convert_pt2e"
    ):
        ranges(converted)
