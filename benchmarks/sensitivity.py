"""``qviz.numeric.sensitivity`` against what it cannot go below, and against a calibration
pass per variant.

Run from the repository root (a few minutes)::

    .venv/bin/python benchmarks/sensitivity.py [--repeat 2]

Models: the embedded digits model (its calibration split, 2 test batches of 64 scored with
accuracy), torchvision resnet18 and mobilenet_v2 with random weights at 3x64x64 (4 batches of
8 calibrate, 2 score), and a 2-layer transformer encoder (d_model 64, 16 tokens; 4 batches of 8
calibrate, 2 score). XNNPACKQuantizer, per-channel int8 weights, its default HistogramObserver
activations; ``mode="fallback"`` (every operator kept in float in turn).

Printed per model, best of ``--repeat`` runs:

* ``once s``: sensitivity as shipped (one calibration; an observer that sees what one of the
  fully quantized model's saw takes a copy of its statistics: ``copied`` variants took copies
  only, ``partly`` ones copies and one pass seen only by their other observers; scores run each
  converted variant's exact simulation);
* ``budget s``: one calibration pass of the fully quantized model over the calibration data
  plus one *float* forward over the scoring data per variant, and ``ratio`` (``once`` over
  it) against the target of 1.5x;
* ``every pass s``: the same with a calibration pass per variant, and whether its DataFrame
  equals ``once``'s exactly (the copies are what calibration gives, bit for bit).

The CPU and its int8 flags are printed first.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch
from _machine import cpu, set_threads, timed
from _models import encoder

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.pt2e.observer_reuse import Filling, ObserverReuse
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.numeric import sensitivity


def _digits() -> tuple[Any, list, list, Callable]:
    loaders = digits_loaders(batch_size=64)
    calib, test = list(loaders.calibration), list(loaders.test)[:2]
    gm = qviz.export(digits_model().eval(), (calib[0][0],), dynamic_batch=True)

    def accuracy(float_out, quant_out, target):
        return float((quant_out.argmax(1) == target).float().mean())

    return gm, calib, test, accuracy


def _torchvision(name: str) -> tuple[Any, list, list, None]:
    """torchvision's ``name`` with random weights, 4 calibration and 2 scoring batches."""
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)().eval()
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)]
    test = [torch.randn(8, 3, 64, 64, generator=g) for _ in range(2)]
    return qviz.export(model, (calib[0],), dynamic_batch=True), calib, test, None


def _encoder() -> tuple[Any, list, list, None]:
    model, batches = encoder(n_batches=6)  # the same generator: 4 to calibrate, 2 to score
    calib, test = batches[:4], batches[4:]
    return qviz.export(model, (calib[0],), dynamic_batch=True), calib, test, None


def _run(gm, calib, test, metric, reuse: bool) -> tuple[Any, float, list[Filling]]:
    fillings: list[Filling] = []
    original = ObserverReuse.fill_known

    def fill_known(self, variant):
        everything = Filling(copied=(), left=tuple(variant.plan.observer_names()))
        fillings.append(original(self, variant) if reuse else everything)
        return fillings[-1]

    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    ObserverReuse.fill_known = fill_known  # type: ignore[method-assign]
    try:
        df, seconds = timed(
            lambda: sensitivity(gm, q, test, metric=metric, calibration_data=calib, progress=False)
        )
        return df, seconds, fillings
    finally:
        ObserverReuse.fill_known = original  # type: ignore[method-assign]


def _budget(gm, calib, test, variants: int) -> float:
    """One calibration pass of the fully quantized model plus ``variants`` float forwards over
    the scoring data: the least sensitivity can cost."""
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = qviz.prepare_pt2e(gm, q)
    inputs = [b[0] if isinstance(b, (tuple, list)) else b for b in test]
    calibrate = timed(lambda: qviz.calibrate(prepared, calib, progress=False))[1]
    with torch.no_grad():
        forward = min(timed(lambda: [gm(x) for x in inputs])[1] for _ in range(3))
    return calibrate + variants * forward


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    set_threads(2)
    print(f"CPU: {cpu()}; torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(f"{'model':<13}{'variants':>9}{'copied':>8}{'partly':>8}{'once s':>8}{'budget s':>10}"
          f"{'ratio':>7}{'target':>8}{'every pass s':>14}  bitwise")  # fmt: skip
    models = (("digits", _digits), ("resnet18", lambda: _torchvision("resnet18")),
              ("mobilenet_v2", lambda: _torchvision("mobilenet_v2")),
              ("encoder", _encoder))  # fmt: skip
    for name, build in models:
        gm, calib, test, metric = build()
        best = {True: float("inf"), False: float("inf")}
        frames: dict[bool, Any] = {}
        copied = partly = 0
        for _ in range(args.repeat):
            for reuse in (False, True):  # alternately: other load slows both alike
                df, seconds, filled = _run(gm, calib, test, metric, reuse)
                best[reuse], frames[reuse] = min(best[reuse], seconds), df
                if reuse:
                    copied = sum(not f.left for f in filled)
                    partly = sum(bool(f.copied and f.left) for f in filled)
        same = frames[True].attrs == frames[False].attrs
        try:
            pd.testing.assert_frame_equal(frames[True], frames[False], check_exact=True)
        except AssertionError:
            same = False
        budget = min(_budget(gm, calib, test, len(filled)) for _ in range(args.repeat))
        print(f"{name:<13}{len(filled):>9}{copied:>8}{partly:>8}{best[True]:>8.2f}{budget:>10.2f}"
              f"{best[True] / budget:>6.2f}x{1.5:>7.2f}x{best[False]:>14.2f}  {same}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
