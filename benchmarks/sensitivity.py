"""``qviz.numeric.sensitivity`` with one calibration (observer statistics reused) against a
calibration pass per variant: the same figures, bit for bit, and the time each takes.

Run from the repository root (a few minutes)::

    .venv/bin/python benchmarks/sensitivity.py [--repeat 2]

Models: the embedded digits model (its calibration split, 2 test batches of 64 scored with
accuracy), torchvision resnet18 with random weights at 3x64x64 (4 batches of 8 calibrate, 2
score), and a 2-layer transformer encoder (d_model 64, 16 tokens; 4 batches of 8 calibrate, 2
score). XNNPACKQuantizer, per-channel int8 weights, its default HistogramObserver activations;
``mode="fallback"`` (every operator kept in float in turn).

Both ways run alternately, ``--repeat`` times each; the best wall time is printed with the
ratio, the share of variants that took copies instead of a calibration pass, and whether the
two DataFrames are equal exactly. The CPU and its int8 flags are printed first.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch
from _machine import cpu, set_threads, timed

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.pt2e.observer_reuse import ObserverReuse
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.numeric import sensitivity


def _digits() -> tuple[Any, list, list, Callable]:
    loaders = digits_loaders(batch_size=64)
    calib, test = list(loaders.calibration), list(loaders.test)[:2]
    gm = qviz.export(digits_model().eval(), (calib[0][0],), dynamic_batch=True)

    def accuracy(float_out, quant_out, target):
        return float((quant_out.argmax(1) == target).float().mean())

    return gm, calib, test, accuracy


def _resnet18() -> tuple[Any, list, list, None]:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(8, 3, 64, 64, generator=g) for _ in range(4)]
    test = [torch.randn(8, 3, 64, 64, generator=g) for _ in range(2)]
    return qviz.export(model, (calib[0],), dynamic_batch=True), calib, test, None


def _encoder() -> tuple[Any, list, list, None]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(8, 16, 64, generator=g) for _ in range(4)]
    test = [torch.randn(8, 16, 64, generator=g) for _ in range(2)]
    return qviz.export(model, (calib[0],), dynamic_batch=True), calib, test, None


def _run(gm, calib, test, metric, reuse: bool) -> tuple[Any, float, list[bool]]:
    filled: list[bool] = []
    original = ObserverReuse.fill

    def fill(self, variant):
        filled.append(original(self, variant) if reuse else False)
        return filled[-1]

    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    ObserverReuse.fill = fill  # type: ignore[method-assign]
    try:
        df, seconds = timed(
            lambda: sensitivity(gm, q, test, metric=metric, calibration_data=calib, progress=False)
        )
        return df, seconds, filled
    finally:
        ObserverReuse.fill = original  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    set_threads(2)
    print(f"CPU: {cpu()}; torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(f"{'model':<10}{'variants':>9}{'copied':>8}{'every pass s':>14}{'once s':>9}"
          f"{'ratio':>7}  bitwise")  # fmt: skip
    for name, build in (("digits", _digits), ("resnet18", _resnet18), ("encoder", _encoder)):
        gm, calib, test, metric = build()
        best = {True: float("inf"), False: float("inf")}
        frames: dict[bool, Any] = {}
        copied = 0
        for _ in range(args.repeat):
            for reuse in (False, True):  # alternately: other load slows both alike
                df, seconds, filled = _run(gm, calib, test, metric, reuse)
                best[reuse], frames[reuse] = min(best[reuse], seconds), df
                copied = sum(filled) if reuse else copied
        same = frames[True].attrs == frames[False].attrs
        try:
            pd.testing.assert_frame_equal(frames[True], frames[False], check_exact=True)
        except AssertionError:
            same = False
        print(f"{name:<10}{len(filled):>9}{copied:>8}{best[False]:>14.2f}{best[True]:>9.2f}"
              f"{best[False] / best[True]:>6.2f}x  {same}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
