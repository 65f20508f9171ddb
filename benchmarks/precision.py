"""``qviz.numeric.search_precision`` beside AIMET's automatic mixed precision (AMP): the same
models, candidates, data and target; the assignment each finds, its cost, its measured figure,
how many evaluations each spent and its wall time.

Run from the repository root (about 15 minutes on 2 cores)::

    .venv/bin/python benchmarks/precision.py [digits[:drop] resnet18 mobilenet_v2 encoder]

Models and targets:

* the embedded digits model: test accuracy (360 images), at most 0.5 points below float
  (``digits``, one image is 0.28 points) or 1 point (``digits:0.01``); candidates W4A8, W8A8,
  W8A16, float (AIMET: float16);
* torchvision resnet18 and mobilenet_v2 with random weights and BatchNorm statistics from
  train-mode passes, 3x64x64 (4 batches of 8 calibrate, 2 score), and a 2-layer transformer
  encoder (d_model 64, 16 tokens): output SQNR against the float model of at least
  ``TARGET_DB``; candidates W4A8 and W8A8 (with AIMET's float16
  candidate each of its recalibrations takes minutes on these models, in AIMET's
  ``_decompose_prequantized_tensor``).

Both start from per-channel int8 weights. The cost column is bit operations per sample by
qviz's count (MACs x weight bits x activation bits) for both answers, AIMET's float16 costed
at 16 x 16 bits (qviz's float at 32 x 32): AMP is not charged for fp32 it does not have.
"Screen" counts the evaluations that score one layer at a time (qviz's screening, AMP's
phase 1; both on the same data), "full" the evaluations of whole assignments (qviz's
confirmation, AMP's baseline scores and phase 2). Each figure is measured by the tool's own
simulation: qviz's converted model, AIMET's QuantizationSimModel.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from typing import Any

import torch
from _machine import Stopwatch, cpu, set_threads
from precision_amp import amp_search
from repair import _vision_model
from sensitivity import _encoder

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.quantizers.fallback import module_path
from qviz.numeric import search_precision, sqnr
from qviz.numeric.precision.cost import layer_counts

TARGET_DB = {"resnet18": 25.0, "mobilenet_v2": 25.0, "encoder": 30.0}
_NAMES = {(4, 8): "w4a8", (8, 8): "w8a8", (8, 16): "w8a16", (None, None): "float"}


def _vision(name: str) -> tuple[Any, list, list, None]:
    """``repair._vision_model``'s random-weight model (BatchNorm statistics from train-mode
    passes: without them mobilenet_v2's activations vanish) at 3x64x64."""
    model = _vision_model(name, 64)
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)]
    test = [torch.randn(8, 3, 64, 64, generator=g) for _ in range(2)]
    return qviz.export(model, (calib[0],), dynamic_batch=True), calib, test, None


def _case(name: str) -> dict[str, Any]:
    """The model, its data, the float module AIMET starts from, both scores and the target."""
    if name.startswith("digits"):
        drop = float(name.partition(":")[2] or 0.005)
        loaders = digits_loaders(batch_size=64)
        calib, test = [x for x, _ in loaders.calibration], list(loaders.test)
        images = sum(len(y) for _, y in test)
        model = digits_model().eval()
        gm = qviz.export(model, (calib[0],), dynamic_batch=True)

        def accuracy(float_out, quant_out, target):
            return float((quant_out.argmax(1) == target).float().mean())

        def amp_score(m):
            return sum(int((m(x).argmax(1) == y).sum()) for x, y in test) / images

        return dict(gm=gm, model=model, calib=calib, test=test, metric=accuracy,
                    amp_score=amp_score, target={"max_drop": drop}, amp_drop=drop,
                    candidates=[(4, 8), (8, 8), (8, 16), (None, None)])  # fmt: skip
    gm, calib, test, _ = _encoder() if name == "encoder" else _vision(name)
    model = _float_module(name)
    with torch.no_grad():
        reference = [model(x) for x in test]

    def amp_score(m):
        return sqnr(torch.cat(reference), torch.cat([m(x) for x in test]))

    return dict(gm=gm, model=model, calib=calib, test=test, metric=None, amp_score=amp_score,
                target={"min_sqnr": TARGET_DB[name]}, amp_target=TARGET_DB[name],
                candidates=[(4, 8), (8, 8)])  # fmt: skip


def _float_module(name: str) -> torch.nn.Module:
    """The same float module the exported graph was made from (same seeds)."""
    if name != "encoder":
        return _vision_model(name, 64)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()


def _qviz(case: dict[str, Any]) -> dict[str, Any]:
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    with Stopwatch() as watch:
        result = search_precision(case["gm"], quantizer, case["test"], metric=case["metric"],
                                  candidates=[_NAMES[c] for c in case["candidates"]],
                                  cost="bops", calibration_data=case["calib"], progress=False,
                                  **case["target"])  # fmt: skip
    seconds = watch.seconds
    full = [e for e in result.evaluations if e.point is not None]
    chosen = [e for e in full if e.point == result.chosen]
    return {
        "mix": Counter(result.assignment().values()) if result.met else Counter(),
        "cost": result.front[result.chosen].cost if result.met else float("nan"),
        "figure": result.figure_of(chosen[-1]) if chosen else float("nan"),
        "screen": len(result.screened) - len(result.units) + 1 if result.screened else 0,
        "full": len(full),
        "seconds": seconds,
        "met": result.met,
    }


def _amp(case: dict[str, Any]) -> dict[str, Any]:
    target = {"target": case["amp_target"]} if "amp_target" in case else {}
    outcome = amp_search(case["model"], case["calib"][0], case["calib"], case["amp_score"],
                         case["candidates"], case.get("amp_drop"), per_channel=True,
                         **target)  # fmt: skip
    layers = {module_path(n): n.name for n in case["gm"].graph.nodes if n.op == "call_function"}
    cost, unmapped = 0.0, []
    for module, (w, a) in outcome.assignment.items():
        node = layers.get(module)
        if node is None:
            unmapped.append(module)
            continue
        macs = layer_counts(case["gm"], node)[1]
        cost += macs * (w or 16) * (a or 16) / 1e9
    mix = Counter(_NAMES.get((w, a), f"w{w}a{a}").replace("float", "fp16")
                  for w, a in outcome.assignment.values())  # fmt: skip
    return {
        "mix": mix,
        "cost": cost,
        "figure": outcome.metric,
        "screen": outcome.phase1_evaluations,
        "full": outcome.phase2_evaluations,
        "seconds": outcome.seconds,
        "unmapped": unmapped,
    }


def _line(tool: str, row: dict[str, Any]) -> str:
    mix = ", ".join(f"{n} {p}" for p, n in sorted(row["mix"].items()))
    return (f"  {tool:<6}{row['cost']:>10.4f}{row['figure']:>10.4g}{row['screen']:>8}"
            f"{row['full']:>6}{row['seconds']:>9.1f}  {mix}")  # fmt: skip


#: qviz's search should take at most this share of AMP's time on the same work (issue 40).
TIME_TARGET = 0.5


def main(argv: list[str]) -> None:
    names = argv or ["digits", "digits:0.01", "resnet18", "mobilenet_v2", "encoder"]
    set_threads(2)
    warnings.simplefilter("ignore")
    print(f"CPU: {cpu()}; torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(f"  {'tool':<6}{'GBOP':>10}{'figure':>10}{'screen':>8}{'full':>6}{'time s':>9}  mix")
    for name in names:
        case = _case(name)
        target = case["target"]
        print(f"{name}: target {target}, candidates {[_NAMES[c] for c in case['candidates']]}")
        ours = _qviz(case)
        print(_line("qviz", ours))
        amp = _amp(case)
        print(_line("AMP", amp) + (f"  (not costed: {amp['unmapped']})" if amp["unmapped"] else ""))
        ratio = ours["seconds"] / amp["seconds"]
        verdict = "met" if ratio <= TIME_TARGET else "missed"
        print(f"  time qviz / AMP: {ratio:.2f}x (target <= {TIME_TARGET}x: {verdict})")


if __name__ == "__main__":
    main(sys.argv[1:])
