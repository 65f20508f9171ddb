"""The numeric suite: measure what quantization does to tensors and layers.

pandas is imported only by the functions that return DataFrames.

Example:
    >>> import torch
    >>> from qviz.numeric import sqnr
    >>> sqnr(torch.ones(4), torch.ones(4))
    inf
"""

from qviz.numeric.calibration import (
    CalibrationChoice,
    calibration_choices,
    compare_calibrators,
    layer_tensors,
)
from qviz.numeric.metrics import clipped_fraction, sqnr

__all__ = [
    "CalibrationChoice",
    "calibration_choices",
    "clipped_fraction",
    "compare_calibrators",
    "layer_tensors",
    "sqnr",
]
