"""Seed 004's import path: ``qviz.engine.quant_modules`` is :mod:`qviz.engine.tensor.quant_modules`
(initialize / deactivate).

A tutorial written for NVIDIA's pytorch-quantization ports by changing its imports to this path.
"""

from qviz.engine._moved import alias

alias(__name__, "qviz.engine.tensor.quant_modules")
