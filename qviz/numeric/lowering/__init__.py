"""Float -> reference -> real kernels: what lowering a converted model changes, and where.

:func:`compare_lowered` (:mod:`~qviz.numeric.lowering.lowered`) measures the reference model and
its lowered program against the float model; :func:`bisect_lowering`
(:mod:`~qviz.numeric.lowering.bisect`) finds the first operator whose kernel departs from the
reference.

Example:
    >>> from qviz.numeric.lowering import BisectionResult, LoweringComparison
    >>> BisectionResult.__name__, LoweringComparison.__name__
    ('BisectionResult', 'LoweringComparison')
"""

from qviz.numeric.lowering.bisect import BisectionResult, bisect_lowering
from qviz.numeric.lowering.lowered import LoweringComparison, compare_lowered

__all__ = ["BisectionResult", "LoweringComparison", "bisect_lowering", "compare_lowered"]
