"""Graphs of a model at its stage: records read from the graph, drawn by Graphviz, shown inline.

:func:`graph` (:mod:`~qviz.viz.graph.graphs`) draws a model into a :class:`QGraph`. The drawing is
made in steps, one module each: :mod:`~qviz.viz.graph.read_graph` reads a model at its stage into
the records of :mod:`~qviz.viz.graph.graph_records` (a quant_nn model through
:mod:`~qviz.viz.graph.quantizer_view`); :mod:`~qviz.viz.graph.hierarchy` collapses modules,
:mod:`~qviz.viz.graph.long_edges` folds the edges too costly to route; :mod:`~qviz.viz.graph.dot`
turns the records into DOT text and :mod:`~qviz.viz.graph.inline_svg` fits the SVG into a notebook
output. Nothing here imports :mod:`qviz.viz.ranges` or :mod:`qviz.viz.report`.

Example:
    >>> import torch, qviz
    >>> from qviz.viz.graph import QGraph, graph
    >>> g = graph(qviz.export(torch.nn.ReLU(), (torch.randn(2),)))
    >>> isinstance(g, QGraph), g.stage
    (True, 'float')
"""

from qviz.viz.graph.graphs import QGraph, graph

__all__ = ["QGraph", "graph"]
