"""Calibrate on 1 process and on 2 (torch.distributed, gloo on CPU) over the same batches.

Run from the repository root (about a minute)::

    .venv/bin/python benchmarks/distributed_calibration.py [resnet18]

The model (torchvision, random weights, eval mode; batch 8 of 3x64x64, ``BATCHES`` batches)
is prepared with qviz's XNNPACK quantizer (per-channel weights, HistogramObserver activations
that also keep |x| histograms). One process calibrates on all the batches; then 2 processes
(``torch.multiprocessing``, one thread each, as the 2 cores here allow) calibrate half each and
merge. Printed: wall time of each (calibration and merge; process start-up and imports not
counted), the merge's share, and whether every observer's qparams, for every method, are
bit-identical to one process's. Every rank's first batch is the anchor (the whole data), so
torch's histogram range never grows after it: the case in which the merge must be exact.
Little speed-up is expected on 2 cores; the point is the identical answer, and the same code
runs on NCCL.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile

import torch
import torch.multiprocessing as mp
from _machine import Stopwatch, set_threads, timed

import qviz
from qviz.engine.distributed import merge_observers
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

BATCHES = int(os.environ.get("QVIZ_BENCH_BATCHES", "8"))
METHODS = ("l2", "max", "percentile", "entropy", "mse")


def _model(name: str):
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None).eval()


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(8, 3, 64, 64, generator=g) for _ in range(BATCHES)]


def _prepared(name: str):
    batches = _batches()
    gm = qviz.export(_model(name), (batches[0],), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True, switchable=True)
    return qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config)), batches


def _qparams(prepared) -> dict:
    from qviz.engine.observers import HistogramObserver

    out = {}
    for name, module in prepared.named_modules():
        if isinstance(module, HistogramObserver):
            out[name] = [[t.tolist() for t in module.calculate_qparams(method=m)] for m in METHODS]
        elif hasattr(module, "calculate_qparams") and getattr(module, "num_batches", 0):
            out[name] = [t.tolist() for t in module.calculate_qparams()]
    return out


def _rank(rank: int, world: int, port: int, name: str, outdir: str) -> None:
    import datetime

    import torch.distributed as dist

    set_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    prepared, batches = _prepared(name)
    anchor = torch.cat(batches)
    mine = [anchor, *batches[rank::world]]
    dist.barrier()
    with Stopwatch() as watch:
        qviz.calibrate(prepared, mine, progress=False, group=False)  # this rank's shard alone
        local = watch.elapsed
        merge_observers(prepared, batches=len(mine))
    total = watch.seconds
    torch.save({"qparams": _qparams(prepared), "local": local, "total": total},
               os.path.join(outdir, f"rank{rank}.pt"))  # fmt: skip
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(name: str) -> None:
    set_threads(1)
    prepared, batches = _prepared(name)
    anchor = torch.cat(batches)
    _, single = timed(lambda: qviz.calibrate(prepared, [anchor, anchor, *batches], progress=False))
    reference = _qparams(prepared)
    with tempfile.TemporaryDirectory() as outdir:
        mp.spawn(_rank, args=(2, _free_port(), name, outdir), nprocs=2, join=True)
        ranks = [torch.load(os.path.join(outdir, f"rank{r}.pt")) for r in range(2)]
    wall = max(r["total"] for r in ranks)
    merge = max(r["total"] - r["local"] for r in ranks)
    same = all(r["qparams"] == reference for r in ranks)
    print(f"torch {torch.__version__}, {name}, {BATCHES} batches of 8x3x64x64 + anchor, 1 thread")
    print(f"  1 process   calibrate {single:7.2f} s")
    print(f"  2 processes calibrate + merge {wall:7.2f} s  (merge {merge:.2f} s, "
          f"{100 * merge / wall:.0f} %)   speed-up {single / wall:.2f}x")  # fmt: skip
    print(f"  qviz observers: {len(reference)}; qparams of every method bit-identical: {same}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "resnet18")
