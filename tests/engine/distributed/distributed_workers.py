"""What each rank does in tests/engine/distributed/test_distributed.py, and the same work in one
process.

Every scenario builds its model and batches deterministically, so the parent test computes the
single-process answer with the very same functions and compares it with what each rank saved.
Workers run under ``torch.multiprocessing`` with gloo on CPU, one thread each.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
import traceback

import torch
from torch import nn

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.observers import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    OrderFreeHistogramObserver,
)
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.numeric import compare

METHODS = ("l2", "max", "percentile", "entropy", "mse")


class ResidualToy(nn.Module):
    """conv-bn-relu, conv-bn + identity, relu, pooling, linear: a resnet-like block."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.stem(x)
        z = torch.relu(self.bn(self.conv(y)) + y)
        return self.fc(z.mean((2, 3)))


# -- data ---------------------------------------------------------------------------------------
def digits_batches(n: int = 6, size: int = 16) -> list[torch.Tensor]:
    images = torch.cat([x for x, _ in digits_loaders(size).calibration])
    return [images[i * size : (i + 1) * size] for i in range(n)]


def toy_batches(n: int = 5) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(4, 3, 8, 8, generator=g) * (1 + i) for i in range(n)]


def shards(world: int, n: int) -> list[list[int]]:
    """Uneven shards of batch indices; with 3 ranks, rank 1's is empty."""
    if world == 2:
        return [list(range(0, n - 2)), list(range(n - 2, n))]
    return [list(range(0, n - 1)), [], [n - 1]]


# -- models -------------------------------------------------------------------------------------
def _digits_prepared(**config):
    example = digits_batches(1)[0]
    gm = qviz.export(digits_model().eval(), (example,), dynamic_batch=True)
    cfg = get_symmetric_quantization_config(is_per_channel=True, **config)
    return gm, qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(cfg))


def _with_activation_observer(config, observer):
    spec = dataclasses.replace(config.input_activation, observer_or_fake_quant_ctr=observer)
    return dataclasses.replace(config, input_activation=spec, output_activation=spec)


def toy_prepared(observer=MinMaxObserver):
    gm = qviz.export(ResidualToy().eval(), (toy_batches(1)[0],), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True)
    config = _with_activation_observer(config, observer.with_args(eps=2**-12))
    return gm, qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))


def observer_qparams(prepared) -> dict[str, dict[str, tuple]]:
    """Every observer's qparams for every method it can compute (histograms: all five)."""
    out = {}
    for name, module in prepared.named_modules():
        if isinstance(module, HistogramObserver):
            out[name] = {
                m: tuple(t.tolist() for t in module.calculate_qparams(method=m)) for m in METHODS
            }
        elif hasattr(module, "calculate_qparams") and getattr(module, "num_batches", 0):
            out[name] = {"own": tuple(t.tolist() for t in module.calculate_qparams())}
    return out


def observer_state(prepared) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in prepared.state_dict().items() if "activation_post" in k}


# -- scenarios: (group) -> result; group None = one process over the union -----------------------
def histogram_scenario(rank: int, world: int, group) -> dict:
    """Digits, HistogramObservers that also keep |x| histograms. Every rank's first batch is the
    anchor (all the data), so no rank's range grows later: the case where torch's own
    histogram does not depend on the order, and the merge must equal one process bit for bit."""
    batches = digits_batches()
    anchor = torch.cat(batches)
    _, prepared = _digits_prepared(switchable=True)
    if group is None:  # one process: every rank's anchor, then every shard in rank order
        data = [anchor] * world + [batches[i] for shard in shards(world, 6) for i in shard]
    else:
        data = [anchor] + [batches[i] for i in shards(world, 6)[rank]]
    qviz.calibrate(prepared, data, progress=False, group=group)
    converted = qviz.convert_pt2e(prepared)
    with torch.no_grad():
        out = converted(batches[0])
    return {"qparams": observer_qparams(prepared), "state": observer_state(prepared), "out": out}


def _digits_calibrated(batches: list[torch.Tensor], group, observer) -> tuple:
    """The digits model with ``observer`` on its activations, calibrated on ``batches`` and
    converted: (the prepared model, its converted outputs on every digits batch)."""
    example = digits_batches(1)[0]
    gm = qviz.export(digits_model().eval(), (example,), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True)
    config = _with_activation_observer(config, observer.with_args(eps=2**-12))
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    qviz.calibrate(prepared, batches, progress=False, group=group)
    converted = qviz.convert_pt2e(prepared)
    with torch.no_grad():
        return prepared, torch.cat([converted(x) for x in digits_batches()])


def order_spread_scenario(rank: int, world: int, group, order: list[int] | None = None) -> dict:
    """torch's HistogramObserver on uneven shards of the digits batches, no anchor batch: ranges
    grow, so the merge cannot be exact. ``group`` None: one process over the batches in
    ``order`` (default: the shards in rank order)."""
    batches = digits_batches()
    if group is None:
        mine = order if order is not None else list(range(len(batches)))
    else:
        mine = shards(world, len(batches))[rank]
    _, out = _digits_calibrated([batches[i] for i in mine], group, HistogramObserver)
    return {"out": out}


def order_free_scenario(rank: int, world: int, group) -> dict:
    """OrderFreeHistogramObserver on the same uneven shards, no anchor: exact, bit for bit."""
    batches = digits_batches()
    mine = range(len(batches)) if group is None else shards(world, len(batches))[rank]
    data = [batches[i] for i in mine]
    prepared, out = _digits_calibrated(data, group, OrderFreeHistogramObserver)
    return {"qparams": observer_qparams(prepared), "state": observer_state(prepared), "out": out}


def minmax_scenario(rank: int, world: int, group) -> dict:
    """The residual toy with min/max observers; uneven shards, an empty one with 3 ranks."""
    batches = toy_batches()
    _, prepared = toy_prepared()
    mine = range(len(batches)) if group is None else shards(world, len(batches))[rank]
    qviz.calibrate(prepared, [batches[i] for i in mine], progress=False, group=group)
    converted = qviz.convert_pt2e(prepared)
    with torch.no_grad():
        out = converted(batches[0])
    return {"qparams": observer_qparams(prepared), "state": observer_state(prepared), "out": out}


def moving_average_scenario(rank: int, world: int, group, only: int | None = None) -> dict:
    """Moving-average observers: ``only`` calibrates one rank's shard in this process (the
    parent's inputs to the documented rule)."""
    batches = toy_batches()
    _, prepared = toy_prepared(MovingAverageMinMaxObserver)
    if only is not None:
        mine = shards(world, len(batches))[only]
    else:
        mine = shards(world, len(batches))[rank]
    data = [batches[i] for i in mine]
    if only is not None and not data:
        return {"state": None, "batches": {}}
    qviz.calibrate(prepared, data, progress=False, group=group)
    counts = {
        n: m.num_batches
        for n, m in prepared.named_modules()
        if isinstance(m, MovingAverageMinMaxObserver)
    }
    return {"state": observer_state(prepared), "batches": counts}


def quantizers_scenario(rank: int, world: int, group) -> dict:
    """quant_nn twin of the digits model: calibrate_quantizers with histogram methods."""
    from qviz.engine.tensor.quant_modules import quantize_model

    batches = digits_batches()
    tables = {}
    for method in ("max", "percentile", "entropy", "mse"):
        model = quantize_model(digits_model())
        mine = range(len(batches)) if group is None else shards(world, len(batches))[rank]
        table = qviz.calibrate_quantizers(
            model, [batches[i] for i in mine], method, progress=False, group=group
        )
        tables[method] = {r.name: r.amax for r in table} | {
            f"{n}._amax": m._amax.clone()
            for n, m in model.named_modules()
            if getattr(m, "_amax", None) is not None
        }
    return tables


def compare_scenario(rank: int, world: int, group) -> dict:
    """The numeric report over shards (one calibration, the same on every rank)."""
    batches = digits_batches()
    gm, prepared = _digits_prepared()
    qviz.calibrate(prepared, batches[:2], progress=False, group=False)  # this rank alone
    converted = qviz.convert_pt2e(prepared)
    labelled = [(x, (x.sum((1, 2, 3)) > x.sum() / len(x)).long()) for x in batches]
    mine = range(len(batches)) if group is None else shards(world, len(batches))[rank]

    def metric(float_out, quant_out, target):
        return float((quant_out.argmax(1) == float_out.argmax(1)).float().mean())

    report = compare(
        gm, converted, [labelled[i] for i in mine], metric=metric, progress=False, group=group
    )
    return {"df": report.df, "metric": report.metric, "summary": repr(report)}


def compare_modules_scenario(rank: int, world: int, group) -> dict:
    """The numeric report of the quant_nn digits twin over shards (calibrated once, alike)."""
    from qviz.engine.tensor.quant_modules import quantize_model

    batches = digits_batches()
    float_model = digits_model()
    model = quantize_model(float_model)
    qviz.calibrate_quantizers(model, batches[:2], "max", progress=False, group=False)
    mine = range(len(batches)) if group is None else shards(world, len(batches))[rank]
    report = compare(float_model, model, [batches[i] for i in mine], progress=False, group=group)
    return {"df": report.df, "summary": repr(report)}


def sensitivity_scenario(rank: int, world: int, group) -> dict:
    """Fallback sensitivity of the residual toy: each variant calibrated on every shard
    (min/max observers: exact) and scored over every shard."""
    from qviz.numeric import sensitivity

    batches = toy_batches()
    gm, _ = toy_prepared()
    config = get_symmetric_quantization_config(is_per_channel=True)
    config = _with_activation_observer(config, MinMaxObserver.with_args(eps=2**-12))
    mine = range(len(batches)) if group is None else shards(world, len(batches))[rank]
    df = sensitivity(
        gm, XNNPACKQuantizer().set_global(config), [batches[i] for i in mine],
        progress=False, group=group,
    )  # fmt: skip
    return {"df": df, "attrs": dict(df.attrs)}


def precision_scenario(rank: int, world: int, group) -> dict:
    """A mixed-precision search of the residual toy over the shards: every variant calibrated
    on all of them (min/max observers: exact), every screening and confirmation scored over
    all of them, so every rank makes the choices one process makes over the union."""
    from qviz.numeric import search_precision

    batches = toy_batches()
    gm, _ = toy_prepared()
    config = get_symmetric_quantization_config(is_per_channel=True)
    config = _with_activation_observer(config, MinMaxObserver.with_args(eps=2**-12))
    mine = range(len(batches)) if group is None else shards(world, len(batches))[rank]
    result = search_precision(
        gm, XNNPACKQuantizer().set_global(config), [batches[i] for i in mine], min_sqnr=35.0,
        candidates=["w4a8", "w8a8", "float"], progress=False, group=group,
    )  # fmt: skip
    return {"records": (result.screened, result.front, result.evaluations, result.chosen)}


def qat_scenario(rank: int, world: int, group, only: int | None = None) -> dict:
    """A QAT-prepared digits model (fused fake-quantize modules, moving averages) run on
    shards, its BatchNorm in eval mode: the fake quantizers' observers merge by the moving-average
    rule and their scale / zero_point follow. ``only``: one rank's shard in this process."""
    batches = digits_batches()
    gm = qviz.export(digits_model().train(), (batches[0],), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True, is_qat=True)
    prepared = qviz.prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(config))
    qviz.move_exported_model_to_eval(prepared)  # BatchNorm statistics are not observers
    mine = shards(world, len(batches))[rank if only is None else only]
    if only is not None and not mine:
        return {"state": None}
    qviz.calibrate(prepared, [batches[i] for i in mine], progress=False, group=group)
    fake_quantizers = {
        n: m for n, m in prepared.named_modules() if hasattr(m, "activation_post_process")
    }
    return {
        "state": {k: v.clone() for k, v in prepared.state_dict().items() if "post_process" in k},
        "batches": {n: m.activation_post_process.num_batches for n, m in fake_quantizers.items()},
        "qparams": {
            n: tuple(t.clone() for t in m.calculate_qparams()) for n, m in fake_quantizers.items()
        },
    }


# -- failure scenarios (distributed only) ---------------------------------------------------------
def failure_scenario(rank: int, world: int, group) -> str:
    """Rank 1 feeds a batch of the wrong shape: every rank must raise, naming rank 1."""
    batches = toy_batches()
    _, prepared = toy_prepared()
    data = [torch.randn(4, 5, 8, 8)] if rank == 1 else [batches[rank]]
    try:
        qviz.calibrate(prepared, data, progress=False, group=group)
    except qviz.QvizError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def mismatch_scenario(rank: int, world: int, group) -> str:
    """The last rank prepares another model: every rank must raise, naming that rank."""
    batches = toy_batches()
    if rank == world - 1:
        _, prepared = _digits_prepared()
        data = [digits_batches(1)[0]]
    else:
        _, prepared = toy_prepared()
        data = [batches[rank]]
    try:
        qviz.calibrate(prepared, data, progress=False, group=group)
    except qviz.QvizError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


# -- a bad argument, a bad batch or another call on one rank: every rank raises, in seconds -------
#: the rank that does something wrong in the scenarios below
BAD = 1


def _linear_case():
    """A tiny exported linear model, prepared and converted (calibrated on this rank alone)."""
    data = [torch.randn(4, 4, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    gm = qviz.export(nn.Linear(4, 3).eval(), (data[0],))
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    converted = qviz.convert_pt2e(
        qviz.calibrate(qviz.prepare_pt2e(gm, quantizer), data, progress=False, group=False)
    )
    return gm, quantizer, qviz.prepare_pt2e(gm, quantizer), converted, data


def _raised(call) -> dict:
    """What ``call`` raised (a QvizError) and after how many seconds; anything else crashes."""
    start = time.monotonic()
    try:
        call()
    except qviz.QvizError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - start}
    return {"error": "no error", "seconds": time.monotonic() - start}


def bad_max_batches_scenario(rank: int, world: int, group) -> dict:
    _, _, prepared, _, data = _linear_case()
    limit = 0 if rank == BAD else None
    return _raised(
        lambda: qviz.calibrate(prepared, data, max_batches=limit, progress=False, group=group)
    )


def bad_method_scenario(rank: int, world: int, group) -> dict:
    from qviz.engine.tensor.quant_modules import quantize_model

    model = quantize_model(nn.Sequential(nn.Linear(4, 3), nn.ReLU()))
    method = "maxx" if rank == BAD else "max"
    data = [torch.randn(4, 4)]
    return _raised(
        lambda: qviz.calibrate_quantizers(model, data, method, progress=False, group=group)
    )


def bad_group_scenario(rank: int, world: int, group) -> dict:
    _, _, prepared, _, data = _linear_case()
    mine = True if rank == BAD else group
    return _raised(lambda: qviz.calibrate(prepared, data, progress=False, group=mine))


def bad_mode_scenario(rank: int, world: int, group) -> dict:
    from qviz.numeric import sensitivity

    gm, quantizer, _, _, data = _linear_case()
    mode = "fallbak" if rank == BAD else "fallback"
    return _raised(lambda: sensitivity(gm, quantizer, data, mode=mode, progress=False, group=group))


def bad_stage_scenario(rank: int, world: int, group) -> dict:
    """The bad rank hands compare its prepared model instead of the converted one."""
    gm, _, prepared, converted, data = _linear_case()
    quantized = prepared if rank == BAD else converted
    return _raised(lambda: compare(gm, quantized, data, progress=False, group=group))


def bad_batch_compare_scenario(rank: int, world: int, group) -> dict:
    gm, _, _, converted, data = _linear_case()
    mine = [torch.randn(4, 7)] if rank == BAD else data
    return _raised(lambda: compare(gm, converted, mine, progress=False, group=group))


def bad_batch_modules_scenario(rank: int, world: int, group) -> dict:
    """quant_nn compare: the bad rank's batch does not fit the first layer."""
    from qviz.engine.tensor.quant_modules import quantize_model

    float_model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    model = quantize_model(float_model)
    qviz.calibrate_quantizers(model, [torch.randn(4, 4)], progress=False, group=False)
    mine = [torch.randn(4, 7)] if rank == BAD else [torch.randn(4, 4)]
    return _raised(lambda: compare(float_model, model, mine, progress=False, group=group))


def bad_batch_sensitivity_scenario(rank: int, world: int, group) -> dict:
    from qviz.numeric import sensitivity

    gm, quantizer, _, _, data = _linear_case()
    mine = [torch.randn(4, 7)] if rank == BAD else data
    return _raised(lambda: sensitivity(gm, quantizer, mine, progress=False, group=group))


def other_call_scenario(rank: int, world: int, group) -> dict:
    """Rank 0 calibrates while the other ranks compare: a different call sequence."""
    gm, _, prepared, converted, data = _linear_case()
    if rank == 0:
        return _raised(lambda: qviz.calibrate(prepared, data, progress=False, group=group))
    return _raised(lambda: compare(gm, converted, data, progress=False, group=group))


# -- a rank that never joins an exchange: the ranks left waiting name it, in seconds ---------------
def _prepared_linear():
    data = [torch.randn(4, 4, generator=torch.Generator().manual_seed(0))]
    gm = qviz.export(nn.Linear(4, 3).eval(), (data[0],))
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    return qviz.prepare_pt2e(gm, quantizer), data


def alone_scenario(rank: int, world: int, group) -> dict:
    """Rank BAD calibrates alone (group=False) while the others calibrate with the group."""
    prepared, data = _prepared_linear()
    mine = False if rank == BAD else group
    return _raised(lambda: qviz.calibrate(prepared, data, progress=False, group=mine))


def twice_scenario(rank: int, world: int, group) -> dict:
    """Rank 0 calibrates twice with the group, the others once."""
    prepared, data = _prepared_linear()

    def calls() -> None:
        for _ in range(2 if rank == 0 else 1):
            qviz.calibrate(prepared, data, progress=False, group=group)

    return _raised(calls)


#: scenario -> (world size; the ranks that leave after it, as a rank whose script ends; what
#: the ranks left waiting must name)
LEAVES = {
    "alone": (3, [BAD], ["rank 1 (it made 0 exchange", "group=False"]),
    "twice": (2, [1], ["rank 1 (it made 1 exchange"]),
}


def leave_worker(rank: int, world: int, setup: tuple[str, int], outdir: str) -> None:
    """One rank of the LEAVES scenario ``setup = (name, port)``: its result saved to
    ``outdir/rank<r>.pt``; a leaving rank then exits (its sockets close, as when a script
    ends: the exchange of the ranks left waiting fails), the others destroy the process group
    once all of them are done (a file store is their barrier: rank 0 hosts the group's store,
    which the others read when their exchange fails)."""
    import torch.distributed as dist

    name, port = setup
    _, leaving, _ = LEAVES[name]
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    try:
        result = globals()[f"{name}_scenario"](rank, world, dist.group.WORLD)
    except Exception:
        result = {"crashed": traceback.format_exc()}
    torch.save({name: result}, os.path.join(outdir, f"rank{rank}.pt"))
    if rank in leaving:
        os._exit(0)  # a destroyed group may keep its sockets (torch.export holds it): exit
    done = dist.FileStore(os.path.join(outdir, "barrier"), world - len(leaving))
    done.add("done", 1)
    while done.add("done", 0) < world - len(leaving):
        time.sleep(0.05)
    dist.destroy_process_group()


#: scenario -> what every rank's message must name
FAILURES = {
    "bad_max_batches": ("rank 1", "max_batches"),
    "bad_method": ("rank 1", "maxx"),
    "bad_group": ("rank 1", "group=True"),
    "bad_mode": ("rank 1", "fallbak"),
    "bad_stage": ("rank 1", "quantized_model"),
    "bad_batch_compare": ("rank 1", "batch 0"),
    "bad_batch_modules": ("rank 1", "batch 0"),
    "bad_batch_sensitivity": ("rank 1", "batch 0"),
    "other_call": ("rank 0: calibrate", "rank 1: compare"),
}

SCENARIOS = {
    "histogram": histogram_scenario,
    "minmax": minmax_scenario,
    "order_free": order_free_scenario,
    "order_spread": order_spread_scenario,
    "moving_average": moving_average_scenario,
    "quantizers": quantizers_scenario,
    "compare": compare_scenario,
    "sensitivity": sensitivity_scenario,
    "precision": precision_scenario,
    "compare_modules": compare_modules_scenario,
    "qat": qat_scenario,
    "failure": failure_scenario,
    "mismatch": mismatch_scenario,
    **{name: globals()[f"{name}_scenario"] for name in FAILURES},
}


def worker(rank: int, world: int, port: int, outdir: str) -> None:
    """One rank: every scenario in turn, results saved to ``outdir/rank<r>.pt``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    results = {}
    try:
        for name, scenario in SCENARIOS.items():
            try:
                results[name] = scenario(
                    rank, world, None if name == "failure" else dist.group.WORLD
                )
            except Exception:  # keep going: the parent reports which scenario broke
                results[name] = {"crashed": traceback.format_exc()}
        torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
