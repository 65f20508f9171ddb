"""QuantLinear: ``torch.nn.Linear`` with a fake-quantized input and weight.

Example:
    >>> import torch
    >>> layer = QuantLinear(4, 2)
    >>> layer(torch.randn(3, 4)).shape
    torch.Size([3, 2])
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from qviz.engine.tensor.descriptor import (
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    QUANT_DESC_8BIT_PER_TENSOR,
    QuantDescriptor,
)
from qviz.engine.tensor.quant_nn.mixin import QuantMixin


class QuantLinear(QuantMixin, nn.Linear):
    """``torch.nn.Linear`` whose input and weight pass through TensorQuantizers; bias stays float.

    Args:
        *args, **kwargs: those of ``torch.nn.Linear`` (``in_features``, ``out_features``,
            ``bias``, ``device``, ``dtype``).
        quant_desc_input: input descriptor; default per tensor, 8 bits.
        quant_desc_weight: weight descriptor; default one amax per output row, 8 bits.

    Example:
        >>> import torch
        >>> layer = QuantLinear(4, 2, bias=False)
        >>> layer.weight_quantizer.axis, layer.bias is None
        ((0,), True)
        >>> layer(torch.ones(1, 4)).shape
        torch.Size([1, 2])
    """

    default_quant_desc_input: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW
    _float_module = nn.Linear
    _init_args = ("in_features", "out_features")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(
            self._input_quantizer(input), self._weight_quantizer(self.weight), self.bias
        )
