"""QATMonitor on a QAT-prepared model: what it records is checked against torch's own
fake-quantize gradient mask, and its memory stays bounded."""

import copy
import functools

import pytest
import torch
from torch import nn

from qviz.errors import ConfigError
from qviz.numeric.qat.monitor import QATMonitor

pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
xnn = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")
torchao_pt2e = pytest.importorskip("torchao.quantization.pt2e")


@functools.cache
def _prepared_once(per_channel: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    gm = torch.export.export(model, (torch.randn(4, 8),)).module()
    config = xnn.get_symmetric_quantization_config(is_per_channel=per_channel, is_qat=True)
    return pt2e.prepare_qat_pt2e(gm, xnn.XNNPACKQuantizer().set_global(config))


def _prepared(per_channel=False):
    """A fresh copy of a QAT-prepared model (torchao's prepare takes seconds: done once)."""
    return copy.deepcopy(_prepared_once(per_channel))


def _train(prepared, monitor, steps, scale=1.0):
    opt = torch.optim.SGD(prepared.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, 8, generator=g) * scale
        opt.zero_grad()
        loss = prepared(x).square().mean()
        loss.backward()
        opt.step()
        monitor.step(loss=loss)


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_clipped_share_is_where_torchs_straight_through_gradient_is_zero(per_channel):
    prepared = _prepared(per_channel)
    monitor = QATMonitor(prepared)
    seen = {}
    hooks = [m.register_forward_hook(lambda m, a, o, n=n: seen.__setitem__(n, a[0].detach()))
             for n, m in monitor.modules.items()]  # fmt: skip
    prepared(torch.randn(4, 8, generator=torch.Generator().manual_seed(2)) * 3)
    monitor.step()
    for hook in hooks:
        hook.remove()
    for record in monitor.records:
        module, x = monitor.modules[record.name], seen[record.name].clone().requires_grad_()
        if module.scale.numel() > 1:
            out = torch.fake_quantize_per_channel_affine(
                x, module.scale, module.zero_point, module.ch_axis, module.quant_min,
                module.quant_max,
            )  # fmt: skip
        else:
            out = torch.fake_quantize_per_tensor_affine(
                x, module.scale, module.zero_point, module.quant_min, module.quant_max
            )
        out.sum().backward()
        assert record.clipped == pytest.approx(1 - float(x.grad.mean()), abs=1e-9), record.name
        assert record.per_channel == (module.scale.numel() > 1)


def _ste_kept(module, x) -> torch.Tensor:
    """How many elements of ``x`` torch's fake quantization lets a gradient through, with the
    module's current qparams."""
    x = x.clone().requires_grad_()
    if module.scale.numel() > 1:
        out = torch.fake_quantize_per_channel_affine(
            x, module.scale, module.zero_point, module.ch_axis, module.quant_min, module.quant_max
        )
    else:
        out = torch.fake_quantize_per_tensor_affine(
            x, module.scale, module.zero_point, module.quant_min, module.quant_max
        )
    out.sum().backward()
    return x.grad.sum()


@pytest.mark.parametrize("per_channel", [False, True])
def test_two_forwards_before_a_step_are_each_tallied_with_the_qparams_they_used(per_channel):
    """Gradient accumulation: the observers move between the two forwards; each tensor counts
    with its own scale (the monitor tallies the first before the second changes it)."""
    prepared = _prepared(per_channel)
    monitor = QATMonitor(prepared)
    g = torch.Generator().manual_seed(3)
    kept = dict.fromkeys(monitor.modules, 0.0)
    total = dict.fromkeys(monitor.modules, 0)

    def count(module, args, out, name):
        kept[name] += float(_ste_kept(module, args[0].detach()))
        total[name] += args[0].numel()

    hooks = [m.register_forward_hook(functools.partial(count, name=n))
             for n, m in monitor.modules.items()]  # fmt: skip
    prepared(torch.randn(4, 8, generator=g))
    prepared(torch.randn(4, 8, generator=g) * 4)  # a wider range: the scales change
    monitor.step()
    for hook in hooks:
        hook.remove()
    for record in monitor.records:
        expected = 1 - kept[record.name] / total[record.name]
        assert record.clipped == pytest.approx(expected, abs=1e-9), record.name
    assert any(r.clipped > 0 for r in monitor.records)


def test_frozen_observers_stop_the_changes_and_counts_survive_thinning():
    prepared = _prepared()
    monitor = QATMonitor(prepared, max_records=4)
    _train(prepared, monitor, 6)
    prepared.apply(torchao_pt2e.disable_observer)
    _train(prepared, monitor, 14)
    assert monitor.steps == 20
    for name in monitor.modules:
        kept = [r for r in monitor.records if r.name == name]
        assert len(kept) <= 4  # thinned: memory stays bounded
        assert monitor.changes[name] <= 6  # no change once the observers are frozen
    late = [r for r in monitor.records if r.step > 7]
    assert late and not any(r.changed for r in late)
    moving = [n for n in monitor.modules if monitor.changes[n] > 1]
    assert moving, "the activations' scales move while the observers run"


def test_records_frame_plot_and_close():
    pd = pytest.importorskip("pandas")
    prepared = _prepared()
    with QATMonitor(prepared) as monitor:
        _train(prepared, monitor, 3)
    assert monitor._hooks == []
    prepared(torch.randn(4, 8))  # no hook left: nothing more is tallied
    frame = monitor.df
    assert isinstance(frame, pd.DataFrame) and len(frame) == 3 * len(monitor.modules)
    assert frame["loss"].notna().all() and set(frame["step"]) == {1, 2, 3}
    fig = monitor.plot()
    # weight and activation trajectories with their legends, clipped heat map, its colour bar,
    # change counts
    assert len(fig.axes) == 7
    assert fig._repr_png_().startswith(b"\x89PNG")  # `fig` alone shows it in a notebook
    assert "3 steps" in repr(monitor)


def test_a_ptq_model_is_refused_with_the_fix():
    import qviz
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    gm = qviz.export(nn.Linear(4, 2), (torch.randn(1, 4),))
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config()))  # fmt: skip
    with pytest.raises(ConfigError, match=r"no fake-quantize module.*prepare_qat_pt2e"):
        QATMonitor(prepared)
    with pytest.raises(ConfigError, match="max_records"):
        QATMonitor(_prepared(), max_records=1)
    with pytest.raises(ConfigError, match="no steps yet"):
        QATMonitor(_prepared()).plot()


def test_callbacks_get_each_steps_records_until_removed():
    prepared = _prepared()
    monitor = QATMonitor(prepared)
    seen = []

    def watch(m, records):
        seen.append((m.steps, records))

    assert monitor.add_callback(watch) is watch
    monitor.add_callback(watch)  # twice: still called once per step
    _train(prepared, monitor, 3)
    monitor.remove_callback(watch)
    monitor.remove_callback(watch)  # never added (any more): ignored
    _train(prepared, monitor, 1)
    assert [step for step, _ in seen] == [1, 2, 3]
    for step, records in seen:
        assert [r.name for r in records] == list(monitor.modules)
        kept = [r for r in monitor.records if r.step == step]
        assert sorted(records, key=lambda r: r.name) == sorted(kept, key=lambda r: r.name)
    with pytest.raises(ConfigError, match=r"add_callback needs a function fn\(monitor, records\)"):
        monitor.add_callback("not callable")


def test_a_sampled_tally_estimates_the_full_one():
    prepared = _prepared()
    full, sampled = QATMonitor(prepared, sample=None), QATMonitor(prepared, sample=8)
    prepared(torch.randn(4, 8, generator=torch.Generator().manual_seed(3)) * 4)
    full.step()
    sampled.step()
    for a, b in zip(full.records, sampled.records, strict=True):
        assert a.name == b.name and a.scale == b.scale
        assert abs(a.clipped - b.clipped) <= 0.35 and b.mean_abs_over_scale > 0
    with pytest.raises(ConfigError, match="sample must be a positive int"):
        QATMonitor(prepared, sample=0)


def test_a_model_prepared_by_qviz_is_labelled_with_its_plan_groups():
    import qviz
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 6 * 6, 3)).train()  # fmt: skip
    gm = qviz.export(model, (torch.randn(4, 1, 8, 8),))
    config = get_symmetric_quantization_config(is_per_channel=True, is_qat=True)
    prepared = qviz.prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(config))
    monitor = QATMonitor(prepared)
    opt = torch.optim.SGD(prepared.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        loss = prepared(torch.randn(4, 1, 8, 8)).square().mean()
        loss.backward()
        opt.step()
        monitor.step(loss=loss)
    groups = {g.observer: g.group for g in prepared.plan.groups}
    assert {r.name for r in monitor.records} == set(groups)  # every fake-quantize module
    assert all(r.group == groups[r.name] for r in monitor.records)
    assert any(r.per_channel for r in monitor.records)  # the conv's weight, BatchNorm-scaled


def test_stats_every_tallies_every_nth_step_and_reads_scales_every_step():
    import math

    prepared = _prepared()
    monitor = QATMonitor(prepared, stats_every=3)
    _train(prepared, monitor, 7)
    tallied = {r.step for r in monitor.records if not math.isnan(r.clipped)}
    assert tallied == {1, 4, 7}  # the forwards before steps 1, 4 and 7
    assert {r.step for r in monitor.records} == set(range(1, 8))  # scales: every step
    with pytest.raises(ConfigError, match="stats_every must be a positive int"):
        QATMonitor(prepared, stats_every=0)


def test_a_model_that_is_not_a_module_and_a_loss_that_is_not_a_number_are_named():
    """Issue 25: ``QATMonitor("model")`` raised AttributeError and ``step(loss="abc")``
    ValueError; each is a ConfigError naming the argument, what it got, and the fix."""
    with pytest.raises(ConfigError, match=r"model.*got str 'model'.*prepare_qat_pt2e"):
        QATMonitor("model")
    prepared = _prepared()
    monitor = QATMonitor(prepared)
    for name, bad in (("loss", "abc"), ("metric", [1, 2]), ("loss", torch.ones(3))):
        with pytest.raises(ConfigError, match=rf"{name} must be a number.*got"):
            monitor.step(**{name: bad})
    assert monitor.steps == 0 and monitor.records == []  # a refused step records nothing
    monitor.step(loss=torch.tensor(0.5), metric=1)
    assert monitor.steps == 1
