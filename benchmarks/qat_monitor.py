"""What QATMonitor costs a QAT training step on the digits model.

Run from the repository root (about a minute)::

    .venv/bin/python benchmarks/qat_monitor.py

The embedded digits model exported in train mode, prepared for QAT with the XNNPACK quantizer
(per-channel int8 weights), one epoch of its training loader (batch 64, SGD) per round; rounds
with and without a QATMonitor (``monitor.step(loss=...)`` after every optimizer step, its
forward hooks tallying the fake-quantized tensors on every step, or on every 4th with
``stats_every=4``) alternate ``REPEATS`` times (``QVIZ_BENCH_REPEATS``, default 9), 2 threads.
Printed: the median time per training step of each and the monitor's overhead as a share of
the step (the median over rounds of each round's ratio to the plain run beside it).
"""

from __future__ import annotations

import copy
import os
import warnings
from statistics import median

import torch
from _machine import Stopwatch, set_threads

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.numeric import QATMonitor

REPEATS = int(os.environ.get("QVIZ_BENCH_REPEATS", "9"))


def _prepared():
    torch.manual_seed(0)
    loaders = digits_loaders(64)
    example = next(iter(loaders.train))[0]
    gm = qviz.export(digits_model().train(), (example,), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True, is_qat=True)
    return qviz.prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(config)), loaders


def _epoch(model, loaders, stats_every: int | None) -> tuple[float, int]:
    """One epoch; ``stats_every`` None: no monitor."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    monitor = QATMonitor(model, stats_every=stats_every) if stats_every else None
    steps = 0
    with Stopwatch() as watch:
        for images, labels in loaders.train:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            if monitor is not None:
                monitor.step(loss=loss)
            steps += 1
    return watch.seconds, steps


def main() -> None:
    threads = set_threads(2)
    warnings.simplefilter("ignore")
    model, loaders = _prepared()
    _epoch(model, loaders, None)  # warm-up
    times: dict[int | None, list[float]] = {None: [], 1: [], 4: []}
    for _ in range(REPEATS):
        for every, runs in times.items():
            seconds, steps = _epoch(model, loaders, every)
            runs.append(seconds / steps)
    plain = median(times[None])
    print(
        f"digits QAT step (batch 64, {steps} steps per round, {REPEATS} rounds, {threads} threads)"
    )
    print(f"  without monitor {plain * 1e3:7.2f} ms")
    for every in (1, 4):
        # the overhead of each round against the plain run of the same round: a shared
        # machine drifts between rounds more than the monitor costs
        shares = [w / p - 1 for w, p in zip(times[every], times[None], strict=True)]
        print(
            f"  QATMonitor(stats_every={every}) {median(times[every]) * 1e3:7.2f} ms   overhead "
            f"{100 * median(shares):+.1f} % of a step (median of the rounds' own ratios)"
        )


if __name__ == "__main__":
    main()
