"""The flows on a CUDA device against the same flows on the CPU: does everything run on CUDA
tensors, and how far apart are the numbers?

Runs on the embedded digits model and its calibration / test split:

* PT2E: export, prepare (XNNPACK, per channel), calibrate, convert, the converted model's
  accuracy; every group's qparams on CUDA against the CPU's;
* the numeric suite: ``qviz.numeric.compare`` on CUDA, each layer's SQNR against the CPU's;
* QAT: prepare_qat_pt2e, 20 SGD steps, convert;
* quant_modules: quantize_model, calibrate_quantizers (max and entropy), a forward;
* OrderFreeHistogramObserver: its histogram on CUDA against the CPU's, bitwise;
* repair, at 4-bit per-tensor weights: ``diagnose``, cross-layer equalization, bias correction,
  AdaRound (one layer, few iterations) and a ``RepairSession`` apply / undo, each one's output
  SQNR on CUDA against the CPU's; SmoothQuant on a LayerNorm block with outlier channels.

Usage: ``python benchmarks/cuda_flow.py [--device cuda]``; it prints a table and exits 1 when a
flow fails on the device or disagrees beyond what float reductions explain. No unit test needs a
GPU; this is the device check a session with one runs.
"""

from __future__ import annotations

import argparse
import sys
import traceback

import torch
from _machine import Stopwatch

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.observers import OrderFreeHistogramObserver
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.numeric import sqnr


def _batches(loader, device, n=None):
    out = []
    for i, (x, y) in enumerate(loader):
        if n is not None and i >= n:
            break
        out.append((x.to(device), y.to(device)))
    return out


def _accuracy(model, batches) -> float:
    right = total = 0
    with torch.no_grad():
        for x, y in batches:
            right += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return 100.0 * right / total


def pt2e(device):
    loaders = digits_loaders(batch_size=64)
    calib = [x for x, _ in _batches(loaders.calibration, device)]
    test = _batches(loaders.test, device)
    model = digits_model().eval().to(device)
    gm = qviz.export(model, (calib[0],), dynamic_batch=True)
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = qviz.prepare_pt2e(gm, q)
    qviz.calibrate(prepared, calib, progress=False)
    converted = qviz.convert_pt2e(prepared)
    report = qviz.numeric.compare(gm, converted, [x for x, _ in test[:4]], progress=False)
    qparams = {g.group: g.qparams for g in converted.plan.groups}
    return {
        "float_acc": _accuracy(gm, test),
        "int8_acc": _accuracy(converted, test),
        "qparams": qparams,
        "sqnr": dict(zip(report.df["node"], report.df["cumulative_sqnr"], strict=True)),
    }


def qat(device):
    loaders = digits_loaders(batch_size=64)
    train = _batches(loaders.train, device, 20)
    test = _batches(loaders.test, device)
    torch.manual_seed(0)
    gm = qviz.export(digits_model().train().to(device), (train[0][0],), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True, is_qat=True)
    prepared = qviz.prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(config))
    opt = torch.optim.SGD(prepared.parameters(), lr=1e-3, momentum=0.9)
    for x, y in train:
        loss = torch.nn.functional.cross_entropy(prepared(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    converted = qviz.convert_pt2e(qviz.move_exported_model_to_eval(prepared))
    return {"qat_int8_acc": _accuracy(converted, test)}


def quant_modules(device):
    from qviz.engine import quant_modules as qm

    loaders = digits_loaders(batch_size=64)
    calib = [x for x, _ in _batches(loaders.calibration, device)]
    test = _batches(loaders.test, device)
    out = {}
    for method in ("max", "entropy"):
        model = qm.quantize_model(digits_model().eval().to(device))
        qviz.calibrate_quantizers(model, calib, method=method, progress=False)
        out[f"quant_nn_{method}_acc"] = _accuracy(model, test)
    return out


def order_free(device):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(4096, generator=g) * (i + 1) for i in range(6)]
    obs = OrderFreeHistogramObserver().to(device)
    for x in xs:
        obs(x.to(device))
    scale, zp = obs.calculate_qparams()
    counts, _ = obs.histogram()
    return {"order_free": (counts.cpu(), float(scale), int(zp))}


def _outputs(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(x) for x in inputs])


def repair(device):
    from qviz.engine.repair import adaround, bias_correction, cross_layer_equalization
    from qviz.numeric import RepairSession, diagnose

    loaders = digits_loaders(batch_size=64)
    calib = [x for x, _ in _batches(loaders.calibration, device)]
    test = [x for x, _ in _batches(loaders.test, device)][:4]
    gm = qviz.export(digits_model().eval().to(device), (calib[0],), dynamic_batch=True)
    reference = _outputs(gm, test)
    config = get_symmetric_quantization_config(is_per_channel=False, weight_qmin=-8, weight_qmax=7)
    q = XNNPACKQuantizer().set_global(config)
    prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), calib, progress=False)
    ptq = qviz.convert_pt2e(prepared)
    found = diagnose(qviz.numeric.compare(gm, ptq, test, progress=False), prepared, data=test)
    cle_gm = cross_layer_equalization(gm)
    cle = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(cle_gm, q), calib, progress=False))
    bc = bias_correction(ptq, gm, calib)
    ada = adaround(ptq, gm, calib, iterations=50, nodes="linear", progress=False)
    session = RepairSession(gm, q, calib, test, progress=False)
    step = session.apply("bias_correction")
    session.undo()
    out = {f"repair_{k}": sqnr(reference, _outputs(m, test)) for k, m in
           (("ptq", ptq), ("cle", cle), ("bias_correction", bc), ("adaround", ada))}  # fmt: skip
    out["repair_session_bc"] = step.output_sqnr_after
    out["repair_causes"] = sorted(f.cause.value for f in found)
    out.update(_smooth(device))
    return out


def _smooth(device):
    from qviz.engine.repair import smooth_quant

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.Linear(32, 16)).eval()
    with torch.no_grad():
        model[0].weight[:3] *= 50  # outlier channels after the LayerNorm
    model = model.to(device)
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(16, 8, 32, generator=g).to(device) for _ in range(3)]
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=False))
    gm = qviz.export(model, (data[0],))
    reference = _outputs(gm, data)
    out = {}
    for name, graph in (
        ("ptq", gm),
        ("smooth_quant", smooth_quant(gm, data, alpha=0.5, progress=False)),
    ):
        prepared = qviz.calibrate(qviz.prepare_pt2e(graph, q), data, progress=False)
        out[f"smooth_{name}"] = sqnr(reference, _outputs(qviz.convert_pt2e(prepared), data))
    return out


FLOWS = {"pt2e": pt2e, "qat": qat, "quant_modules": quant_modules, "order_free": order_free,
         "repair": repair}  # fmt: skip


def _run(device):
    results, failures = {}, {}
    for name, flow in FLOWS.items():
        try:
            with Stopwatch() as watch:
                results.update(flow(device))
            print(f"  {device:5s} {name:14s} ok     {watch.seconds:6.2f} s")
        except Exception:
            failures[name] = traceback.format_exc()
            print(f"  {device:5s} {name:14s} FAILED\n{failures[name]}")
    return results, failures


def _qparam_gap(a, b) -> float:
    worst = 0.0
    for g, qa in a.items():
        qb = b[g]
        sa = torch.as_tensor(qa.scale, dtype=torch.float64)
        sb = torch.as_tensor(qb.scale, dtype=torch.float64)
        worst = max(worst, float(((sa - sb).abs() / sb.abs().clamp_min(1e-30)).max()))
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: nothing to check")
        return 0
    print(f"torch {torch.__version__}, device {args.device}", end="")
    if args.device.startswith("cuda"):
        print(f" ({torch.cuda.get_device_name()})", end="")
    print()
    cpu, cpu_fail = _run("cpu")
    dev, dev_fail = _run(args.device)
    if dev_fail or cpu_fail:
        return 1
    print(f"\n{'figure':32s} {'cpu':>12s} {args.device:>12s}")
    for key in ("float_acc", "int8_acc", "qat_int8_acc", "quant_nn_max_acc",
                "quant_nn_entropy_acc"):  # fmt: skip
        print(f"{key:32s} {cpu[key]:12.2f} {dev[key]:12.2f}")
    gap = _qparam_gap(cpu["qparams"], dev["qparams"])
    print(f"{'largest relative scale gap':32s} {gap:25.3g}")
    sqnr = [(n, cpu["sqnr"][n], dev["sqnr"].get(n)) for n in cpu["sqnr"]]
    worst = max(abs(a - b) for _, a, b in sqnr if b is not None)
    print(f"{'largest per-layer SQNR gap (dB)':32s} {worst:25.3g}")
    repair_keys = [k for k in cpu if k.startswith(("repair_", "smooth_")) and k != "repair_causes"]
    for key in repair_keys:
        print(f"{key + ' (dB)':32s} {cpu[key]:12.2f} {dev[key]:12.2f}")
    repair_gap = max(abs(cpu[k] - dev[k]) for k in repair_keys)
    print(f"{'diagnosis causes':32s} {cpu['repair_causes']} / {dev['repair_causes']}")
    same_hist = torch.equal(cpu["order_free"][0], dev["order_free"][0])
    print(f"{'order-free histogram bitwise':32s} {same_hist!s:>25s}")
    ok = same_hist and gap < 1e-3 and abs(cpu["int8_acc"] - dev["int8_acc"]) <= 1.0
    ok = ok and repair_gap < 1.0  # dB: float reductions move a rounding, not a remedy
    print("OK" if ok else "DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
