"""The HTML report: one self-contained page with every view of a prepared or converted model.

:func:`report` (:mod:`~qviz.viz.report.html_report`) writes the page from the other views (the
graph of :mod:`qviz.viz.graph`, the ranges and histograms of :mod:`qviz.viz.ranges`) and the
model's records; :mod:`~qviz.viz.report.tables` writes its tables and
:mod:`~qviz.viz.report.guide` the words that explain them. The report is the one topic of
:mod:`qviz.viz` that imports the others; none imports it.

Example:
    >>> from qviz.viz.report import report
    >>> callable(report), report.__module__
    (True, 'qviz.viz.report.html_report')
"""

from qviz.viz.report.html_report import report

__all__ = ["report"]
