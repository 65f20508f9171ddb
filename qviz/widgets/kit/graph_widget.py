"""``GraphWidget``: a model's graph in the notebook, clickable, searchable, with pan and zoom.

The drawing is :func:`qviz.viz.graph`'s SVG, rendered by Graphviz in Python; the widget's
JavaScript (``static/graph_widget.js``, shipped inside qviz, no CDN and no build step) only
places it, pans and zooms it, and reports clicks back through synced traits:

* ``selected``: the name of the node last clicked, ``"producer -> consumer"`` for an edge (an
  arrow into or out of an observer marker names the graph's edge it draws, see
  :func:`edge_refs`), or the first plan tensor an observer marker stands for (``"conv2d"``,
  ``"conv2d -> cat"``);
* ``module_click``: ``{"path": "layer1", "n": 3}`` for a click on a collapsed module box or on
  a module cluster's label or border; ``n`` counts clicks, so the same module twice fires twice;
* ``search``: the text of the search box; matching nodes are outlined and the first centred.

The widget never redraws itself: its owner observes ``module_click`` and calls :meth:`show`.

Legible by default. Every view the widget chooses by itself keeps the drawing's text readable:
the scale is never below the one at which the smallest text of the drawing is 10 CSS pixels
high (and the typical label 11), whatever the size of the graph. The first view fits the
graph to the pane's width at most 1.5 times its drawn size; "reset" shows the whole graph when
it fits at a legible scale, and otherwise the legible scale with the graph's top in view: pan
(drag) and scroll (the wheel zooms) for the rest. Only the user's own zooming goes smaller.
The pane's height follows the browser window (:data:`~qviz.widgets.kit.layout.PANE_HEIGHT`).

Not cropped at the sides where the cell has room. The legend is not part of the drawing the
pane fits: the "legend" button shows it over the pane. A graph wider than its pane at the
legible scale widens the pane when it opens, as far as the panel beside it keeps
:attr:`panel_width` pixels (past that, it opens centred on its main chain).

Example:
    >>> w = GraphWidget()
    >>> w.show('<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"></svg>').svg
    '<svg xmlns="http://www.w3.org/2000/svg"></svg>'
    >>> w.selected, w.module_click, w.search
    ('', {'path': '', 'n': 0}, '')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

from qviz.errors import ConfigError
from qviz.viz.graph.graphs import QGraph, graph
from qviz.viz.graph.inline_svg import strip_prolog
from qviz.widgets.kit.layout import PANE_HEIGHT

_STATIC = Path(__file__).parent / "static"


def _drawing(svg: str) -> str:
    """The ``<svg>`` element of what :meth:`GraphWidget.show` was given, or a ConfigError."""
    try:
        return strip_prolog(svg)
    except ConfigError as err:
        raise ConfigError(
            f"GraphWidget.show: expected an SVG document or a QGraph, got text starting "
            f"{svg[:40]!r}; pass qviz.viz.graph(model) or its .svg()"
        ) from err


def marker_refs(qgraph: QGraph) -> dict[str, list[str]]:
    """``{marker name: the plan tensors it observes}`` for each observer marker drawn, and
    ``{reference box: the edges it names}`` for each box standing for long edges.

    Example:
        >>> import torch, qviz
        >>> marker_refs(graph(qviz.export(torch.nn.ReLU(), (torch.randn(2),))))
        {}
    """
    kinds = ("marker", "ref")
    return {n.name: list(n.refs) for n in qgraph.view.nodes if n.kind in kinds and n.refs}


#: Boxes an edge passes through on its way from producer to consumer (not graph nodes).
_THROUGH = ("marker",)
#: Boxes that stand for something other than one graph node: no plan edge starts or ends there.
_NOT_NODES = ("marker", "ref", "collapsed")


def _walk(start: str, step: dict[str, list[str]], kinds: dict[str, str]) -> list[str]:
    """The graph nodes reached from ``start`` by following ``step`` through observer markers."""
    found: list[str] = []
    todo, seen = [start], set()
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if kinds.get(name) in _THROUGH:
            todo.extend(step.get(name, []))
        else:
            found.append(name)
    return found


def edge_refs(qgraph: QGraph) -> dict[str, str]:
    """``{drawn edge "a->b": the plan tensor a click on it selects}`` for each arrow that
    starts or ends at an observer marker.

    An observed drawing splits the graph's edge ``conv2d_2 -> add`` into ``conv2d_2 ->
    obs/conv2d_2`` and ``obs/conv2d_2 -> add``: a click on either piece selects
    ``"conv2d_2 -> add"``. When the marker's producer feeds several consumers, a click on the
    arrow into the marker selects the producer's output (``"relu"``), as a click on the marker
    does. Arrows between two graph nodes keep their own name.

    Example:
        >>> from qviz.viz.graph.graph_records import GraphView, ViewEdge, ViewNode
        >>> view = GraphView(stage="observed", nodes=(ViewNode(name="a", kind="op", label="a"),
        ...     ViewNode(name="obs/a", kind="marker", label="g0"), ViewNode(name="b", kind="op",
        ...     label="b")),
        ...     edges=(ViewEdge("a", "obs/a"), ViewEdge("obs/a", "b")))
        >>> edge_refs(QGraph(view, None))
        {'a->obs/a': 'a -> b', 'obs/a->b': 'a -> b'}
    """
    kinds = {n.name: n.kind for n in qgraph.view.nodes}
    forward: dict[str, list[str]] = {}
    backward: dict[str, list[str]] = {}
    for e in qgraph.view.edges:
        forward.setdefault(e.src, []).append(e.dst)
        backward.setdefault(e.dst, []).append(e.src)
    refs: dict[str, str] = {}
    for e in qgraph.view.edges:
        if kinds.get(e.src) not in _THROUGH and kinds.get(e.dst) not in _THROUGH:
            continue
        producers = _walk(e.src, backward, kinds)
        consumers = _walk(e.dst, forward, kinds)
        if len(producers) != 1 or kinds.get(producers[0]) in _NOT_NODES:
            continue
        real = [c for c in consumers if kinds.get(c) not in _NOT_NODES]
        if len(consumers) == 1 and real:
            refs[f"{e.src}->{e.dst}"] = f"{producers[0]} -> {real[0]}"
        elif consumers:
            refs[f"{e.src}->{e.dst}"] = producers[0]
    return refs


class GraphWidget(anywidget.AnyWidget):  # type: ignore[misc]
    """A Graphviz SVG of a model with selection, module clicks, search, pan and zoom.

    Attributes:
        svg: the drawing (an ``<svg>`` element, prolog stripped); set it with :meth:`show`.
        selected: the node name, ``"producer -> consumer"`` edge or marker tensor last
            clicked; setting it from Python outlines and centres that element.
        module_click: ``{"path": module path, "n": click count}``, set by the browser.
        search: the search box's text; setting it from Python searches too.
        height: the CSS height of the drawing's viewport (``"600px"``; by default
            :data:`~qviz.widgets.kit.layout.PANE_HEIGHT`, which follows the browser window).

    In the browser: click a node, edge, marker or module; drag to pan; the mouse wheel (or
    the + / − buttons) zooms about the pointer, "reset" shows the whole graph if it fits at a
    legible scale (text at least 10 px), else the top of the graph at that scale; Enter in the
    search box moves to the next match.

    Example:
        >>> w = GraphWidget(selected="conv2d", search="relu")
        >>> w.selected, w.search, w.height
        ('conv2d', 'relu', 'clamp(360px, 62vh, 960px)')
        >>> seen = []
        >>> _ = w.observe(lambda change: seen.append(change["new"]["path"]), "module_click")
        >>> w.module_click = {"path": "layer1", "n": 1}
        >>> w.module_click = {"path": "layer1", "n": 2}   # the same module again still fires
        >>> seen
        ['layer1', 'layer1']
    """

    _esm = _STATIC / "graph_widget.js"
    _css = _STATIC / "graph_widget.css"

    svg = traitlets.Unicode("").tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    module_click = traitlets.Dict({"path": "", "n": 0}).tag(sync=True)
    search = traitlets.Unicode("").tag(sync=True)
    height = traitlets.Unicode(PANE_HEIGHT).tag(sync=True)
    #: The width (CSS px) the panel beside the pane needs (:func:`~qviz.widgets.kit.layout.split`
    #: sets it); 0: the pane has no neighbour to make room for.
    panel_width = traitlets.Int(0).tag(sync=True)
    #: ``{marker name: [plan tensors]}``: what a click on an observer marker selects.
    _marker_refs = traitlets.Dict({}).tag(sync=True)
    #: ``{drawn edge "a->b": plan tensor}``: what a click on an arrow through a marker selects.
    _edge_refs = traitlets.Dict({}).tag(sync=True)

    def show(self, drawing: QGraph | str) -> GraphWidget:
        """Draw ``drawing`` (a :class:`~qviz.viz.QGraph` or an SVG string); returns ``self``.

        Raises:
            ConfigError: ``drawing`` is neither a QGraph nor SVG text.
            MissingDependencyError: a QGraph cannot be rendered (no ``dot`` program).

        Example:
            >>> GraphWidget().show("<svg><g/></svg>").svg
            '<svg><g/></svg>'
        """
        if isinstance(drawing, QGraph):
            svg, refs, edges = drawing.svg(), marker_refs(drawing), edge_refs(drawing)
        elif isinstance(drawing, str):
            svg, refs, edges = drawing, {}, {}
        else:
            raise ConfigError(
                f"GraphWidget.show draws a QGraph or an SVG string, got "
                f"{type(drawing).__name__}: pass qviz.viz.graph(model)"
            )
        with self.hold_sync():
            self._marker_refs = refs
            self._edge_refs = edges
            self.svg = _drawing(svg)
        return self

    @classmethod
    def from_model(cls, model: Any, **graph_kwargs: Any) -> GraphWidget:
        """A widget drawing ``qviz.viz.graph(model, **graph_kwargs)`` (e.g. ``collapse=1``).

        Example:
            >>> import shutil, torch, qviz
            >>> gm = qviz.export(torch.nn.ReLU(), (torch.randn(2),))
            >>> w = GraphWidget.from_model(gm) if shutil.which("dot") else GraphWidget()
            >>> w.svg.startswith("<svg") or not shutil.which("dot")
            True
        """
        return cls().show(graph(model, **graph_kwargs))
