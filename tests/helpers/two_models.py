"""Two converted models whose operator names coincide, each with its numeric report: ``small``
(``linear``) and ``large`` (``linear``, ``relu``). Every row of ``small``'s report names an
operator ``large`` has too, so only the report's fingerprint tells them apart (house rule 14)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
from torch import nn

import qviz.numeric
from tests.helpers.quantize import quantize


def _measured(model: nn.Module, x: torch.Tensor) -> SimpleNamespace:
    gm, prepared, quantized = quantize(model, x, per_channel=False, dynamic_batch=True)
    report = qviz.numeric.compare(gm, quantized, [x], progress=False)
    return SimpleNamespace(float=gm, prepared=prepared, quantized=quantized, report=report, x=x)


@functools.cache
def two_models() -> SimpleNamespace:
    """``.small`` and ``.large``, each with ``.float``, ``.prepared``, ``.quantized``,
    ``.report`` and ``.x``."""
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    small = _measured(nn.Sequential(nn.Linear(4, 3)), x)
    large = _measured(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), x)
    return SimpleNamespace(small=small, large=large)
