"""QATDashboard without a kernel: monitor steps redraw it from inside the loop, throttled by
steps and by time, and the view shows the monitor's latest records."""

from __future__ import annotations

import copy
import functools
import time

import pytest
import torch
from torch import nn

from qviz.errors import ConfigError
from qviz.numeric import QATMonitor
from qviz.widgets import QATDashboard

pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
xnn = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")

PNG = b"\x89PNG"


@functools.cache
def _prepared_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    gm = torch.export.export(model, (torch.randn(4, 8),)).module()
    config = xnn.get_symmetric_quantization_config(is_qat=True)
    return pt2e.prepare_qat_pt2e(gm, xnn.XNNPACKQuantizer().set_global(config))


@pytest.fixture
def trained():
    """A fresh QAT-prepared model, its monitor and a ``train(steps, tick)`` function that
    advances ``clock`` (a fake time source, seconds) by ``tick`` per step."""
    model = copy.deepcopy(_prepared_once())  # torchao's prepare takes seconds: done once
    monitor = QATMonitor(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    clock = [0.0]

    def train(steps, tick=0.0):
        for _ in range(steps):
            opt.zero_grad()
            loss = model(torch.randn(4, 8, generator=g) * 2).square().mean()
            loss.backward()
            opt.step()
            clock[0] += tick
            monitor.step(loss=loss, metric=0.5)

    return monitor, train, clock


def test_after_n_steps_the_view_shows_step_n_and_the_latest_records(trained):
    monitor, train, _ = trained
    dash = QATDashboard(monitor, every=1, min_interval_s=0, max_share=1)  # no time throttle
    assert "waiting for the first monitor.step()" in dash.view.status.value
    assert (
        bytes(dash.view.figure.value) == b""
        and "after the first step" in dash.view.figure_note.value
    )
    train(1)
    first_png = bytes(dash.view.figure.value)
    assert first_png.startswith(PNG) and dash.view.figure_note.value == ""
    train(2)
    assert dash.shown_step == 3 and dash.renders == 4  # created + one per step
    loss = monitor.records[-1].loss
    assert f"step 3 · loss {loss:.4g} · metric 0.5" in dash.view.status.value
    assert dash.records == tuple(r for r in monitor.records if r.step == 3)
    table = dash.view.table.value
    assert table.count("<tr>") == 1 + len(monitor.modules)  # header + one row per module
    for record in dash.records:
        assert record.name.removeprefix("activation_post_process_") in table
        assert f"{record.clipped:.1%}" in table
    changes = sorted({str(c) for c in monitor.changes.values()})
    assert all(f"<td>{c}</td>" in table for c in changes)
    now_png = bytes(dash.view.figure.value)
    assert now_png.startswith(PNG) and now_png != first_png
    assert "last redraw" in dash.view.cost.value


def test_steps_throttle_redraws_and_refresh_shows_the_last_step(trained):
    monitor, train, clock = trained
    dash = QATDashboard(monitor, every=10, min_interval_s=0, max_share=1, figure=False,
                        clock=lambda: clock[0])  # fmt: skip
    shown = []
    monitor.add_callback(lambda m, records: shown.append(dash.shown_step))
    train(35, tick=1.0)
    assert dash.renders == 1 + 3 and dash.shown_step == 30  # steps 10, 20, 30
    assert shown[9] == 10 and shown[8] == 0  # redrawn inside step 10's monitor.step()
    assert "step 30 ·" in dash.view.status.value
    dash.refresh()
    assert dash.shown_step == 35 and "step 35 ·" in dash.view.status.value


def test_wall_time_throttles_redraws_when_steps_are_fast(trained):
    monitor, train, clock = trained
    dash = QATDashboard(monitor, every=5, min_interval_s=3.0, figure=False,
                        clock=lambda: clock[0])  # fmt: skip
    train(40, tick=0.25)
    # due at t >= 3 s after the last redraw and >= 5 steps: steps 12 (t=3), 24 (6), 36 (9)
    assert dash.renders == 4 and dash.shown_step == 36
    assert dash.renders < monitor.steps


def test_redraws_take_at_most_max_share_of_the_time(trained, monkeypatch):
    import qviz.widgets.qat_dashboard_view as view

    monitor, train, _ = trained
    slow = view.QATDashboardView.refresh

    def slow_view(self):  # a redraw that costs 20 ms
        slow(self)
        time.sleep(0.02)

    monkeypatch.setattr(view.QATDashboardView, "refresh", slow_view)
    dash = QATDashboard(monitor, every=1, min_interval_s=0, max_share=0.1, figure=False)
    for _ in range(60):
        train(1)
        time.sleep(0.003)
    assert 1 < dash.renders < 20  # every step was due by steps; time held most back
    assert dash.last_render_s >= 0.02
    assert dash.render_share < 0.2  # 10 % and the wait before the first step


def test_close_detaches_and_a_trained_monitor_shows_its_last_step(trained):
    monitor, train, _ = trained
    train(4)
    dash = QATDashboard(monitor, every=1, min_interval_s=0, figure=False)
    assert dash.shown_step == 4 and [r.step for r in dash.records] == [4] * len(monitor.modules)
    dash.close()
    train(2)
    assert dash.shown_step == 4 and dash.renders == 1
    assert "shown step 4" in repr(dash)
    bundle = dash._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every": 0}, r"every must be an int >= 1, got 0"),
        ({"min_interval_s": -1}, r"min_interval_s must be a number of seconds >= 0"),
        ({"max_share": 0}, r"max_share must be a share in \(0, 1\]"),
    ],
)
def test_bad_settings_are_refused_with_the_fix(trained, kwargs, message):
    monitor, _, _ = trained
    with pytest.raises(ConfigError, match=message):
        QATDashboard(monitor, **kwargs)
    assert monitor._callbacks == []  # nothing attached


def test_a_model_instead_of_a_monitor_is_refused():
    with pytest.raises(ConfigError, match=r"QATMonitor\(model\).*got Sequential"):
        QATDashboard(nn.Sequential())


def test_the_table_shows_quantplan_groups_and_per_channel_ranges():
    from dataclasses import replace

    from qviz.numeric.qat_monitor import QATRecord
    from qviz.widgets.qat_dashboard_view import table_html

    r = QATRecord(step=1, name="activation_post_process_0", group=None, per_channel=True,
                  scale=0.02, scale_min=0.01, scale_max=0.04, zero_point=0.0, changed=True,
                  clipped=0.0, mean_abs_over_scale=3.0)  # fmt: skip
    plain = table_html([r], {})
    assert "<th>group</th>" not in plain and "[0.01, 0.04]" in plain
    grouped = table_html([r, replace(r, name="b", group=7, per_channel=False)], {"b": 2})
    assert "<th>group</th>" in grouped and "<td>7</td>" in grouped and "<td>2</td>" in grouped
