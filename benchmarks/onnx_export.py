"""Time ``qviz.export_onnx`` and onnxruntime against the converted torch model it came from.

Run from the repository root (a minute or two)::

    .venv/bin/python benchmarks/onnx_export.py [digits resnet18 mobilenet_v2]

Setup (not timed): the embedded digits model through ``qviz.data.int8.quantize_digits`` (its
360 test images as one batch), and torchvision resnet18 / mobilenet_v2 with random weights
(``torch.manual_seed(0)``), BatchNorm statistics of the calibration data, and the XNNPACK
quantizer (per-channel symmetric int8 weights) calibrated on 2 batches of 8 random 3x224x224
images, then ``convert_pt2e``; batch 8 of 3x224x224 for inference.

Measured, 2 threads everywhere, ``REPEATS`` rounds taken in turn so that other load on the
shared machine slows them alike, medians printed:

* export: ``qviz.export_onnx(converted, ..., dynamic_batch=True)`` (torch.export inside
  torch.onnx, translation, qviz's tidy-up, saving, ``onnx.checker``) vs plain
  ``torch.onnx.export(converted, ..., dynamic_shapes=...)`` with its own optimization, saved
  (which writes a narrow range with the full int8 range and merges identical DequantizeLinear
  nodes: what export_onnx pays for not doing either);
* inference: the converted torch model (the reference q/dq graph in float32) vs an onnxruntime
  CPU session on the file, with no graph optimization (the QDQ graph as written) and with
  onnxruntime's default optimizations (which fuse QuantizeLinear / DequantizeLinear around Conv
  and Gemm into integer kernels);
* and, for reference, the largest output difference in output quantization steps and the
  node counts. ``QVIZ_BENCH_REPEATS`` sets the rounds (5).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path
from statistics import median

import numpy as np
import onnxruntime as ort
import torch
import torchvision
from _machine import set_threads, timed

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

REPEATS = int(os.environ.get("QVIZ_BENCH_REPEATS", "5"))
THREADS = 2


def digits() -> tuple[torch.nn.Module, torch.Tensor]:
    from qviz.data import digits_loaders, digits_model
    from qviz.data.int8 import quantize_digits

    loaders = digits_loaders(batch_size=64)
    converted = quantize_digits(digits_model(), loaders)[2]
    return converted, torch.cat([images for images, _ in loaders.test])


def torchvision_model(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    g = torch.Generator().manual_seed(0)
    calibration = [torch.randn(8, 3, 224, 224, generator=g) for _ in range(2)]
    model.train()  # BatchNorm statistics of the data, so activations keep their scale
    with torch.no_grad():
        for batch in calibration:
            model(batch)
    gm = qviz.export(model.eval(), (calibration[0],), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True)
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    qviz.calibrate(prepared, calibration, progress=False)
    return qviz.convert_pt2e(prepared), torch.randn(8, 3, 224, 224, generator=g)


def session(path: Path, optimize: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    level = ort.GraphOptimizationLevel
    options.graph_optimization_level = level.ORT_ENABLE_ALL if optimize else level.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def output_step(converted: torch.nn.Module) -> float:
    out = next(n for n in converted.graph.nodes if n.op == "output").args[0][0]
    return float(out.args[1])


def run(name: str, folder: Path) -> list[tuple[str, str, float, float]]:
    converted, x = digits() if name == "digits" else torchvision_model(name)
    path = folder / f"{name}.onnx"
    example = (x[:2],)
    export = lambda: qviz.export_onnx(converted, example, path, dynamic_batch=True)  # noqa: E731
    shapes = ({0: torch.export.Dim("batch", min=1, max=2**20)},)
    plain = lambda: torch.onnx.export(  # noqa: E731
        converted, example, folder / "plain.onnx", dynamo=True, dynamic_shapes=shapes, verbose=False
    )
    result = export()  # warm-up
    sessions = {opt: session(path, opt) for opt in (False, True)}
    feed = {sessions[False].get_inputs()[0].name: x.numpy()}
    with torch.no_grad():
        expected = converted(x).numpy()  # and a warm-up
    for opt in (False, True):
        sessions[opt].run(None, feed)
    keys = ("export", "torch.onnx", "torch", "plain", "optimized")
    rounds: dict[str, list[float]] = {k: [] for k in keys}
    for _ in range(REPEATS):
        rounds["export"].append(timed(export)[1])
        rounds["torch.onnx"].append(timed(plain)[1])
        with torch.no_grad():
            rounds["torch"].append(timed(lambda: converted(x))[1])
        rounds["plain"].append(timed(lambda: sessions[False].run(None, feed))[1])
        rounds["optimized"].append(timed(lambda: sessions[True].run(None, feed))[1])
    t = {k: median(v) for k, v in rounds.items()}
    steps = [
        float(np.abs(sessions[opt].run(None, feed)[0] - expected).max()) / output_step(converted)
        for opt in (False, True)
    ]
    counts = f"{result.quantize_linear} Q / {result.dequantize_linear} DQ"
    return [
        (name, f"export ({counts}): qviz / torch.onnx", t["export"], t["torch.onnx"]),
        (name, f"run: torch / ort plain ({steps[0]:.0f} steps)", t["torch"], t["plain"]),
        (name, f"run: torch / ort optimized ({steps[1]:.0f} steps)", t["torch"], t["optimized"]),
    ]


def main(names: list[str]) -> None:
    set_threads(THREADS)
    warnings.filterwarnings("ignore", message=".*training mode.*")  # converted graphs have no eval
    print(
        f"torch {torch.__version__}, onnxruntime {ort.__version__}, {THREADS} threads, "
        f"median of {REPEATS} alternating rounds; steps: largest |onnxruntime - torch| output "
        f"difference in output quantization steps"
    )
    print(
        f"{'model':<14}{'measurement: first / second':<46}{'first':>10}{'second':>10}{'ratio':>9}"
    )
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            for model, what, first, second in run(name, Path(folder)):
                ratio = first / second
                print(f"{model:<14}{what:<46}{first:>9.4f}s{second:>9.4f}s{ratio:>8.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:] or ["digits", "resnet18", "mobilenet_v2"])
