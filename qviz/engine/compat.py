"""The one place qviz touches PyTorch's private or registration-only APIs (DESIGN rule 7).

Example:
    >>> ops = quantized_decomposed()
    >>> ops.quantize_per_tensor.default.__name__
    'quantize_per_tensor.default'
"""

from __future__ import annotations

import importlib

import torch

__all__ = ["OpOverload", "OpOverloadPacket", "quantized_decomposed"]

#: Types of ATen operators (``torch.ops.aten.add.Tensor`` and ``torch.ops.aten.add``).
OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


def quantized_decomposed():
    """``torch.ops.quantized_decomposed``, with its ops registered (importing a torch module does
    that as a side effect; done here, on first use, rather than when qviz is imported)."""
    importlib.import_module("torch.ao.quantization.fx._decomposed")
    return torch.ops.quantized_decomposed
