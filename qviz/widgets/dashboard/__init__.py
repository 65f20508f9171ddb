"""The numeric dashboard: the per-layer table beside the heatmap graph, details, fallbacks and
a repair session's remedies.

:class:`NumericDashboard` (:mod:`~qviz.widgets.dashboard.state`) holds the state; its table's
columns, order and runs are :mod:`~qviz.widgets.dashboard.table`, the repair session's remedies
and diagnosis :mod:`~qviz.widgets.dashboard.repair`, and its ipywidgets belong to
:class:`~qviz.widgets.dashboard.view.DashboardView` (:mod:`~qviz.widgets.dashboard.view`).

Example:
    >>> from qviz.numeric import NumericReport
    >>> from qviz.widgets.dashboard import NumericDashboard
    >>> r = NumericReport.from_table([{"node": "a", "local_sqnr": 4.0}], output_sqnr=4.0)
    >>> NumericDashboard(r).state.selected
    'a'
"""

from qviz.widgets.dashboard.state import NumericDashboard

__all__ = ["NumericDashboard"]
