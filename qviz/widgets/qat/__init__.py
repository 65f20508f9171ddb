"""The QAT dashboard: watch quantization-aware training live, from inside the training loop.

:class:`QATDashboard` (:mod:`~qviz.widgets.qat.state`) redraws from a
:class:`~qviz.numeric.QATMonitor`'s records, throttled; its ipywidgets belong to
:class:`~qviz.widgets.qat.view.QATDashboardView` (:mod:`~qviz.widgets.qat.view`).

Example:
    >>> from qviz.widgets.qat import QATDashboard
    >>> QATDashboard.__name__
    'QATDashboard'
"""

from qviz.widgets.qat.state import QATDashboard

__all__ = ["QATDashboard"]
