"""Repair a quantized model step by step: the session, its remedies and its view.

:class:`RepairSession` (:mod:`~qviz.numeric.repair.session`) applies remedies
(:mod:`~qviz.numeric.repair.remedies`) one at a time and re-measures;
:mod:`~qviz.numeric.repair.view` draws its steps.

Example:
    >>> from qviz.numeric.repair import RepairSession, RepairStep
    >>> RepairSession.__name__, RepairStep.__name__
    ('RepairSession', 'RepairStep')
"""

from qviz.numeric.repair.session import RepairSession, RepairStep

__all__ = ["RepairSession", "RepairStep"]
