"""QATDashboard without a kernel: monitor steps redraw it from inside the loop, throttled by
steps and by time, and the view shows the monitor's latest records."""

from __future__ import annotations

import copy
import functools
import re
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
        assert f">{record.label}</td>" in table  # named by the tensor, not a bare number
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
    import qviz.widgets.qat.view as view

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

    from qviz.numeric.qat.monitor import QATRecord
    from qviz.widgets.qat.view import table_html

    r = QATRecord(step=1, name="activation_post_process_0", group=None, per_channel=True,
                  scale=0.02, scale_min=0.01, scale_max=0.04, zero_point=0.0, changed=True,
                  clipped=0.0, mean_abs_over_scale=3.0)  # fmt: skip
    plain = table_html([r], {})
    assert "<th>group</th>" not in plain and "[0.01, 0.04]" in plain
    grouped = table_html([r, replace(r, name="b", group=7, per_channel=False)], {"b": 2})
    assert "<th>group</th>" in grouped and "<td>7</td>" in grouped and "<td>2</td>" in grouped


def test_the_table_names_each_module_by_the_tensor_it_quantizes(trained):
    monitor, train, _ = trained
    train(1)
    table = QATDashboard(monitor, figure=False).view.table.value
    assert "<th>quantizes</th>" in table
    for label in (
        "input input_1",
        "linear weight",
        "relu output",
        "linear_1 weight",
        "linear_1 output",
    ):
        assert f">{label}</td>" in table
    firsts = re.findall(r"<tr><td title='module [^']*'>([^<]*)</td>", table)
    assert len(firsts) == len(monitor.modules)
    assert not [text for text in firsts if text.isdigit()]  # no bare module number


def _observing(monitor):
    return [bool(m.observer_enabled[0]) for m in monitor.modules.values()]


def test_freeze_observers_stops_the_scales_and_a_second_click_restarts_them(trained):
    monitor, train, _ = trained
    dash = QATDashboard(monitor, every=1, min_interval_s=0, max_share=1, figure=False)
    assert dash.model is monitor.model and not dash.observers_frozen
    train(3)
    dash.view.observers_button.value = True  # the click
    assert dash.observers_frozen and _observing(monitor) == [False] * len(monitor.modules)
    assert [(e.step, e.text) for e in monitor.events] == [(3, "observers frozen")]
    assert "observers frozen after step 3" in dash.view.status.value
    before = dict(monitor.changes)
    train(5)
    assert monitor.changes == before  # the scales stopped moving
    assert not any(r.changed for r in monitor.records if r.step > 3)
    dash.view.observers_button.value = False  # the second click
    assert _observing(monitor) == [True] * len(monitor.modules)
    train(3)
    assert any(r.changed for r in monitor.records if r.step > 8)  # moving again
    assert monitor.events[-1].text == "observers running again"


def test_the_figure_marks_the_freeze(trained):
    monitor, train, _ = trained
    dash = QATDashboard(monitor, every=1, min_interval_s=0, max_share=1)
    train(2)
    dash.freeze_observers()
    train(2)
    assert dash.view.observers_button.value is True  # the button follows the method
    fig = monitor.plot()
    assert any(line.get_xdata()[0] == 2.5 for ax in fig.axes for line in ax.get_lines()
               if line.get_linestyle() == "--")  # fmt: skip
    assert bytes(dash.view.figure.value).startswith(PNG)


@functools.cache
def _bn_prepared():
    import qviz
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU()).train()
    gm = qviz.export(model, (torch.randn(4, 1, 6, 6),))
    config = get_symmetric_quantization_config(is_qat=True)
    return qviz.prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(config))


def test_freeze_bn_stats_keeps_the_running_statistics():
    model = copy.deepcopy(_bn_prepared())
    monitor = QATMonitor(model)
    dash = QATDashboard(monitor, figure=False)
    mean = next(b for n, b in model.named_buffers() if n.endswith("running_mean"))
    model(torch.randn(4, 1, 6, 6) + 3)
    monitor.step()
    dash.view.bn_button.value = True  # the click
    assert dash.bn_frozen and "BatchNorm statistics frozen after step 1" in dash.note
    kept = mean.clone()
    model(torch.randn(4, 1, 6, 6) + 5)
    monitor.step()
    assert torch.equal(mean, kept)
    dash.freeze_bn_stats(False)
    model(torch.randn(4, 1, 6, 6) + 5)
    assert not torch.equal(mean, kept) and not dash.view.bn_button.value
    assert QATDashboard(monitor, figure=False).bn_frozen is False


def test_a_model_without_batchnorm_says_so_and_a_missing_model_is_named(trained):
    monitor, _, _ = trained
    dash = QATDashboard(monitor, figure=False)
    dash.view.bn_button.value = True
    assert not dash.bn_frozen and dash.view.bn_button.value is False  # the toggle undone
    assert "no batch_norm" in dash.note and "no batch_norm" in dash.view.status.value
    with pytest.raises(ConfigError, match=r"model must be the QAT-prepared model.*got str"):
        QATDashboard(monitor, model="model")
