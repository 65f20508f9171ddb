"""The converted model's exact simulation against the converted model itself and the float
forward: the same outputs bit for bit, and what each forward costs.

Run from the repository root (about a minute)::

    .venv/bin/python benchmarks/simulation.py [--threads 1]

Models: the embedded digits model (a test batch of 64), torchvision resnet18, mobilenet_v2 and
mnasnet0_5 with random weights (a batch of 8 at 3x64x64) and a 2-layer transformer encoder
(d_model 64, 16 tokens, batch 8); XNNPACKQuantizer with per-channel and per-tensor int8 weights.
For each: the median of 7 forwards of the float graph, the converted model and
``qviz.engine.pt2e.simulation.simulated(converted)`` after a warm-up, each ratio to the float
forward, and whether the simulation's outputs equal the converted model's bit for bit (on the
calibration batch and on a batch 1.5x larger than it, so values beyond the calibrated range
clamp). The CPU and its int8 flags are printed first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterator
from typing import Any

import torch
from _machine import cpu, set_threads, timed
from _models import encoder

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.pt2e.simulation import simulated
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config


def _models() -> Iterator[tuple[str, torch.nn.Module, torch.Tensor]]:
    import torchvision

    yield "digits", digits_model().eval(), next(iter(digits_loaders(batch_size=64).test))[0]
    for name in ("resnet18", "mobilenet_v2", "mnasnet0_5"):
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)().eval()
        yield name, model, torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    model, batches = encoder(n_batches=1)
    yield "encoder", model, batches[0]


def _median_ms(model: Any, x: torch.Tensor, runs: int = 7) -> float:
    with torch.no_grad():
        model(x)
        return statistics.median(timed(lambda: model(x))[1] for _ in range(runs)) * 1e3


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    print(f"CPU: {cpu()}; torch {torch.__version__}, {threads} threads\n")
    print(f"{'model':<13}{'weights':<12}{'float ms':>9}{'converted':>11}{'simulated':>11}"
          f"{'conv/float':>11}{'sim/float':>10}  bitwise")  # fmt: skip
    for name, model, x in _models():
        gm = qviz.export(model, (x,))
        for per_channel in (True, False):
            config = get_symmetric_quantization_config(is_per_channel=per_channel)
            prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
            converted = qviz.convert_pt2e(qviz.calibrate(prepared, [x], progress=False))
            fast = simulated(converted)
            with torch.no_grad():
                same = all(torch.equal(_bits(fast(v)), _bits(converted(v))) for v in (x, x * 1.5))
            f, c, s = (_median_ms(m, x) for m in (gm, converted, fast))
            weights = "per channel" if per_channel else "per tensor"
            print(f"{name:<13}{weights:<12}{f:>9.1f}{c:>11.1f}{s:>11.1f}{c / f:>10.2f}x"
                  f"{s / f:>9.2f}x  {same}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
