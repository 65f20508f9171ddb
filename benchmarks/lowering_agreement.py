"""How closely real kernels follow the reference model, tensor by tensor, on unplanted models.

Run from the repository root (a few minutes)::

    .venv/bin/python benchmarks/lowering_agreement.py [digits resnet18 mobilenet_v2 encoder]

Each model is quantized with the XNNPACK quantizer (per-channel weights), calibrated on its
calibration batches and lowered with ``qviz.lower`` to onnxruntime (compared tensor by tensor:
every QuantizeLinear's output) and to ExecuTorch XNNPACK (compared at the model outputs: a
delegate runs as one call); with X86InductorQuantizer, to x86 Inductor (at the outputs).
``qviz.numeric.bisect_lowering`` finds the first departing tensor where the outputs depart.
For each: how many quantized tensors differ at all, how many
elements differ by one step and by more, the largest difference in steps and where, and the
first tensor more than one step away. torchvision models and the encoder have random weights;
the figures depend on the CPU's kernels (its int8 flags are printed first).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torchvision

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.quantizers import (
    X86InductorQuantizer,
    XNNPACKQuantizer,
    get_default_x86_inductor_quantization_config,
    get_symmetric_quantization_config,
)
from qviz.numeric import bisect_lowering, compare_lowered

sys.path.insert(0, str(Path(__file__).parent))
from _machine import cpu_flags
from lowering import Encoder

MODELS = ("digits", "resnet18", "mobilenet_v2", "encoder")


def _model(name: str) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if name == "digits":
        return digits_model(), [x for x, _ in digits_loaders(batch_size=36).calibration][:5]
    if name == "encoder":
        return Encoder(), [torch.randn(4, 64, 256, generator=g) for _ in range(4)]
    model = getattr(torchvision.models, name)(weights=None)
    batches = [torch.randn(4, 3, 96, 96, generator=g) for _ in range(4)]
    model.train()  # BatchNorm statistics from data: random init leaves mobilenet_v2's output
    with torch.no_grad():  # near 1e-10, where every comparison is trivially equal
        for x in batches:
            model(x)
    return model.eval(), batches


def _converted(model: torch.nn.Module, batches: list[torch.Tensor], backend: str):
    gm = qviz.export(model.eval(), (batches[0],))
    if backend == "inductor":  # oneDNN's int8 kernels take uint8 activations
        quantizer = X86InductorQuantizer().set_global(
            get_default_x86_inductor_quantization_config()
        )
    else:
        config = get_symmetric_quantization_config(is_per_channel=True)
        quantizer = XNNPACKQuantizer().set_global(config)
    prepared = qviz.prepare_pt2e(gm, quantizer)
    qviz.calibrate(prepared, batches, progress=False)
    return qviz.convert_pt2e(prepared)


def _line(name: str, backend: str, result, seconds: float) -> str:
    df = result.df
    worst = df.loc[df["max_steps"].idxmax()]
    first = result.first_departure
    return (
        f"{name:13s} {backend:11s} {result.granularity:13s} tensors {len(df):3d}, differing "
        f"{int((df['differing'] > 0).sum()):3d}; elements differing {int(df['differing'].sum()):8d}"
        f" of {int(df['elements'].sum()):9d} ({df['differing'].sum() / df['elements'].sum():.3%})"
        f"; max {int(worst['max_steps'])} steps at {worst['op']}; first > 1 step: "
        f"{first['op'] if first else '-'}  (lowered in {seconds:.1f} s)"
    )


def main(names: list[str]) -> None:
    print(f"torch {torch.__version__}; CPU int8 flags: {cpu_flags()}")
    for name in names:
        model, batches = _model(name)
        xnnpack_converted = _converted(model, batches, "xnnpack")
        for backend in ("onnxruntime", "xnnpack", "inductor"):
            converted = (
                xnnpack_converted if backend != "inductor" else _converted(model, batches, backend)
            )
            lowered = qviz.lower(converted, (batches[0],), backend=backend)
            result = compare_lowered(converted, lowered, batches)
            print(_line(name, backend, result, lowered.lowering_seconds), flush=True)
            if backend != "onnxruntime" and result.first_departure is not None:
                found = bisect_lowering(converted, lowered, batches)
                print(f"{'':13s} {'':11s} bisected: {found.summary()}", flush=True)


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if not a.startswith("-")] or list(MODELS))
