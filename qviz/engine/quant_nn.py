"""Seed 004's import path: ``qviz.engine.quant_nn`` is :mod:`qviz.engine.tensor.quant_nn` (the
quantized drop-in layers (QuantConv2d, QuantLinear, ...)).

A tutorial written for NVIDIA's pytorch-quantization ports by changing its imports to this path.
"""

from qviz.engine._moved import alias

alias(__name__, "qviz.engine.tensor.quant_nn")
