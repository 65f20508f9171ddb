"""onnxruntime lowerings checked on an emulated AVX2-only CPU: each format's distance from the
reference, beside this machine's.

Run from the repository root on an x86 host with Debian's ``qemu-user`` (``make test``
installs it)::

    .venv/bin/python benchmarks/lowering_emulated.py [digits resnet18 encoder]

Each model (the embedded digits model; resnet18 and the transformer encoder of
``benchmarks/lowering.py``, random weights) is quantized with XNNPACKQuantizer and lowered to
onnxruntime twice, as U8S8 (uint8 activations x int8 weights) and as U8U8 (uint8 weights), with
qviz's choice set aside. Both files run here and under ``qemu-x86_64 -cpu Haswell`` (AVX2 and
FMA, no AVX-512, no VNNI: onnxruntime's own kernels for that class, emulated); the largest
difference from the reference model's output is printed in steps of the output's grid. The
emulated times mean nothing and are not printed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torchvision

import qviz
from qviz.engine.lower import onnxruntime as ort_lowering
from qviz.engine.lower.machine import machine
from qviz.engine.lower.ort_format import OrtFormat

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lowering import Encoder

from tests.helpers.quantize import quantize

_RUN = """
import json, sys
import numpy as np, onnxruntime as ort
out = {}
for pair in sys.argv[1:]:
    inputs, path = pair.split("=")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    out[path] = session.run(None, {session.get_inputs()[0].name: np.load(inputs)})[0].tolist()
print(json.dumps(out))
"""


def _case(name: str) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    if name == "digits":
        from qviz.data import digits_loaders, digits_model

        return digits_model(), [x for x, _ in digits_loaders(batch_size=36).calibration][:2]
    if name == "encoder":
        return Encoder(), [torch.randn(2, 64, 256, generator=g) for _ in range(2)]
    model = getattr(torchvision.models, name)(weights=None)
    return model, [torch.randn(2, 3, 224, 224, generator=g) for _ in range(2)]


def _step(converted: torch.fx.GraphModule, reference: np.ndarray) -> float:
    out = next(n for n in converted.graph.nodes if n.op == "output").args[0]
    producer = out[0] if isinstance(out, (tuple, list)) else out
    if "dequantize" in str(producer.target):
        return float(producer.args[1])
    return float(np.abs(reference).max()) / 127


def main() -> None:
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        sys.exit("needs qemu-x86_64 (Debian's qemu-user) on an x86 host")
    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp(prefix="qviz-emulated-"))
    here, pairs, rows = {}, [], []
    for name in sys.argv[1:] or ["digits", "resnet18", "encoder"]:
        model, batches = _case(name)
        converted = quantize(model, batches).converted  # XNNPACK, per-channel weights
        x = batches[1]
        reference = converted(x).detach().numpy()
        step = _step(converted, reference)
        np.save(folder / f"{name}.npy", x.numpy())
        for fmt in ("U8S8", "U8U8"):
            forced = OrtFormat(fmt, False, True, "set by the benchmark")
            ort_lowering.choose = lambda *a, forced=forced, **k: forced
            path = folder / f"{name}-{fmt}.onnx"
            lowered = qviz.lower(converted, (x,), backend="onnxruntime", path=path)
            here[str(path)] = float(np.abs(lowered(x).numpy() - reference).max()) / step
            pairs.append(f"{folder / f'{name}.npy'}={path}")
            rows.append((name, fmt, str(path), reference, step))
    (folder / "run.py").write_text(_RUN)
    command = [qemu, "-cpu", "Haswell", sys.executable, str(folder / "run.py"), *pairs]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    emulated = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"output steps from the reference; here: {machine()}; emulated: qemu Haswell (AVX2)")
    print(f"{'model':10s} {'format':6s} {'here':>6s} {'AVX2':>6s}")
    for name, fmt, path, reference, step in rows:
        far = float(np.abs(np.array(emulated[path]) - reference).max()) / step
        print(f"{name:10s} {fmt:6s} {here[path]:6.1f} {far:6.1f}")


if __name__ == "__main__":
    main()
