"""Views of the engine's records: graphs of a model at each stage, histograms of what observers
and calibrators saw with the range each method picks, every observer's range at a glance, a
self-contained HTML report of all of it, and the numeric suite's per-node values as Google Model
Explorer node data (:func:`to_model_explorer`).

Each view reads records (the QuantPlan, observers' and calibrators' statistics) and returns an
object that renders itself: a :class:`QGraph` (SVG in Jupyter) or a matplotlib Figure.
:func:`folded` shows a cell's output folded under a one-line summary (an exercise's solution).

One folder per view that takes several modules, the imports pointing one way:
{:mod:`~qviz.viz.graph`, :mod:`~qviz.viz.ranges`} <- :mod:`~qviz.viz.report`. The graph and
the ranges never import each other; the report draws both. The views of one module each
(:mod:`~qviz.viz.capabilities`, :mod:`~qviz.viz.folded`, :mod:`~qviz.viz.history_plot`,
:mod:`~qviz.viz.model_explorer`) sit beside them and import no other view. The names ``graph``,
``ranges`` and ``report`` here are the functions, not their folders.

Example:
    >>> import torch, qviz
    >>> from qviz.viz import graph, histogram
    >>> graph(qviz.export(torch.nn.ReLU(), (torch.randn(2),))).stage
    'float'
    >>> fig = histogram(torch.randn(10_000), methods=("max", "mse"))
    >>> [row["method"] for row in fig.qviz_rows]
    ['max', 'mse']
"""

# Each topic's function is bound after its folder has loaded: ``qviz.viz.graph``, ``.ranges`` and
# ``.report`` are the functions (the folders stay importable by their dotted paths).
from qviz.viz.capabilities import capabilities
from qviz.viz.folded import folded
from qviz.viz.graph import QGraph, graph
from qviz.viz.history_plot import history_plot
from qviz.viz.model_explorer import to_model_explorer
from qviz.viz.ranges import (
    clipping_tradeoff_plot,
    histogram,
    per_channel_gain_plot,
    ranges,
    ste_plot,
)
from qviz.viz.report import report

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
