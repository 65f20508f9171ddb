"""Views of the engine's records: graphs of a model at each stage, histograms of what observers
and calibrators saw with the range each method picks, every observer's range at a glance, a
self-contained HTML report of all of it, and the numeric suite's per-node values as Google Model
Explorer node data (:func:`to_model_explorer`).

Each view reads records (the QuantPlan, observers' and calibrators' statistics) and returns an
object that renders itself: a :class:`QGraph` (SVG in Jupyter) or a matplotlib Figure.
:func:`folded` shows a cell's output folded under a one-line summary (an exercise's solution).

Example:
    >>> import torch, qviz
    >>> from qviz.viz import graph, histogram
    >>> graph(qviz.export(torch.nn.ReLU(), (torch.randn(2),))).stage
    'float'
    >>> fig = histogram(torch.randn(10_000), methods=("max", "mse"))
    >>> [row["method"] for row in fig.qviz_rows]
    ['max', 'mse']
"""

from qviz.viz.capabilities import capabilities
from qviz.viz.folded import folded
from qviz.viz.graphs import QGraph, graph
from qviz.viz.histograms import histogram
from qviz.viz.history_plot import history_plot
from qviz.viz.html_report import report
from qviz.viz.model_explorer import to_model_explorer
from qviz.viz.range_view import ranges
from qviz.viz.tensor_plots import clipping_tradeoff_plot, per_channel_gain_plot, ste_plot

__all__ = [
    "QGraph",
    "capabilities",
    "clipping_tradeoff_plot",
    "folded",
    "graph",
    "histogram",
    "history_plot",
    "per_channel_gain_plot",
    "ranges",
    "report",
    "ste_plot",
    "to_model_explorer",
]
