"""Time qviz's graph rendering side by side with torch.fx's own drawer (FxGraphDrawer).

Run from the repository root (about a minute)::

    .venv/bin/python benchmarks/viz.py [resnet18 resnet50]

For each torchvision model (random weights; rendering does not depend on them), prepared with
qviz's XNNPACK quantizer (per-channel weights) and calibrated on 2 batches: the time to turn the
observed graph into SVG with ``qviz.viz.graph(prepared).svg()`` (records read from the plan, DOT
built, Graphviz ``dot`` layout), with ``collapse=2``, the converted graph, and the HTML report;
and the same observed graph drawn by ``torch.fx.passes.graph_drawer.FxGraphDrawer`` (pydot and
the same ``dot`` binary), the tool PyTorch users reach for. Best of 3 after a warm-up. Target:
resnet50's observed graph to SVG in <= 2 s.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torchvision
from torch.fx.passes.graph_drawer import FxGraphDrawer

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.viz import graph, report

TARGET_S = 2.0


def best(fn: Callable[[], object], repeat: int = 3) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def models(name: str) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)().eval()
    batches = [torch.randn(2, 3, 224, 224) for _ in range(2)]
    gm = qviz.export(model, (batches[0],))
    config = get_symmetric_quantization_config(is_per_channel=True)
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    qviz.calibrate(prepared, batches, progress=False)
    return prepared, qviz.convert_pt2e(prepared)


def main(names: list[str]) -> None:
    torch.set_num_threads(2)
    print(f"{'model':10s} {'what':34s} {'qviz s':>8s} {'fx s':>8s} {'ratio':>6s}")
    for name in names:
        prepared, converted = models(name)
        ours = best(lambda p=prepared: graph(p).svg())
        fx = best(lambda p=prepared, n=name: FxGraphDrawer(p, n).get_dot_graph().create_svg())
        nodes = len(graph(prepared))
        what = f"observed graph -> SVG ({nodes} nodes)"
        print(f"{name:10s} {what:34s} {ours:8.3f} {fx:8.3f} {ours / fx:6.2f}")
        collapsed = best(lambda p=prepared: graph(p, collapse=2).svg())
        print(f"{'':10s} {'observed, collapse=2 -> SVG':34s} {collapsed:8.3f}")
        conv = best(lambda c=converted: graph(c).svg())
        print(f"{'':10s} {'converted graph -> SVG':34s} {conv:8.3f}")
        with tempfile.TemporaryDirectory() as tmp:
            page = Path(tmp) / "r.html"
            rep = best(lambda p=prepared, out=page: report(p, out), repeat=1)
            size = page.stat().st_size / 1024
        print(f"{'':10s} {f'HTML report ({size:.0f} KiB)':34s} {rep:8.3f}")
        verdict = "meets" if ours <= TARGET_S else "MISSES"
        print(f"{'':10s} target: observed graph <= {TARGET_S} s: {verdict}\n")


if __name__ == "__main__":
    main(sys.argv[1:] or ["resnet18", "resnet50"])
