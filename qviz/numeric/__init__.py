"""The numeric suite: measure what quantization does to tensors and layers.

:func:`compare` finds the operator that breaks a quantized model: for every quantized operator,
its own (local) error and the error it inherits (cumulative), in a :class:`NumericReport`;
:func:`diagnose` says why each poor layer loses accuracy and what to do about it,
:func:`sensitivity` ranks operators by what quantizing them costs, :func:`fallback` keeps the
culprit in float, :func:`compare_configs` shows each layer under several configs, and
:func:`search_precision` finds the cheapest per-layer precisions that meet an accuracy target.

pandas is imported only by the functions that return DataFrames.

Example:
    >>> import torch
    >>> from qviz.numeric import sqnr
    >>> sqnr(torch.ones(4), torch.ones(4))
    inf
"""

from qviz.numeric.bisect import BisectionResult, bisect_lowering
from qviz.numeric.calibration import (
    CalibrationChoice,
    calibration_choices,
    compare_calibrators,
    layer_tensors,
)
from qviz.numeric.compare import compare
from qviz.numeric.detail import LayerDetail, layer_detail
from qviz.numeric.diagnose import Cause, Diagnosis, Finding, Prescription, diagnose
from qviz.numeric.diagnose_gain import RemedyEstimate
from qviz.numeric.lowered import LoweringComparison, compare_lowered
from qviz.numeric.metrics import clipped_fraction, sqnr
from qviz.numeric.precision import search_precision
from qviz.numeric.precision_result import PrecisionResult
from qviz.numeric.qat_monitor import QATMonitor, QATRecord
from qviz.numeric.repair_session import RepairSession, RepairStep
from qviz.numeric.report import NumericReport
from qviz.numeric.sensitivity import compare_configs, fallback, sensitivity

__all__ = [
    "BisectionResult",
    "CalibrationChoice",
    "Cause",
    "Diagnosis",
    "Finding",
    "LayerDetail",
    "LoweringComparison",
    "NumericReport",
    "PrecisionResult",
    "Prescription",
    "QATMonitor",
    "QATRecord",
    "RemedyEstimate",
    "RepairSession",
    "RepairStep",
    "bisect_lowering",
    "calibration_choices",
    "clipped_fraction",
    "compare",
    "compare_calibrators",
    "compare_configs",
    "compare_lowered",
    "diagnose",
    "fallback",
    "layer_detail",
    "layer_tensors",
    "search_precision",
    "sensitivity",
    "sqnr",
]
