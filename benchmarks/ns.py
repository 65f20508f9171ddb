"""Time and memory of ``qviz.numeric.compare`` against plain forwards and torchao's debugger.

Run from the repository root (a few minutes)::

    .venv/bin/python benchmarks/ns.py [--batches 4] [--batch-size 8] [--repeat 3] [--threads 2]
                                      [--skip-torchao] [--skip-resnet50]

Setup (not timed): torchvision resnet18 (``weights=None``, ``torch.manual_seed(0)``, eval), batches
of random 3x224x224 images, and the 2-layer transformer encoder of ``_models.encoder`` (batches of
16 tokens x 64; timed only); ``qviz.export(model, (x,), dynamic_batch=True)`` → ``prepare_pt2e``
with the XNNPACK quantizer (per-channel symmetric int8) → ``calibrate`` on the batches →
``convert_pt2e``. The quantized model is the reference q/dq graph in float32, not a lowered one.

Time, seconds, best of ``--repeat`` runs after one warm-up, the measurements interleaved so that
other load on the machine slows them alike; wall and process CPU time (on a shared machine the CPU
time is the steadier of the two; ratios are within one column):

* float forward: the exported float GraphModule over every batch;
* quantized forward: the ``convert_pt2e`` model over every batch;
* qviz compare: ``qviz.numeric.compare(gm, quantized, batches)``; its ratio is to float + quantized
  forward (what any comparison must run), printed against the target, at most 2x (``TARGET``).
  compare measures more than torchao does (cumulative and local error, grid statistics, weight
  SQNR for every operator), and the local error runs every quantized operator a second time;
* torchao debugger, *comparison only*: the float and converted models with torchao's
  ``prepare_for_propagation_comparison`` loggers run on every batch,
  ``extract_results_from_loggers``, ``compare_results`` and the SQNR of every matched handle (mean
  over batches). torchao's own export / prepare / calibrate / convert and the logger insertion are
  setup and not timed. Its ratio is to qviz's float + quantized forward, and, on the next line, to
  torchao's own two models run without loggers.

Memory, MB, each phase in a fresh process so that one does not inflate another: the models are
built, freed memory is handed back to the system (``malloc_trim``), the peak RSS is reset
(``/proc/self/clear_refs``; ``VmHWM`` is then the phase's peak, where ``ru_maxrss`` would also hold
setup and, through fork, the parent's peak), and the measured work runs:

* baseline: float + quantized forward over the batches (floor: the RSS with both models built);
* qviz compare, torchao debugger: the same work as timed;
* resnet50 baseline and qviz compare (``--skip-resnet50`` to leave out).

``peak - base`` is the phase's peak minus the baseline's peak for the same model; the last column
divides it by one batch of activations (numel * 4 bytes of every float operator output for one
batch, from an fx Interpreter over the float graph). compare keeps the float outputs of one batch
at a time, so its extra memory should stay near one or two batches of activations whatever the
number of batches; torchao keeps every logged output of every batch of both models.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import resource
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torchvision
from _machine import Stopwatch, cpu, set_threads
from _models import encoder
from torch.fx import GraphModule, Interpreter, Node

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

MB = 2**20
#: compare's time at most this many times the float + quantized forwards it needs (issue 40).
TARGET = 2.0


# -- models ----------------------------------------------------------------------------------
def build(name: str, batch_size: int, n_batches: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    if name == "encoder":  # batch_size x 16 tokens x 64
        return encoder(n_batches, batch_size)
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    batches = [torch.randn(batch_size, 3, 224, 224) for _ in range(n_batches)]
    return model, batches


def quantize(model: torch.nn.Module, batches: list[torch.Tensor]) -> tuple[GraphModule, Any]:
    gm = qviz.export(model, (batches[0],), dynamic_batch=True)
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = qviz.prepare_pt2e(gm, q)
    qviz.calibrate(prepared, batches, progress=False)
    return gm, qviz.convert_pt2e(prepared)


def forward_all(model: Callable[[torch.Tensor], Any], batches: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for b in batches:
            model(b)


def compare(gm: GraphModule, quantized: Any, batches: list[torch.Tensor]) -> Any:
    from qviz.numeric import compare as qviz_compare

    return qviz_compare(gm, quantized, batches, progress=False)


class TorchaoDebugger:
    """torchao 0.18's PT2E numeric debugger on the same model and batches.

    The constructor is setup (export, loggers on the float model, torchao's prepare, calibrate,
    convert, loggers on the converted model); ``run`` is the comparison that is measured.
    """

    def __init__(self, model: torch.nn.Module, batches: list[torch.Tensor]) -> None:
        from torchao.quantization.pt2e import prepare_for_propagation_comparison
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.testing.pt2e._xnnpack_quantizer import (
            XNNPACKQuantizer as RefQuantizer,
        )
        from torchao.testing.pt2e._xnnpack_quantizer import (
            get_symmetric_quantization_config as ref_config,
        )

        self.model, self.batches = model, batches
        m = torch.export.export(model, (batches[0],)).module()
        self.ref_logged = prepare_for_propagation_comparison(m)  # a copy, before prepare fuses m
        self.float_plain: GraphModule | None = None  # built when first needed
        prepared = prepare_pt2e(m, RefQuantizer().set_global(ref_config(is_per_channel=True)))
        forward_all(prepared, batches)
        self.quant_plain = convert_pt2e(prepared)
        self.q_logged = prepare_for_propagation_comparison(self.quant_plain)

    def forwards_without_loggers(self) -> None:
        if self.float_plain is None:
            self.float_plain = torch.export.export(self.model, (self.batches[0],)).module()
        forward_all(self.float_plain, self.batches)
        forward_all(self.quant_plain, self.batches)

    def run(self) -> dict[Any, float]:
        """Logger runs, extract, compare_results, one SQNR (dB, mean over batches) per handle."""
        from torchao.quantization.pt2e import compare_results, extract_results_from_loggers

        for gm in (self.ref_logged, self.q_logged):
            for module in gm.modules():  # OutputLogger.stats grows with every call
                if isinstance(getattr(module, "stats", None), list):
                    module.stats.clear()
            forward_all(gm, self.batches)
        results = compare_results(
            extract_results_from_loggers(self.ref_logged),
            extract_results_from_loggers(self.q_logged),
        )
        return {
            key: sum(float(r.sqnr) for r in s.results) / len(s.results)
            for key, s in results.items()
        }


# -- timing ----------------------------------------------------------------------------------
def best_of(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, tuple[float, float]]:
    """Best wall and CPU time of each function over ``repeat`` interleaved runs, after a warm-up."""
    for fn in fns.values():
        fn()
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in fns}
    for _ in range(repeat):
        for key, fn in fns.items():
            with Stopwatch() as watch:
                fn()
            times[key].append((watch.seconds, watch.cpu_seconds))
    return {k: (min(w for w, _ in v), min(c for _, c in v)) for k, v in times.items()}


def timings(args: argparse.Namespace, name: str) -> None:
    model, batches = build(name, args.batch_size, args.batches)
    gm, quantized = quantize(model, batches)
    fns: dict[str, Callable[[], object]] = {
        "float": lambda: forward_all(gm, batches),
        "quant": lambda: forward_all(quantized, batches),
        "compare": lambda: compare(gm, quantized, batches),
    }
    if not args.skip_torchao and name == "resnet18":
        debugger = TorchaoDebugger(model, batches)
        fns["torchao"] = debugger.run
        fns["torchao_plain"] = debugger.forwards_without_loggers
    t = best_of(fns, args.repeat)
    base = tuple(f + q for f, q in zip(t["float"], t["quant"], strict=True))
    n = args.batches
    rows = [
        (f"float forward x{n} (exported GraphModule)", t["float"], None),
        (f"quantized forward x{n} (convert_pt2e)", t["quant"], None),
        ("float + quantized forward", base, base),
        (f"qviz.numeric.compare (target <= {TARGET:g}x)", t["compare"], base),
    ]
    if "torchao" in t:
        handles = len(debugger.run())
        rows += [
            (f"torchao debugger, comparison only ({handles} handles)", t["torchao"], base),
            ("  same, ratio to torchao's own float + quantized", t["torchao"], t["torchao_plain"]),
            ("  torchao's own float + quantized forward", t["torchao_plain"], None),
        ]
    shape = "x".join(map(str, batches[0].shape))
    print(f"\nTime, {name} ({n} batches of {shape}), best of {args.repeat} after 1 warm-up "
          f"(ratio: to float + quantized)")  # fmt: skip
    print(f"{'measurement':<58}{'wall s':>8}{'ratio':>8}{'cpu s':>8}{'ratio':>8}")
    for what, sec, per in rows:
        cells = "".join(
            f"{sec[i]:8.2f}" + (f"{sec[i] / per[i]:7.2f}x" if per is not None else " " * 8)
            for i in (0, 1)
        )
        print(f"{what:<58}{cells}")
    ratio = t["compare"][0] / base[0]
    verdict = "met" if ratio <= TARGET else "missed"
    print(f"compare / (float + quantized), wall: {ratio:.2f}x against {TARGET:g}x: {verdict}")


# -- memory (each phase in its own process) ---------------------------------------------------
def rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> bool:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def activation_bytes(gm: GraphModule, x: torch.Tensor) -> int:
    """numel * 4 summed over every floating-point operator output of ``gm`` for input ``x``."""

    class Sizes(Interpreter):
        total = 0

        def run_node(self, n: Node) -> Any:
            out = super().run_node(n)
            if n.op != "call_function" or not isinstance(out, torch.Tensor):
                return out
            if out.is_floating_point():
                Sizes.total += out.numel() * 4
            return out

    with torch.no_grad():
        Sizes(gm).run(x)
    return Sizes.total


def phase(args: argparse.Namespace) -> None:
    model, batches = build(args.model, args.batch_size, args.batches)
    if args.phase != "torchao":
        gm, quantized = quantize(model, batches)
    work: Callable[[], object]
    if args.phase == "baseline":

        def work() -> None:
            forward_all(gm, batches)
            forward_all(quantized, batches)

    elif args.phase == "compare":

        def work() -> None:
            compare(gm, quantized, batches)

    else:
        work = TorchaoDebugger(model, batches).run
    floor = rss_mb("VmRSS") if reset_peak() else float("nan")
    work()
    if floor == floor:
        peak = rss_mb("VmHWM")
    else:  # no clear_refs: the whole process's peak, setup included
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"floor": floor, "peak": peak}
    if args.phase == "baseline":
        out["acts"] = activation_bytes(gm, batches[0]) / MB
        out["params"] = sum(p.numel() * 4 for p in model.parameters()) / MB
    print(json.dumps(out))


def run_phase(args: argparse.Namespace, model: str, name: str) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--phase", name, "--model", model]
    cmd += ["--batches", str(args.batches), "--batch-size", str(args.batch_size)]
    cmd += ["--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise RuntimeError(f"{model} {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def memory(args: argparse.Namespace) -> None:
    plan = [("resnet18", "baseline"), ("resnet18", "compare")]
    plan += [] if args.skip_torchao else [("resnet18", "torchao")]
    plan += [] if args.skip_resnet50 else [("resnet50", "baseline"), ("resnet50", "compare")]
    print("\nPeak RSS, MB, each phase in a fresh process (floor: RSS with the models built)")
    print(
        f"{'model':<10}{'phase':<18}{'floor':>8}{'peak':>8}{'peak - base':>13}"
        f"{'/ 1 batch acts':>16}"
    )
    base: dict[str, dict[str, float]] = {}
    for model, name in plan:
        r = run_phase(args, model, name)
        base.setdefault(model, r)
        extra = r["peak"] - base[model]["peak"]
        ratio = f"{extra / base[model]['acts']:15.2f}x" if name != "baseline" else ""
        print(f"{model:<10}{name:<18}{r['floor']:8.0f}{r['peak']:8.0f}{extra:13.0f}{ratio}")
    for model, r in base.items():
        print(
            f"{model}: float parameters {r['params']:.0f} MB, one batch of activations "
            f"(every float op output, batch {args.batch_size}) {r['acts']:.0f} MB"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-torchao", action="store_true")
    parser.add_argument("--skip-resnet50", action="store_true")
    phases = ["baseline", "compare", "torchao"]
    parser.add_argument("--phase", choices=phases, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="resnet18", help=argparse.SUPPRESS)
    args = parser.parse_args()
    set_threads(args.threads)
    warnings.filterwarnings("ignore")
    if args.phase:
        phase(args)
        return
    print(f"{cpu()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in ("resnet18", "encoder"):
        timings(args, name)
    memory(args)


if __name__ == "__main__":
    main()
