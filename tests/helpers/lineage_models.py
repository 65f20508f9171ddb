"""One small model at every stage, beside the same graph with other qparams (calibrated on
other data) and with other weights: what the lineage checks (house rule 14) tell apart."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
from torch import nn

import qviz
import qviz.numeric
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from tests.helpers.quantize import quantize


def small_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 5),
    ).eval()  # fmt: skip


def quantizer() -> XNNPACKQuantizer:
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config())


@functools.cache
def models() -> SimpleNamespace:
    """The model at every stage, its report, and the same graph with other qparams / weights."""
    torch.manual_seed(0)
    data = [torch.randn(4, 3, 8, 8) for _ in range(2)]
    other_data = [3 * torch.randn(4, 3, 8, 8)]
    net = small_net()
    with torch.no_grad():  # BatchNorm statistics that are not the identity
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
    gm = qviz.export(net, (data[0],), dynamic_batch=True)
    _, prepared, converted = quantize(gm, data, quantizer())
    _, recalibrated, other_qparams = quantize(gm, other_data, quantizer())  # another range
    other_gm = qviz.export(small_net(), (data[0],), dynamic_batch=True)  # other weights
    other_weights = quantize(other_gm, data, quantizer()).converted
    report = qviz.numeric.compare(gm, converted, data, progress=False)
    return SimpleNamespace(
        data=data, net=net, gm=gm, prepared=prepared, converted=converted,
        other_qparams=other_qparams, recalibrated=recalibrated, other_gm=other_gm,
        other_weights=other_weights, report=report,
    )  # fmt: skip


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s state, to check later that it is bitwise unchanged."""
    return {k: v.clone() for k, v in model.state_dict().items()}


def unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    after = model.state_dict()
    return after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
