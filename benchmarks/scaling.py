"""Does the PT2E flow grow linearly with the graph? prepare / calibrate / convert / compare timed
on transformer encoders of three depths.

Run from the repository root (about a minute)::

    .venv/bin/python benchmarks/scaling.py [6 12 24]

Each depth is an ``nn.TransformerEncoder`` (d_model 64, 4 heads, feed-forward 128, batch_first,
sequence 16, batch 2), exported, prepared with qviz's XNNPACK quantizer (per-channel weights),
calibrated on 4 batches, converted, and compared (``qviz.numeric.compare``) on 2 batches; each
step best of 3, on 1 thread (the models are tiny: two threads on a busy 2-core machine spent
99 % of a forward pass waiting for each other, 1.5 s instead of 12 ms). Printed per step: the
exported graph's node count per depth, the times, the slope of a least-squares line (seconds
per 1,000 nodes) and the ratio of time per node between the deepest and the shallowest model:
about 1 means linear, 2 or more means the step grows faster than the graph (a quadratic loop
doubles it from 6 to 24 layers).

Measured (2-core machine shared with other jobs, torch 2.14.1): nodes 285 / 567 / 1,131;
prepare 0.064 / 0.136 / 0.274 s (0.25 s per 1,000 nodes, ratio 1.08), calibrate 0.054 / 0.120 /
0.313 s (0.31, 1.45; 0.058 -> 0.221 s, ratio 0.95, in a quieter run), convert 0.164 / 0.341 /
0.738 s (0.68, 1.13), compare 0.065 / 0.122 / 0.263 s (0.24, 1.03): all linear.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from _machine import set_threads, timed
from torch import nn

import qviz
import qviz.numeric
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

#: Time per node at the deepest over the shallowest depth above which a step is flagged.
SUPERLINEAR = 1.5
STEPS = ("prepare", "calibrate", "convert", "compare")


def transformer(layers: int) -> nn.Module:
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()


def best(fn: Callable[[], object], repeat: int = 3) -> float:
    return min(timed(fn)[1] for _ in range(repeat))


def times_at(layers: int) -> tuple[int, dict[str, float]]:
    torch.manual_seed(0)
    batches = [torch.randn(2, 16, 64) for _ in range(4)]
    gm = qviz.export(transformer(layers), (batches[0],))
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    prepared = qviz.prepare_pt2e(gm, quantizer)

    def calibrated() -> torch.fx.GraphModule:
        model = qviz.prepare_pt2e(gm, quantizer)
        qviz.calibrate(model, batches, progress=False)
        return model

    ready = calibrated()
    converted = qviz.convert_pt2e(calibrated())
    out = {
        "prepare": best(lambda: qviz.prepare_pt2e(gm, quantizer)),
        "calibrate": best(lambda: qviz.calibrate(prepared, batches, progress=False)),
        "convert": best(lambda: qviz.convert_pt2e(ready)),
        "compare": best(lambda: qviz.numeric.compare(gm, converted, batches[:2], progress=False)),
    }
    return len(gm.graph.nodes), out


def slope(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def main(depths: list[int]) -> None:
    set_threads(1)
    rows = [times_at(d) for d in depths]
    nodes = [n for n, _ in rows]
    print(f"{'layers':>10s} " + " ".join(f"{d:>9d}" for d in depths))
    print(f"{'nodes':>10s} " + " ".join(f"{n:>9d}" for n in nodes))
    print(f"\n{'step':10s} " + " ".join(f"{'s @' + str(d):>9s}" for d in depths), end="")
    print(f" {'s/1k nodes':>11s} {'per-node ratio':>15s}")
    for step in STEPS:
        ys = [t[step] for _, t in rows]
        ratio = (ys[-1] / nodes[-1]) / (ys[0] / nodes[0])
        verdict = "linear" if ratio <= SUPERLINEAR else "SUPERLINEAR"
        cells = " ".join(f"{y:9.3f}" for y in ys)
        print(f"{step:10s} {cells} {1000 * slope(nodes, ys):11.3f} {ratio:9.2f}  {verdict}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [6, 12, 24])
