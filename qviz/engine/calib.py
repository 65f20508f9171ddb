"""Seed 004's import path: ``qviz.engine.calib`` is :mod:`qviz.engine.tensor.calib` (MaxCalibrator,
HistogramCalibrator).

A tutorial written for NVIDIA's pytorch-quantization ports by changing its imports to this path.
"""

from qviz.engine._moved import alias

alias(__name__, "qviz.engine.tensor.calib")
