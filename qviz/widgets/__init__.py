"""Interactive front ends for Jupyter: see a model's graph, click it, steer its quantization.

Every widget holds its state as plain data and calls only public engine, viz and numeric
functions; each control has a Python equivalent, so notebooks and tests drive them without a
browser. The JavaScript ships inside qviz (no CDN, no network).

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
from qviz.widgets.graph_widget import GraphWidget
from qviz.widgets.precision_explorer import PrecisionExplorer
from qviz.widgets.qat_dashboard import QATDashboard

__all__ = [
    "AnnotationEditor",
    "CalibrationExplorer",
    "GraphWidget",
    "NumericDashboard",
    "PrecisionExplorer",
    "QATDashboard",
]
