"""Mixed precision: the cheapest per-layer precisions that meet an accuracy target.

:func:`search_precision` (:mod:`~qviz.numeric.precision.precision`) searches over the units
(:mod:`~qviz.numeric.precision.units`), their costs (:mod:`~qviz.numeric.precision.cost`) and the
Pareto front (:mod:`~qviz.numeric.precision.front`) into a :class:`PrecisionResult`
(:mod:`~qviz.numeric.precision.result`), drawn by :mod:`~qviz.numeric.precision.plot`.

Example:
    >>> from qviz.numeric.precision import PrecisionResult, search_precision
    >>> callable(search_precision), PrecisionResult.__name__
    (True, 'PrecisionResult')
"""

from qviz.numeric.precision.precision import search_precision
from qviz.numeric.precision.result import PrecisionResult

__all__ = ["PrecisionResult", "search_precision"]
