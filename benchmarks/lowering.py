"""Speed and size of the int8 model on real kernels, beside float eager and float compiled.

Run from the repository root (a few minutes)::

    .venv/bin/python benchmarks/lowering.py [digits resnet18 mobilenet_v2]

For each model (the embedded digits model; torchvision's with random weights, 3x224x224): float
eager, float ``torch.compile``, and the converted model (XNNPACK quantizer, per-channel
weights) lowered with ``qviz.lower`` to ExecuTorch XNNPACK and to onnxruntime: median latency
at batch 1 and 8 (2 threads), artifact size, lowering time, how many operators run on integer
and on float kernels, and the largest difference from the reference model in output steps.
The CPU flags that matter for int8 (AVX-512 VNNI, AMX) are printed first: other machines lack
them and give other figures.
"""

from __future__ import annotations

import io
import sys
import time

import torch
import torchvision

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

BATCHES = (1, 8)


def _cpu_flags() -> str:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown"
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")
    return " ".join(f for f in wanted if f" {f}" in flags) or "none of " + " ".join(wanted)


def _model(name: str) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    if name == "digits":
        return digits_model(), [x for x, _ in digits_loaders(batch_size=8).calibration][:8]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    return model, [torch.randn(8, 3, 224, 224, generator=g) for _ in range(4)]


def _median_seconds(fn, x: torch.Tensor, repeats: int = 10) -> float:
    for _ in range(2):
        fn(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _state_bytes(model: torch.nn.Module) -> int:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell()


def run(name: str) -> None:
    model, batches = _model(name)
    model.eval()
    gm = qviz.export(model, (batches[0],), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True)
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    qviz.calibrate(prepared, batches, progress=False)
    converted = qviz.convert_pt2e(prepared)
    step = float(converted.plan.groups[-1].qparams.scale)
    compiled = torch.compile(model)
    rows = []
    with torch.no_grad():
        for b in BATCHES:
            x = batches[0][torch.arange(b) % batches[0].shape[0]]
            eager = _median_seconds(model, x)
            comp = _median_seconds(compiled, x)
            rows.append(("float eager", b, eager, _state_bytes(model), None, None, None))
            rows.append(("float compiled", b, comp, _state_bytes(model), None, None, None))
    for backend in ("xnnpack", "onnxruntime"):
        lowered = qviz.lower(converted, (batches[0],), backend=backend)
        x = batches[-1]
        steps = float((lowered(x) - converted(x)).abs().max()) / step
        counts = lowered.kernel_counts()
        kernels = f"{counts.get('integer', 0)} int / {counts.get('float', 0)} float"
        for b in BATCHES:
            rows.append(
                (backend, b, lowered.latency(b, repeats=10), lowered.size_bytes,
                 lowered.lowering_seconds, kernels, steps)
            )  # fmt: skip
    print(f"\n{name}")
    print(f"{'':16s} {'batch':>5s} {'ms':>9s} {'KiB':>9s} {'lower s':>8s} {'kernels':>18s} steps")
    for label, b, seconds, size, lowering, kernels, steps in rows:
        low = f"{lowering:8.1f}" if lowering is not None else f"{'':8s}"
        print(
            f"{label:16s} {b:5d} {seconds * 1e3:9.2f} {size / 1024:9.1f} {low} "
            f"{kernels or '':>18s} {'' if steps is None else f'{steps:.0f}'}"
        )


def main() -> None:
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}; CPU flags: {_cpu_flags()}; 2 threads")
    for name in sys.argv[1:] or ["digits", "resnet18", "mobilenet_v2"]:
        run(name)


if __name__ == "__main__":
    main()
