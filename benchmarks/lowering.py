"""Speed and size of the int8 model on real kernels, beside float eager and float compiled.

Run from the repository root (a few minutes)::

    .venv/bin/python benchmarks/lowering.py [digits resnet18 mobilenet_v2 resnet50 encoder]
        [--backends=inductor]

For each model (the embedded digits model; torchvision's with random weights, 3x224x224; a
4-layer transformer encoder, d_model 256, 64 tokens): float eager, float ``torch.compile``
(plain, and with Inductor's freezing, which packs the float weights for oneDNN as the int8 path
packs its own), the float model on ExecuTorch's XNNPACK delegate, and the converted model
lowered with
``qviz.lower``: XNNPACK quantizer (per-channel weights) to ExecuTorch XNNPACK and to
onnxruntime; X86InductorQuantizer (uint8 activations) to Inductor's oneDNN int8 kernels: the
latency at batch 1 and 8 (2 threads), artifact size, lowering time, how many operators run on
integer and on float kernels, and the largest difference from the reference model in output
steps. Latency: every row is timed once per round, ten rounds, and its fastest round kept, so
load from other jobs hits all rows alike and the least disturbed call counts.
``--backends=`` picks among xnnpack, onnxruntime, inductor. The machine's CPU class (AVX2,
AVX-512, AVX-512 VNNI, AMX, ARM) is printed first and beside each int8-against-float ratio: each
backend's int8 rows are compared with that backend's own float program (XNNPACK fp32 ``.pte``,
an onnxruntime float session, Inductor with freezing), and other classes give other figures.
"""

from __future__ import annotations

import copy
import io
import sys

import torch
import torchvision
from _machine import Stopwatch, set_threads, timed

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.graph.capture import dynamic_batch_shapes
from qviz.engine.lower.machine import machine
from qviz.engine.lower.records import DEFAULT_MAX_BATCH
from qviz.engine.lower.speed import lower_float
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

BATCHES = (1, 8)
BACKENDS = ("xnnpack", "onnxruntime", "inductor")


class Encoder(torch.nn.Module):
    """A transformer encoder (4 layers, d_model 256, 4 heads, 64 tokens), then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.head = torch.nn.Linear(256, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(1))


def _model(name: str) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    if name == "digits":
        return digits_model(), [x for x, _ in digits_loaders(batch_size=8).calibration][:8]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if name == "encoder":
        return Encoder(), [torch.randn(8, 64, 256, generator=g) for _ in range(4)]
    model = getattr(torchvision.models, name)(weights=None)
    return model, [torch.randn(8, 3, 224, 224, generator=g) for _ in range(4)]


def _interleaved(candidates: list, repeats: int = 10) -> list[float]:
    """Seconds per call of each ``(fn, x)``: every round times each candidate once, so load that
    comes and goes on a shared machine hits all rows alike; the fastest round of each is kept
    (the least disturbed). Two warm-up calls each first (compiles, caches)."""
    with torch.no_grad():
        for fn, x in candidates:
            fn(x)
            fn(x)
        best = [float("inf")] * len(candidates)
        for _ in range(repeats):
            for i, (fn, x) in enumerate(candidates):
                fn(x)  # back on this candidate: its caches (and any guard checks) warm again
                with Stopwatch() as watch:
                    fn(x)
                best[i] = min(best[i], watch.seconds)
    return best


def _state_bytes(model: torch.nn.Module) -> int:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell()


def _x86_quantizer():
    """qviz's X86InductorQuantizer where this qviz has it, else torchao's (which raises
    "Input partition has more than one output node" on resnet18 at torchao 0.18)."""
    try:
        from qviz.engine.quantizers import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )
    except ImportError:
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )
    # without VNNI oneDNN's pair sums are 16-bit: 7-bit activations, which qviz.lower takes there
    config = get_default_x86_inductor_quantization_config(reduce_range=not machine().exact_u8s8)
    return X86InductorQuantizer().set_global(config)


def _convert(model: torch.nn.Module, batches: list, quantizer) -> torch.fx.GraphModule:
    gm = qviz.export(model, (batches[0],), dynamic_batch=True)
    prepared = qviz.prepare_pt2e(gm, quantizer)
    qviz.calibrate(prepared, batches, progress=False)
    return qviz.convert_pt2e(prepared)


def _output_step(converted: torch.fx.GraphModule) -> float:
    """One step of the output's grid: the output's dequantize, else the one the last op reads."""
    last = next(n for n in converted.graph.nodes if n.op == "output").args[0]
    last = last[0] if isinstance(last, (tuple, list)) else last
    for node in (last, *last.all_input_nodes):
        if "dequantize_per_tensor" in str(node.target) and isinstance(node.args[1], float):
            return node.args[1]
    return 1.0


def _inputs(batches: list) -> list[torch.Tensor]:
    return [batches[0][torch.arange(b) % batches[0].shape[0]] for b in BATCHES]


def _float_rows(model: torch.nn.Module, batches: list) -> list:
    """``(label, batch, fn, x, size, lowering s, kernels, steps)`` of the float model: eager,
    compiled, compiled with freezing (each compile on its own copy, so both stay live)."""
    size, rows = _state_bytes(model), []
    compiled = torch.compile(copy.deepcopy(model))
    frozen_fn = torch.compile(copy.deepcopy(model))

    def frozen(x: torch.Tensor) -> torch.Tensor:
        with torch._inductor.config.patch(freezing=True):
            return frozen_fn(x)

    for label, fn in (
        ("float eager", model),
        ("float compiled", compiled),
        ("float frozen", frozen),
    ):
        rows += [
            (label, b, fn, x, size, None, None, None)
            for b, x in zip(BATCHES, _inputs(batches), strict=True)
        ]
    return (
        rows + _executorch_float_rows(model, batches[0]) + _onnxruntime_float_rows(model, batches)
    )


def _onnxruntime_float_rows(model: torch.nn.Module, batches: list) -> list:
    """The float model in an onnxruntime session, the onnxruntime int8 rows' twin."""
    run, lowering = timed(lambda: lower_float("onnxruntime", model, (batches[0],), True))
    return [
        ("onnxruntime float", b, lambda t, run=run: run([t]), x, 0, lowering, "fp32 session", None)
        for b, x in zip(BATCHES, _inputs(batches), strict=True)
    ]


def _executorch_float_rows(model: torch.nn.Module, x: torch.Tensor) -> list:
    """The float model on ExecuTorch's XNNPACK delegate (fp32 kernels), the int8 rows' twin."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    with Stopwatch() as watch:
        shapes = dynamic_batch_shapes((x,), DEFAULT_MAX_BATCH)  # bounded, as qviz.lower does
        program = torch.export.export(model, (x,), dynamic_shapes=shapes)
        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
        buffer = edge.to_executorch().buffer
        try:
            loaded = Runtime.get().load_program(buffer)
        except MemoryError as exc:  # ExecuTorch's loader, not the machine: say so and go on
            print(f"ExecuTorch could not load the float program ({len(buffer) >> 20} MiB): {exc}")
            return []
        method = loaded.load_method("forward")
    lowering = watch.seconds

    def run(t: torch.Tensor, _keep: tuple = (buffer, loaded)) -> list:
        return method.execute([t])

    return [
        ("xnnpack float", b, run, xb, len(buffer), lowering, "fp32 delegate", None)
        for b, xb in zip(BATCHES, _inputs([x]), strict=True)
    ]


def _lowered_rows(name: str, model: torch.nn.Module, batches: list, backends: tuple) -> list:
    config = get_symmetric_quantization_config(is_per_channel=True)
    converted = None
    if set(backends) - {"inductor"}:
        converted = _convert(model, batches, XNNPACKQuantizer().set_global(config))
    rows = []
    for backend in backends:
        quantized = converted
        if backend == "inductor":
            try:
                quantized = _convert(model, batches, _x86_quantizer())
            except Exception as exc:  # report it and go on with the other rows
                print(f"{name}: X86InductorQuantizer failed: {type(exc).__name__}: {exc}")
                continue
        lowered = qviz.lower(quantized, (batches[0],), backend=backend)
        x = batches[-1]
        with torch.no_grad():
            steps = float((lowered(x) - quantized(x)).abs().max()) / _output_step(quantized)
        counts = lowered.kernel_counts()
        kernels = f"{counts.get('integer', 0)} int / {counts.get('float', 0)} float"
        rows += [
            (backend, b, lowered, xb, lowered.size_bytes, lowered.lowering_seconds, kernels, steps)
            for b, xb in zip(BATCHES, _inputs(batches), strict=True)
        ]
    return rows


def run(name: str, backends: tuple[str, ...] = BACKENDS) -> None:
    model, batches = _model(name)
    model.eval()
    rows = _float_rows(model, batches) + _lowered_rows(name, model, batches, backends)
    seconds = _interleaved([(fn, x) for _, _, fn, x, *_ in rows])
    _print(name, [(r[0], r[1], t, *r[4:]) for r, t in zip(rows, seconds, strict=True)])


def _print(name: str, rows: list) -> None:
    print(f"\n{name}")
    print(f"{'':16s} {'batch':>5s} {'ms':>9s} {'KiB':>9s} {'lower s':>8s} {'kernels':>18s} steps")
    for label, b, seconds, size, lowering, kernels, steps in rows:
        low = f"{lowering:8.1f}" if lowering is not None else f"{'':8s}"
        print(
            f"{label:16s} {b:5d} {seconds * 1e3:9.2f} {size / 1024:9.1f} {low} "
            f"{kernels or '':>18s} {'' if steps is None else f'{steps:.0f}'}"
        )
    ms = {(label, b): seconds for label, b, seconds, *_ in rows}
    twins = {"xnnpack": "xnnpack float", "onnxruntime": "onnxruntime float",
             "inductor": "float frozen"}  # fmt: skip
    for b in BATCHES:
        for backend, twin in twins.items():
            int8 = ms.get((backend, b))
            if int8 and (twin, b) in ms:
                ratio = ms[(twin, b)] / int8
                verdict = "" if ratio >= 1.1 else "  (int8 does not pay here)"
                print(
                    f"batch {b}: {backend} int8 is {ratio:.2f}x as fast as {twin} "
                    f"[{machine().isa}]{verdict}"
                )


def main() -> None:
    threads = set_threads(2)
    print(f"torch {torch.__version__}; machine: {machine()}; {threads} threads")
    picked = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--backends=")]
    backends = tuple(picked[0].split(",")) if picked else BACKENDS
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    for name in names or ["digits", "resnet18", "mobilenet_v2", "resnet50", "encoder"]:
        run(name, backends)


if __name__ == "__main__":
    main()
