"""Time the PT2E flow of qviz and of the reference (torchao) side by side.

Run from the repository root (a few minutes)::

    .venv/bin/python benchmarks/pt2e_flow.py [resnet18 mobilenet_v2 resnet50]

For each torchvision model (random weights, fixed seed; timing does not depend on them), batch 8
of 3x224x224, 10 calibration batches, 2 threads, the same quantizer configuration for both
(XNNPACK-style, per-channel symmetric int8 weights, HistogramObserver activations): the time of
export, prepare, calibrate and convert, and calibration time divided by plain float forward of the
eager model over the same batches (the cost of observing). Targets: qviz calibration <= 1.15x
float forward, prepare + convert no slower than the reference.

The machine is shared and noisy, so the float forward and both calibrations run ``REPEATS``
times in turn (float, qviz, reference, float, ...), each ratio is taken against the float
forward of its own round, and the medians are printed. ``QVIZ_BENCH_REPEATS`` sets it (3).
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable
from statistics import median

import torch
import torchvision
from _machine import set_threads, timed
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e as ref_convert
from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e as ref_prepare
from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer as RefQuantizer
from torchao.testing.pt2e._xnnpack_quantizer import (
    get_symmetric_quantization_config as ref_config,
)

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

BATCH, N_BATCHES = 8, 10
REPEATS = int(os.environ.get("QVIZ_BENCH_REPEATS", "3"))


def forward_all(model: torch.nn.Module, batches: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for b in batches:
            model(b)


def _timed(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    return timed(lambda: fn(*args, **kwargs))[1]


def _rounds(model, batches, prepare_ref, prepare_ours) -> dict[str, list[float]]:
    """Float forward, qviz calibration and reference calibration, in turn, REPEATS times."""
    out: dict[str, list[float]] = {"float": [], "ours": [], "ref": []}
    for _ in range(REPEATS):
        out["float"].append(_timed(forward_all, model, batches))
        out["ours"].append(_timed(qviz.calibrate, prepare_ours(), batches, progress=False))
        out["ref"].append(_timed(forward_all, prepare_ref(), batches))
    return out


def run(name: str) -> list[tuple[str, str, float, float]]:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(BATCH, 3, 224, 224, generator=g) for _ in range(N_BATCHES)]
    gm, t_export = timed(lambda: qviz.export(model, (batches[0],)))
    forward_all(model, batches[:2])  # warm-up: first calls pack weights and allocate

    ref_q = RefQuantizer().set_global(ref_config(is_per_channel=True))
    ref, t_rp = timed(lambda: ref_prepare(copy.deepcopy(gm), ref_q))
    forward_all(ref, batches)
    _, t_rv = timed(lambda: ref_convert(ref))

    ours_q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    ours, t_qp = timed(lambda: qviz.prepare_pt2e(gm, ours_q))
    qviz.calibrate(ours, batches, progress=False)
    _, t_qv = timed(lambda: qviz.convert_pt2e(ours))

    rounds = _rounds(
        model,
        batches,
        lambda: ref_prepare(copy.deepcopy(gm), ref_q),
        lambda: qviz.prepare_pt2e(gm, ours_q),
    )
    t_float, t_qc, t_rc = (median(rounds[k]) for k in ("float", "ours", "ref"))
    ratio_q = median(o / f for o, f in zip(rounds["ours"], rounds["float"], strict=True))
    ratio_r = median(r / f for r, f in zip(rounds["ref"], rounds["float"], strict=True))
    return [
        (name, "export", t_export, t_export),
        (name, "float forward (10 batches)", t_float, t_float),
        (name, "prepare", t_qp, t_rp),
        (name, "calibrate", t_qc, t_rc),
        (name, "convert", t_qv, t_rv),
        (name, "prepare + convert", t_qp + t_qv, t_rp + t_rv),
        (name, "calibrate / float forward", ratio_q, ratio_r),
    ]


def main(names: list[str]) -> None:
    set_threads(2)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {BATCH}, "
        f"{N_BATCHES} calibration batches, median of {REPEATS} alternating rounds"
    )
    print(f"{'model':<14}{'measurement':<28}{'qviz':>10}{'reference':>12}")
    for name in names:
        for model, what, ours, ref in run(name):
            unit = "x" if "/" in what else "s"
            print(f"{model:<14}{what:<28}{ours:>9.2f}{unit}{ref:>11.2f}{unit}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["resnet18", "mobilenet_v2", "resnet50"])
