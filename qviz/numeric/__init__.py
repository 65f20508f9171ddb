"""The numeric suite: measure what quantization does to tensors and layers.

:func:`compare` finds the operator that breaks a quantized model: for every quantized operator,
its own (local) error and the error it inherits (cumulative), in a :class:`NumericReport`;
:func:`diagnose` says why each poor layer loses accuracy and what to do about it,
:func:`sensitivity` ranks operators by what quantizing them costs, :func:`fallback` keeps the
culprit in float, :func:`compare_configs` shows each layer under several configs, and
:func:`search_precision` finds the cheapest per-layer precisions that meet an accuracy target.

One folder per topic, each holding its records, its computation and its own thin view (drawn
with :mod:`qviz.display`); the imports point one way: :mod:`~qviz.numeric.measure` <-
:mod:`~qviz.numeric.compare` <- {:mod:`~qviz.numeric.variants`, :mod:`~qviz.numeric.lowering`,
:mod:`~qviz.numeric.diagnose`} <- {:mod:`~qviz.numeric.repair`, :mod:`~qviz.numeric.precision`};
:mod:`~qviz.numeric.qat` builds on measure and compare only. pandas is imported only by the
functions that return DataFrames.

Example:
    >>> import torch
    >>> from qviz.numeric import sqnr
    >>> sqnr(torch.ones(4), torch.ones(4))
    inf
"""

from qviz.numeric.compare import (
    CalibrationChoice,
    LayerDetail,
    NumericReport,
    calibration_choices,
    compare,
    compare_calibrators,
    compare_each,
    layer_detail,
    layer_tensors,
)
from qviz.numeric.diagnose import (
    Cause,
    Diagnosis,
    Finding,
    Prescription,
    RemedyEstimate,
    diagnose,
)
from qviz.numeric.lowering import (
    BisectionResult,
    LoweringComparison,
    bisect_lowering,
    compare_lowered,
)
from qviz.numeric.measure import clipped_fraction, sqnr
from qviz.numeric.precision import PrecisionResult, search_precision
from qviz.numeric.qat import QATMonitor, QATRecord
from qviz.numeric.repair import RepairSession, RepairStep
from qviz.numeric.variants import compare_configs, fallback, sensitivity

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
    "compare_each",
    "compare_lowered",
    "diagnose",
    "fallback",
    "layer_detail",
    "layer_tensors",
    "search_precision",
    "sensitivity",
    "sqnr",
]
