"""Seed 004's import path: ``qviz.engine.tensor_quant`` is :mod:`qviz.engine.tensor.tensor_quant`
(tensor_quant, fake_tensor_quant, QuantDescriptor, TensorQuantizer).

A tutorial written for NVIDIA's pytorch-quantization ports by changing its imports to this path.
"""

from qviz.engine._moved import alias

alias(__name__, "qviz.engine.tensor.tensor_quant")
