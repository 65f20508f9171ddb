"""Time the PT2E flow of qviz and of the reference (torchao) side by side.

Run from the repository root (a few minutes)::

    .venv/bin/python benchmarks/pt2e_flow.py [resnet18 mobilenet_v2 resnet50]

For each torchvision model (random weights, fixed seed; timing does not depend on them), batch 8
of 3x224x224, 10 calibration batches, 2 threads, the same quantizer configuration for both
(XNNPACK-style, per-channel symmetric int8 weights, HistogramObserver activations): the time of
export, prepare, calibrate and convert, and calibration time divided by plain float forward of the
eager model over the same batches (the cost of observing). Targets: qviz calibration <= 1.15x
float forward, prepare + convert no slower than the reference.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable

import torch
import torchvision
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e as ref_convert
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e as ref_prepare
from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer as RefQuantizer
from torchao.testing.pt2e._xnnpack_quantizer import (
    get_symmetric_quantization_config as ref_config,
)

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

BATCH, N_BATCHES = 8, 10


def seconds(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def forward_all(model: torch.nn.Module, batches: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for b in batches:
            model(b)


def run(name: str) -> list[tuple[str, str, float, float]]:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(BATCH, 3, 224, 224, generator=g) for _ in range(N_BATCHES)]
    t_export, gm = seconds(lambda: qviz.export(model, (batches[0],)))
    forward_all(model, batches[:2])  # warm-up: first calls pack weights and allocate
    t_float, _ = seconds(lambda: forward_all(model, batches))

    ref_q = RefQuantizer().set_global(ref_config(is_per_channel=True))
    t_rp, ref = seconds(lambda: ref_prepare(copy.deepcopy(gm), ref_q))
    t_rc, _ = seconds(lambda: forward_all(ref, batches))
    t_rv, _ = seconds(lambda: ref_convert(ref))

    ours_q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    t_qp, ours = seconds(lambda: qviz.prepare_pt2e(gm, ours_q))
    t_qc, _ = seconds(lambda: qviz.calibrate(ours, batches, progress=False))
    t_qv, _ = seconds(lambda: qviz.convert_pt2e(ours))
    return [
        (name, "export", t_export, t_export),
        (name, "float forward (10 batches)", t_float, t_float),
        (name, "prepare", t_qp, t_rp),
        (name, "calibrate", t_qc, t_rc),
        (name, "convert", t_qv, t_rv),
        (name, "prepare + convert", t_qp + t_qv, t_rp + t_rv),
        (name, "calibrate / float forward", t_qc / t_float, t_rc / t_float),
    ]


def main(names: list[str]) -> None:
    torch.set_num_threads(2)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {BATCH}, "
        f"{N_BATCHES} calibration batches"
    )
    print(f"{'model':<14}{'measurement':<28}{'qviz':>10}{'reference':>12}")
    for name in names:
        for model, what, ours, ref in run(name):
            unit = "x" if "/" in what else "s"
            print(f"{model:<14}{what:<28}{ours:>9.2f}{unit}{ref:>11.2f}{unit}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["resnet18", "mobilenet_v2", "resnet50"])
