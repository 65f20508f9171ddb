"""The QATMonitor's names and figure: every fake-quantize module is named by the tensor it
quantizes (from the graph), the figure shows those names in legends and rows, draws each mark
as a line, and no text in it is smaller than 10 px where it is shown."""

from __future__ import annotations

import functools
import re
from typing import ClassVar

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.numeric import QATMonitor
from qviz.numeric.qat.plot import MIN_FONT_PT, qat_figure

_BARE = re.compile(r"^(activation_post_process_)?\d+$")


@functools.cache
def _exported():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(4 * 3 * 3, 3)).train()  # fmt: skip
    return qviz.export(model, (torch.randn(4, 1, 8, 8),))


def _monitored(steps=4, mark_at=None):
    config = get_symmetric_quantization_config(is_per_channel=True, is_qat=True)
    prepared = qviz.prepare_qat_pt2e(_exported(), XNNPACKQuantizer().set_global(config))
    monitor = QATMonitor(prepared)
    opt = torch.optim.SGD(prepared.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        opt.zero_grad()
        prepared(torch.randn(4, 1, 8, 8, generator=g)).square().mean().backward()
        opt.step()
        monitor.step()
        if step == mark_at:
            monitor.mark("observers frozen")
    return monitor


def test_each_module_is_named_by_the_tensor_it_quantizes_from_the_graph():
    monitor = _monitored(steps=1)
    labels = {r.label: r.is_weight for r in monitor.records}
    assert labels == {
        "input input_1": False,
        "conv2d weight": True,  # the conv's weight scaled by its BatchNorm's running std
        "relu output (+2 shared)": False,  # max-pool and flatten share the qparams
        "linear weight": True,
        "linear output": False,
    }
    assert monitor.labels["activation_post_process_0"].tensors == ("input_1 -> conv2d",)
    assert set(monitor.df["label"]) == set(labels)


def test_the_figure_names_every_line_and_row_and_draws_the_marks():
    monitor = _monitored(steps=5, mark_at=3)
    fig = qat_figure(monitor)
    legends = [
        t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()
    ]
    names = {r.label for r in monitor.records}
    assert sorted(legends) == sorted(names)  # one legend entry per line, by name
    heat = next(ax for ax in fig.axes if ax.get_title(loc="left").startswith("clipped"))
    rows = [t.get_text() for t in heat.get_yticklabels()]
    assert rows == [monitor.labels[n].label for n in monitor.modules]
    assert not any(_BARE.match(text) for text in legends + rows)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert "weight scales (2)" in titles and "activation scales (3)" in titles
    marks = [line for line in heat.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_xdata()[0] for line in marks] == [3.5]  # after step 3
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert "observers frozen" in texts


def test_a_mark_after_the_last_step_is_drawn_inside_the_axes():
    monitor = _monitored(steps=3, mark_at=3)
    fig = qat_figure(monitor)
    assert all(ax.get_xlim()[1] >= 4.0 for ax in fig.axes[:2])  # the line at 3.5 is visible


@pytest.mark.parametrize("dpi", [80, 100])  # the dashboard's PNG, a notebook's `fig`
def test_no_text_in_the_figure_is_smaller_than_10_px(dpi):
    from matplotlib.text import Text

    fig = qat_figure(_monitored(steps=3, mark_at=2))
    fig.canvas.draw()  # ticks and colour-bar labels exist once drawn
    ticks = [t for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
    texts = [t for t in fig.findobj(Text) + ticks if t.get_visible() and t.get_text().strip()]
    assert len(texts) >= 40 and any(t.get_text() == "linear weight" for t in ticks)
    sizes = {t.get_text(): t.get_fontsize() * dpi / 72 for t in texts}
    small = {text: px for text, px in sizes.items() if px < 10}
    assert not small, f"texts under 10 px at {dpi} dpi: {small}"
    assert min(t.get_fontsize() for t in texts) >= MIN_FONT_PT


def test_many_modules_keep_a_readable_legend():
    from qviz.numeric.qat.monitor import QATRecord
    from qviz.numeric.qat.plot import LEGEND_LINES

    class Fake:  # a monitor of 30 activations, the ones with a larger index moving more
        modules: ClassVar = {f"m{i}": None for i in range(30)}
        changes: ClassVar = dict.fromkeys(modules, 2)
        steps, events = 2, ()
        records: ClassVar = [QATRecord(step=s, name=f"m{i}", group=None, per_channel=False,
                             scale=1.0 + s * i / 100, scale_min=1.0, scale_max=1.0,
                             zero_point=0.0, changed=True, clipped=0.0,
                             mean_abs_over_scale=1.0, label=f"op{i} output")
                   for s in (1, 2) for i in range(30)]  # fmt: skip

    fig = qat_figure(Fake())
    legends = [
        t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()
    ]
    assert legends == [f"op{i} output" for i in range(20, 30)][:LEGEND_LINES]
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert "activation scales (30), 20 more in grey" in titles
