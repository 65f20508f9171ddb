"""The precision explorer: pick a mixed-precision assignment from the trade-off the search found.

:class:`PrecisionExplorer` (:mod:`~qviz.widgets.precision.state`) holds the selection; the
clickable Pareto plot (:class:`~qviz.widgets.precision.view.ParetoWidget`, its JavaScript and CSS
in ``static/``) and the other ipywidgets belong to
:class:`~qviz.widgets.precision.view.PrecisionExplorerView` (:mod:`~qviz.widgets.precision.view`).

Example:
    >>> from qviz.widgets.precision import PrecisionExplorer
    >>> PrecisionExplorer.__name__
    'PrecisionExplorer'
"""

from qviz.widgets.precision.state import PrecisionExplorer

__all__ = ["PrecisionExplorer"]
