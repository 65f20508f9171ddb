"""What a live QATDashboard costs a QAT training loop on the digits model.

Run from the repository root (a minute or two)::

    .venv/bin/python benchmarks/qat_dashboard.py [steps]

The trained digits model, exported in train mode and prepared for QAT with torchao's
``prepare_qat_pt2e`` and XNNPACKQuantizer QAT config, trains ``steps`` SGD steps (batch 64,
2 threads) with a QATMonitor; then the same again with a QATDashboard attached. Printed: the
median time of a training step (monitor included), the time of one dashboard redraw (with and
without its figure, forced), how many redraws the throttle allowed and the share of the loop's
wall time they took.
"""

from __future__ import annotations

import sys
from statistics import median

import torch
from _machine import Stopwatch, set_threads, timed
from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e
from torchao.testing.pt2e._xnnpack_quantizer import (
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)

from qviz.data import digits_loaders, digits_model
from qviz.numeric import QATMonitor
from qviz.widgets import QATDashboard


def _prepared():
    torch.manual_seed(0)
    model = digits_model().train()
    images, _ = next(iter(digits_loaders(batch_size=64).train))
    gm = torch.export.export(model, (images,)).module()
    config = get_symmetric_quantization_config(is_qat=True)
    return prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(config))


def _train(model, monitor, steps: int) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    full = [b for b in digits_loaders(batch_size=64).train if len(b[0]) == 64]  # static shape
    times = []
    for i in range(steps):
        images, labels = full[i % len(full)]
        with Stopwatch() as watch:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            monitor.step(loss=loss)
        times.append(watch.seconds)
    return times


def main(steps: int = 100) -> None:
    set_threads(2)
    model = _prepared()
    monitor = QATMonitor(model)
    plain = _train(model, monitor, steps)
    dash = QATDashboard(monitor, every=10, min_interval_s=0.5)
    forced = [dash.refresh().last_render_s for _ in range(5)]
    dash.figure = False
    text_only = [dash.refresh().last_render_s for _ in range(5)]
    dash.figure = True
    before = dash.renders
    live, wall = timed(lambda: _train(model, monitor, steps))
    renders = dash.renders - before
    print(f"{len(monitor.modules)} fake-quantize modules, {steps} steps per loop")
    print(f"training step (monitor included), median: {median(plain) * 1e3:.1f} ms")
    print(f"one redraw with the figure, median of 5: {median(forced) * 1e3:.0f} ms "
          f"= {median(forced) / median(plain):.1f} steps")  # fmt: skip
    print(f"one redraw without the figure, median of 5: {median(text_only) * 1e3:.1f} ms")
    spent = dash.render_s - sum(forced) - sum(text_only)
    print(f"live loop (every=10, min_interval_s=0.5): {renders} redraws in {steps} steps, "
          f"{wall:.2f} s wall, step median {median(live) * 1e3:.1f} ms; redraws took "
          f"{spent:.2f} s = {spent / wall:.1%} of the loop")  # fmt: skip


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
