"""Time PT2E quantization-aware training of qviz and of the reference (torchao) side by side.

Run from the repository root (a few minutes)::

    .venv/bin/python benchmarks/qat_flow.py [digits resnet18 mobilenet_v2]

For each model (the embedded digits model, batch 64 of 1x8x8; torchvision models with random
weights, batch 4 of 3x64x64), exported once in train mode, the same quantizer configuration for
both (XNNPACK-style, per-channel symmetric int8 weights, QAT): ``prepare_qat_pt2e``, a training
step (SGD with momentum, cross-entropy; median of ``STEPS``) and ``convert_pt2e`` after those
steps. qviz and the reference run in turn ``REPEATS`` times (``QVIZ_BENCH_REPEATS``, default 3),
2 threads; medians are printed with the ratio qviz / reference, and whether the two converted
models, in eval mode, give bit-identical outputs on a batch (they should: the same weights,
batches, steps and dropout masks).
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from statistics import median

import torch
import torchvision
from _machine import Stopwatch, set_threads, timed
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e as ref_convert
from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e as ref_prepare_qat
from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer as RefQuantizer
from torchao.testing.pt2e._xnnpack_quantizer import (
    get_symmetric_quantization_config as ref_config,
)

import qviz
from qviz.data import digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

STEPS = 5
REPEATS = int(os.environ.get("QVIZ_BENCH_REPEATS", "3"))


def _model_and_batches(name: str) -> tuple[torch.nn.Module, list[torch.Tensor], int]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if name == "digits":
        batches = [torch.randn(64, 1, 8, 8, generator=g) for _ in range(STEPS + 1)]
        return digits_model(), batches, 10
    model = getattr(torchvision.models, name)(weights=None, num_classes=10)
    return model, [torch.randn(4, 3, 64, 64, generator=g) for _ in range(STEPS + 1)], 10


def _train(model: torch.nn.Module, batches: list[torch.Tensor], classes: int) -> list[float]:
    """One SGD step per batch but the last; the time of each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)  # dropout (mobilenet_v2's classifier) draws the same masks for both
    times = []
    for x in batches[:-1]:
        target = torch.randint(0, classes, (x.shape[0],), generator=g)
        with Stopwatch() as watch:
            loss = torch.nn.functional.cross_entropy(model(x), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        times.append(watch.seconds)
    return times


def _flow(gm, prepare, convert, quantizer, batches, classes) -> tuple[float, float, float, object]:
    prepared, t_prepare = timed(lambda: prepare(copy.deepcopy(gm), quantizer))
    t_step = median(_train(prepared, batches, classes))
    converted, t_convert = timed(lambda: convert(prepared))
    qviz.move_exported_model_to_eval(converted)  # dropout off: the comparison is deterministic
    return t_prepare, t_step, t_convert, converted


def run(name: str) -> list[tuple[str, str, float, float]]:
    model, batches, n = _model_and_batches(name)
    gm = qviz.export(model.train(), (batches[0],))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference's "XNNPACKQuantizer is deprecated"
        ref_q = RefQuantizer().set_global(ref_config(is_per_channel=True, is_qat=True))
    ours_q = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_qat=True)
    )
    rows: dict[str, list[tuple[float, float, float]]] = {"ours": [], "ref": []}
    same = True
    for _ in range(REPEATS):
        *ours_t, ours = _flow(gm, qviz.prepare_qat_pt2e, qviz.convert_pt2e, ours_q, batches, n)
        *ref_t, ref = _flow(gm, ref_prepare_qat, ref_convert, ref_q, batches, n)
        rows["ours"].append(tuple(ours_t))
        rows["ref"].append(tuple(ref_t))
        with torch.no_grad():
            same = same and torch.equal(ours(batches[-1]), ref(batches[-1]))
    what = ("prepare_qat_pt2e", "training step", "convert_pt2e")
    out = [
        (name, w, median(r[i] for r in rows["ours"]), median(r[i] for r in rows["ref"]))
        for i, w in enumerate(what)
    ]
    print(f"{name}: converted outputs bit-identical to the reference: {same}")
    return out


def main(names: list[str]) -> None:
    set_threads(2)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {REPEATS} "
        f"alternating rounds, {STEPS} training steps each"
    )
    results = [row for name in names for row in run(name)]
    print(f"{'model':<14}{'measurement':<20}{'qviz':>10}{'reference':>12}{'ratio':>8}")
    for model, what, ours, ref in results:
        print(f"{model:<14}{what:<20}{ours:>9.3f}s{ref:>11.3f}s{ours / ref:>7.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:] or ["digits", "resnet18", "mobilenet_v2"])
