"""Compare calibration methods on the weights and activations of a model.

For every Conv/Linear layer, the activation entering it (captured with forward pre-hooks on one
batch) and its weight are calibrated per tensor with each method; each choice is scored by the
SQNR of fake-quantizing that same tensor with it and by the share of values it clips.

Example:
    >>> import torch
    >>> from qviz.data import digits_model, digits_loaders
    >>> images, _ = next(iter(digits_loaders().calibration))
    >>> df = compare_calibrators(digits_model(), images)
    >>> sorted(df["method"].unique())
    ['entropy', 'max', 'mse', 'percentile']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from qviz.engine.graph.inputs import bind_batch, call_model
from qviz.engine.graph.stage import Stage, check_stage
from qviz.engine.qparams import symmetric_scale
from qviz.engine.tensor.calib import CalibMethod, HistogramCalibrator, MaxCalibrator
from qviz.engine.tensor.tensor_quant import fake_tensor_quant
from qviz.numeric.measure.metrics import clipped_fraction, sqnr


@dataclass(frozen=True, kw_only=True)
class CalibrationChoice:
    """One calibration method's choice for one tensor, and what it costs."""

    tensor: str
    kind: str  # "input" or "weight"
    method: str
    amax: float
    scale: float  # PyTorch convention: amax / quant_max
    clipped: float  # share of elements beyond the last level's rounding boundary
    sqnr_db: float


def layer_tensors(model: nn.Module, inputs: Any) -> list[tuple[str, str, torch.Tensor]]:
    """``(name, kind, tensor)`` for the input and weight of every Conv/Linear, in call order.

    The float model (the one stage it takes, checked first) runs once on ``inputs`` (one batch,
    as for :func:`qviz.calibrate`) under ``no_grad``; it is not modified.
    """
    check_stage(model, Stage.FLOAT, where="layer_tensors")
    bound = bind_batch(model, inputs, "layer_tensors: inputs")
    captured: list[tuple[str, str, torch.Tensor]] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(module: nn.Module, args: tuple) -> None:
        name = names[module]
        captured.append((f"{name}.input", "input", args[0].detach().clone()))
        captured.append((f"{name}.weight", "weight", module.weight.detach().clone()))

    handles = [
        m.register_forward_pre_hook(hook)
        for m in model.modules()
        if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d | nn.Linear)
    ]
    try:
        with torch.no_grad():
            call_model(model, bound, "layer_tensors: inputs")
    finally:
        for h in handles:
            h.remove()
    return captured


def calibration_choices(
    name: str,
    kind: str,
    tensor: torch.Tensor,
    methods: Sequence[CalibMethod | str] = tuple(CalibMethod),
    *,
    num_bits: int = 8,
    percentile: float = 99.99,
) -> list[CalibrationChoice]:
    """Each method's per-tensor amax for ``tensor``, scored by SQNR and clipped share."""
    hist = HistogramCalibrator(num_bits, name=name)
    hist.collect(tensor)
    maxc = MaxCalibrator(num_bits, name=name)
    maxc.collect(tensor)
    rows = []
    for method in (CalibMethod.parse(m) for m in methods):
        if method is CalibMethod.MAX:
            amax = maxc.compute_amax()
        elif method is CalibMethod.PERCENTILE:
            amax = hist.compute_amax(method, percentile=percentile)
        else:
            amax = hist.compute_amax(method)
        fq = fake_tensor_quant(tensor, amax, num_bits)
        rows.append(
            CalibrationChoice(
                tensor=name,
                kind=kind,
                method=method.value,
                amax=float(amax),
                scale=float(symmetric_scale(float(amax), num_bits=num_bits)),
                clipped=clipped_fraction(tensor, amax, num_bits=num_bits),
                sqnr_db=sqnr(tensor, fq),
            )
        )
    return rows


def compare_calibrators(
    model: nn.Module,
    inputs: Any,
    methods: Sequence[CalibMethod | str] = tuple(CalibMethod),
    *,
    num_bits: int = 8,
    percentile: float = 99.99,
):
    """A pandas DataFrame: one row per (tensor, method) with amax, scale, clipped share and SQNR.

    ``model`` is the float model (checked first); ``inputs`` one batch. ``best`` marks the
    method with the highest SQNR for each tensor.
    """
    import pandas as pd

    rows = [
        asdict(choice)
        for name, kind, tensor in layer_tensors(model, inputs)
        for choice in calibration_choices(
            name, kind, tensor, methods, num_bits=num_bits, percentile=percentile
        )
    ]
    df = pd.DataFrame(rows)
    df["best"] = df["sqnr_db"] == df.groupby("tensor", sort=False)["sqnr_db"].transform("max")
    return df
