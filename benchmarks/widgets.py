"""Kernel-side time per widget interaction (what a click costs before the browser redraws).

Run from the repository root (about a minute)::

    .venv/bin/python benchmarks/widgets.py

On the embedded digits model: AnnotationEditor select, edit + apply (re-annotate, re-plan,
re-render the graph) and undo; CalibrationExplorer observer switch, method switch, percentile
slider move, bit-width change and "use this range"; NumericDashboard select and fallback toggle
(when available). On torchvision resnet18: the editor's edit + apply, whose target is <= 1.5 s.
Each figure is the median of 5 runs after a warm-up, 2 threads. The reference is the widgets'
own budget (the issue's: every calibration interaction <= 200 ms on the digits model), printed
as the ratio figure / budget.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import torchvision
from _machine import set_threads, timed

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.widgets import AnnotationEditor, CalibrationExplorer, NumericDashboard

RUNS = 5


def median_ms(fn: Callable[[int], object]) -> float:
    fn(-1)  # warm-up
    times = [timed(lambda i=i: fn(i))[1] for i in range(RUNS)]
    return 1e3 * statistics.median(times)


def row(model: str, what: str, ms: float, budget_ms: float) -> None:
    verdict = "ok" if ms <= budget_ms else "OVER"
    print(f"{model:9s} {what:44s} {ms:9.1f} {budget_ms:8.0f} {ms / budget_ms:6.2f}  {verdict}")


def digits() -> None:
    calib = [x for x, _ in digits_loaders(batch_size=90).calibration]
    gm = qviz.export(digits_model(), (calib[0],), dynamic_batch=True)
    editor = AnnotationEditor(gm)
    nodes = ["relu", "add", "relu_2 -> max_pool2d", "conv2d_3", "linear"]
    row("digits", "editor: select a node", median_ms(lambda i: editor.select(nodes[i % 5])), 200)
    dtypes = ["uint8", "int8"]
    row(
        "digits",
        "editor: edit + apply (re-plan, re-render)",
        median_ms(lambda i: _edited(editor, "relu", dtypes[i % 2])),
        1500,
    )
    row("digits", "editor: undo", median_ms(lambda i: editor.undo()), 1500)
    config = get_symmetric_quantization_config(is_per_channel=True, switchable=True)
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    qviz.calibrate(prepared, calib, progress=False)
    ex = CalibrationExplorer(prepared)
    obs = ex.observers
    row("digits", "explorer: switch observer", median_ms(lambda i: ex.select(obs[i % 8])), 200)
    methods = ["max", "entropy", "mse", "percentile", "l2"]
    row(
        "digits", "explorer: switch method", median_ms(lambda i: ex.set(method=methods[i % 5])), 200
    )
    ex.set(method="percentile")
    row(
        "digits",
        "explorer: move the percentile slider",
        median_ms(lambda i: ex.set(percentile=99.9 + 0.001 * (i + 2))),
        200,
    )
    row("digits", "explorer: change num_bits", median_ms(lambda i: ex.set(num_bits=4 + i % 4)), 200)
    ex.set(num_bits=8)
    row("digits", "explorer: use this range", median_ms(lambda i: ex.use_range()), 200)
    dashboard(gm, calib)


def dashboard(gm: torch.fx.GraphModule, calib: list[torch.Tensor]) -> None:
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = qviz.calibrate(qviz.prepare_pt2e(gm, quantizer), calib, progress=False)
    test = list(digits_loaders(batch_size=90).test)
    dash = NumericDashboard.from_models(
        gm, qviz.convert_pt2e(prepared), test, quantizer=quantizer, progress=False
    )
    layers = [r["node"] for r in dash.rows][:5]
    row(
        "digits",
        "dashboard: select a layer (detail figure)",
        median_ms(lambda i: dash.select(layers[i % 5])),
        1500,
    )
    worst = dash.sort("local_sqnr").rows[0]["node"]
    dash.select(worst)

    def toggle_fresh(_: int) -> None:
        dash._runs.pop((worst,), None)  # the dashboard keeps runs: time a fresh one
        dash.toggle_fallback(worst)  # on: prepare, calibrate, convert, compare again
        dash.toggle_fallback(worst)  # off: the first run, kept

    row("digits", "dashboard: fallback toggle on (re-run) + off", median_ms(toggle_fresh), 5000)


def resnet18() -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    gm = qviz.export(model, (torch.randn(1, 3, 224, 224),))
    editor = AnnotationEditor(gm)
    target = next(g.owner.producer for g in editor.plan.groups if g.owner.consumer is None)
    dtypes = ["uint8", "int8"]
    row(
        "resnet18",
        f"editor: edit + apply ({target}, collapsed view)",
        median_ms(lambda i: _edited(editor, target, dtypes[i % 2])),
        1500,
    )
    editor.collapsed = []  # every operator drawn
    row(
        "resnet18",
        f"editor: edit + apply ({target}, expanded view)",
        median_ms(lambda i: _edited(editor, target, dtypes[i % 2])),
        1500,
    )


def _edited(editor: AnnotationEditor, name: str, dtype: str) -> None:
    editor.edit(name, dtype=dtype)
    if editor.error is not None:  # a refused edit would be timed as a fast no-op
        raise RuntimeError(editor.error)


def main() -> None:
    set_threads(2)
    print(f"{'model':9s} {'interaction':44s} {'ms':>9s} {'budget':>8s} {'ratio':>6s}")
    digits()
    resnet18()


if __name__ == "__main__":
    main()
