"""Quantized drop-in layers: NVIDIA pytorch-quantization's ``quant_nn`` on qviz's quantizers.

Every layer subclasses its ``torch.nn`` parent, takes the same constructor arguments plus
keyword-only ``quant_desc_input=`` (and ``quant_desc_weight=`` for weighted layers), holds
``_input_quantizer`` (and ``_weight_quantizer``) :class:`TensorQuantizer` submodules, loads the
float layer's ``state_dict`` unchanged, and is built from a float layer with
``from_float(layer)``. The short names (``quant_nn.Conv2d``) are the source document's aliases;
``QUANT_MODULES`` maps each ``torch.nn`` class to its quantized class, read-only. A foreign
linear layer with an ``[in, out]`` weight (transformers' ``Conv1D``) gets its quantized class
from ``quant_transposed_linear(Conv1D)``.

Calibration, as in the source document: put every quantizer in calibration mode, run data,
load the amax, quantize.

Example:
    >>> import torch
    >>> from qviz.engine import quant_nn
    >>> model = torch.nn.Sequential(quant_nn.Conv2d(1, 2, 3), quant_nn.MaxPool2d(2))
    >>> quantizers = [m for n, m in model.named_modules() if n.endswith("_quantizer")]
    >>> for q in quantizers:
    ...     q.disable_quant(); q.enable_calib()
    >>> _ = model(torch.randn(2, 1, 8, 8))
    >>> for q in quantizers:
    ...     q.load_calib_amax(); q.disable_calib(); q.enable_quant()
    >>> model[0].weight_quantizer.amax.shape
    torch.Size([2, 1, 1, 1])
    >>> QUANT_MODULES[torch.nn.Conv2d] is quant_nn.QuantConv2d
    True
"""

from __future__ import annotations

from types import MappingProxyType

from torch import nn

from qviz.engine.tensor.descriptor import QuantDescriptor
from qviz.engine.tensor.quant_nn.conv import (
    QuantConv1d,
    QuantConv2d,
    QuantConv3d,
    QuantConvTranspose1d,
    QuantConvTranspose2d,
    QuantConvTranspose3d,
)
from qviz.engine.tensor.quant_nn.linear import QuantLinear
from qviz.engine.tensor.quant_nn.mixin import QuantInputMixin, QuantMixin
from qviz.engine.tensor.quant_nn.pooling import (
    QuantAdaptiveAvgPool1d,
    QuantAdaptiveAvgPool2d,
    QuantAdaptiveAvgPool3d,
    QuantAvgPool1d,
    QuantAvgPool2d,
    QuantAvgPool3d,
    QuantMaxPool1d,
    QuantMaxPool2d,
    QuantMaxPool3d,
)
from qviz.engine.tensor.quant_nn.rnn import QuantLSTM
from qviz.engine.tensor.quant_nn.transposed_linear import (
    QuantTransposedLinearMixin,
    quant_transposed_linear,
)
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer

__all__ = [
    "LSTM",
    "QUANT_MODULES",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "Linear",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "QuantAdaptiveAvgPool1d",
    "QuantAdaptiveAvgPool2d",
    "QuantAdaptiveAvgPool3d",
    "QuantAvgPool1d",
    "QuantAvgPool2d",
    "QuantAvgPool3d",
    "QuantConv1d",
    "QuantConv2d",
    "QuantConv3d",
    "QuantConvTranspose1d",
    "QuantConvTranspose2d",
    "QuantConvTranspose3d",
    "QuantDescriptor",
    "QuantInputMixin",
    "QuantLSTM",
    "QuantLinear",
    "QuantMaxPool1d",
    "QuantMaxPool2d",
    "QuantMaxPool3d",
    "QuantMixin",
    "QuantTransposedLinearMixin",
    "TensorQuantizer",
    "quant_transposed_linear",
]

# the source document's short names
Linear = QuantLinear
Conv1d = QuantConv1d
Conv2d = QuantConv2d
Conv3d = QuantConv3d
ConvTranspose1d = QuantConvTranspose1d
ConvTranspose2d = QuantConvTranspose2d
ConvTranspose3d = QuantConvTranspose3d
MaxPool1d = QuantMaxPool1d
MaxPool2d = QuantMaxPool2d
MaxPool3d = QuantMaxPool3d
AvgPool1d = QuantAvgPool1d
AvgPool2d = QuantAvgPool2d
AvgPool3d = QuantAvgPool3d
AdaptiveAvgPool1d = QuantAdaptiveAvgPool1d
AdaptiveAvgPool2d = QuantAdaptiveAvgPool2d
AdaptiveAvgPool3d = QuantAdaptiveAvgPool3d
LSTM = QuantLSTM

_QUANTIZED: tuple[type[QuantInputMixin], ...] = (
    QuantLinear,
    QuantConv1d,
    QuantConv2d,
    QuantConv3d,
    QuantConvTranspose1d,
    QuantConvTranspose2d,
    QuantConvTranspose3d,
    QuantMaxPool1d,
    QuantMaxPool2d,
    QuantMaxPool3d,
    QuantAvgPool1d,
    QuantAvgPool2d,
    QuantAvgPool3d,
    QuantAdaptiveAvgPool1d,
    QuantAdaptiveAvgPool2d,
    QuantAdaptiveAvgPool3d,
    QuantLSTM,
)

#: ``torch.nn`` class -> its quantized class (``nn.Conv2d -> QuantConv2d``), read-only.
QUANT_MODULES: MappingProxyType[type[nn.Module], type[QuantInputMixin]] = MappingProxyType(
    {cls._float_module: cls for cls in _QUANTIZED}
)
