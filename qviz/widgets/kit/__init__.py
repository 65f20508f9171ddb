"""What every widget shares: the graph pane, module folding, the layout rules, the view owner.

:class:`GraphWidget` (:mod:`~qviz.widgets.kit.graph_widget`, its JavaScript and CSS in
``static/``) shows a model's graph, clickable, searchable, with pan and zoom;
:mod:`~qviz.widgets.kit.graph_panel` wires its clicks to a widget's methods and redraws it with
its big modules folded (:mod:`~qviz.widgets.kit.folding`); :mod:`~qviz.widgets.kit.layout` puts
a graph pane beside a panel that stays inside the notebook cell, and shows figures at a legible
size; :class:`~qviz.widgets.kit.view_owner.ViewOwner` is the base of every widget whose
ipywidgets belong to its view. The kit imports no widget folder.

Example:
    >>> from qviz.widgets.kit import GraphWidget
    >>> GraphWidget().show('<svg xmlns="http://www.w3.org/2000/svg"></svg>').selected
    ''
"""

from qviz.widgets.kit.graph_widget import GraphWidget

__all__ = ["GraphWidget"]
