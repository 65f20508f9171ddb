"""Calibrators: watch tensors, then pick a clipping threshold (amax) for them.

``MaxCalibrator`` keeps the running max of |x|; ``HistogramCalibrator`` keeps an exact histogram
of |x| and computes amax by ``"max"``, ``"percentile"``, ``"entropy"`` (TensorRT's KL search) or
``"mse"``. They are the single implementation of each method: the graph observers reuse them.

Example:
    >>> import torch
    >>> from qviz.engine.tensor.calib import HistogramCalibrator
    >>> calib = HistogramCalibrator(8)
    >>> calib.collect(torch.linspace(-1, 1, 1001))
    >>> float(calib.compute_amax("max"))
    1.0
"""

from qviz.engine.tensor.calib.base import CalibMethod, Calibrator
from qviz.engine.tensor.calib.histogram_calibrator import HistogramCalibrator
from qviz.engine.tensor.calib.max_calibrator import MaxCalibrator

__all__ = ["CalibMethod", "Calibrator", "HistogramCalibrator", "MaxCalibrator"]
