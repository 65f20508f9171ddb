"""Compare a quantized model with its float model, operator by operator.

:func:`~qviz.numeric.compare.compare.compare` (pt2e graphs) and
:func:`~qviz.numeric.compare.modules.compare_modules` (quant_nn modules) measure every quantized
operator's own and inherited error into a :class:`~qviz.numeric.compare.report.NumericReport`
(the float and quantized runs it makes per batch: :mod:`~qviz.numeric.compare.runs`);
:mod:`~qviz.numeric.compare.detail` looks inside one layer, :mod:`~qviz.numeric.compare.calibration`
compares calibrators on it. The report's notebook view is :mod:`~qviz.numeric.compare.view`, its
plots :mod:`~qviz.numeric.compare.plots`. Builds on :mod:`qviz.numeric.measure` only.

Example:
    >>> from qviz.numeric.compare import NumericReport, compare
    >>> callable(compare), NumericReport.__name__
    (True, 'NumericReport')
"""

from qviz.numeric.compare.calibration import (
    CalibrationChoice,
    calibration_choices,
    compare_calibrators,
    layer_tensors,
)

# last, after every submodule has loaded: the name ``compare`` is the function, not the module
from qviz.numeric.compare.compare import compare, compare_each
from qviz.numeric.compare.detail import LayerDetail, layer_detail
from qviz.numeric.compare.report import NumericReport

__all__ = [
    "CalibrationChoice",
    "LayerDetail",
    "NumericReport",
    "calibration_choices",
    "compare",
    "compare_calibrators",
    "compare_each",
    "layer_detail",
    "layer_tensors",
]
