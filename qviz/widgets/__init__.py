"""Interactive front ends for Jupyter: see a model's graph, click it, steer its quantization.

Every widget holds its state as plain data and calls only public engine, viz and numeric
functions; each control has a Python equivalent, so notebooks and tests drive them without a
browser. The JavaScript ships inside qviz (no CDN, no network).

One folder per widget, each a ``state`` module (the widget: its state as plain data and the
methods every control calls, no ipywidgets) and a ``view`` module (the View that builds and owns
its ipywidgets): :mod:`~qviz.widgets.dashboard` (:class:`NumericDashboard`),
:mod:`~qviz.widgets.editor` (:class:`AnnotationEditor`), :mod:`~qviz.widgets.explorer`
(:class:`CalibrationExplorer`), :mod:`~qviz.widgets.precision` (:class:`PrecisionExplorer`) and
:mod:`~qviz.widgets.qat` (:class:`QATDashboard`). What they share is the
:mod:`~qviz.widgets.kit`: the :class:`GraphWidget` and its JavaScript, the graph pane, module
folding, the layout rules and the view-owner base. The imports point one way: a widget imports
the kit, never another widget; the kit imports no widget. Launchers (Voila) live in
:mod:`qviz.apps`.

Example:
    >>> import torch, qviz
    >>> from qviz.widgets import GraphWidget
    >>> w = GraphWidget.from_model(qviz.export(torch.nn.ReLU(), (torch.randn(2),)))
    >>> w.svg.startswith("<svg"), w.selected
    (True, '')
"""

from qviz.widgets.dashboard import NumericDashboard
from qviz.widgets.editor import AnnotationEditor
from qviz.widgets.explorer import CalibrationExplorer
from qviz.widgets.kit import GraphWidget
from qviz.widgets.precision import PrecisionExplorer
from qviz.widgets.qat import QATDashboard

__all__ = [
    "AnnotationEditor",
    "CalibrationExplorer",
    "GraphWidget",
    "NumericDashboard",
    "PrecisionExplorer",
    "QATDashboard",
]
