"""Repair transforms for a quantized model's numerics: equalization, bias correction,
SmoothQuant, learned rounding.

Each transform works on a copy and records what it did with
``qviz.engine.pt2e.record_transform`` (shown by ``prepared.plan``).

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer
    >>> from qviz.engine.repair import cross_layer_equalization
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> gm = qviz.export(model.eval(), (torch.randn(3, 4),))
    >>> prepared = qviz.prepare_pt2e(cross_layer_equalization(gm), XNNPACKQuantizer())
    >>> [r.kind for r in prepared.plan.transforms]
    ['cross_layer_equalization']
"""

from qviz.engine.repair.adaround import adaround
from qviz.engine.repair.bias_correction import bias_correction
from qviz.engine.repair.equalization import cross_layer_equalization
from qviz.engine.repair.smoothquant import smooth_quant, smoothing_factors

__all__ = [
    "adaround",
    "bias_correction",
    "cross_layer_equalization",
    "smooth_quant",
    "smoothing_factors",
]
