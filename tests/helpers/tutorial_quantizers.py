"""The specs, the function-driven quantizer and the conv-conv-cat model of the tutorial "How to
Write a Quantizer for PyTorch 2 Export Quantization"."""

import torch
from torch import nn

from qviz.engine.observers import HistogramObserver, MinMaxObserver
from qviz.engine.quantizers.base import Quantizer
from qviz.engine.specs import QuantizationSpec

ACT = QuantizationSpec(
    dtype=torch.int8,
    quant_min=-128,
    quant_max=127,
    qscheme=torch.per_tensor_affine,
    is_dynamic=False,
    observer_or_fake_quant_ctr=HistogramObserver.with_args(eps=2**-12),
)


WEIGHT = QuantizationSpec(
    dtype=torch.int8,
    quant_min=-127,
    quant_max=127,
    qscheme=torch.per_tensor_symmetric,
    ch_axis=0,
    is_dynamic=False,
    observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12),
)


class Annotate(Quantizer):
    """A quantizer whose annotate() is a function of the graph (the tutorial's snippets)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def annotate(self, model):
        for node in model.graph.nodes:
            self.fn(node)
        return model

    def validate(self, model) -> None:
        return None


class TwoConvCat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 3, 1), nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return torch.cat([self.conv1(x), self.conv2(x)], 1)
