"""``GraphWidget``: a model's graph in the notebook, clickable, searchable, with pan and zoom.

The drawing is :func:`qviz.viz.graph`'s SVG, rendered by Graphviz in Python; the widget's
JavaScript (``static/graph_widget.js``, shipped inside qviz, no CDN and no build step) only
places it, pans and zooms it, and reports clicks back through synced traits:

* ``selected``: the name of the node last clicked, ``"producer -> consumer"`` for an edge, or
  the first plan tensor an observer marker stands for (``"conv2d"``, ``"conv2d -> cat"``);
* ``module_click``: ``{"path": "layer1", "n": 3}`` for a click on a collapsed module box or on
  a module cluster's label or border; ``n`` counts clicks, so the same module twice fires twice;
* ``search``: the text of the search box; matching nodes are outlined and the first centred.

The widget never redraws itself: its owner observes ``module_click`` and calls :meth:`show`.

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
from qviz.viz.graphs import QGraph, graph

_STATIC = Path(__file__).parent / "static"


def strip_prolog(svg: str) -> str:
    """``svg`` from its ``<svg`` tag on: no XML declaration, doctype or leading comments.

    Raises:
        ConfigError: ``svg`` has no ``<svg`` element.

    Example:
        >>> strip_prolog('<?xml version="1.0"?>\\n<!DOCTYPE svg>\\n<!-- dot -->\\n<svg/>')
        '<svg/>'
    """
    start = svg.find("<svg")
    if start < 0:
        raise ConfigError(
            f"GraphWidget.show: expected an SVG document or a QGraph, got text starting "
            f"{svg[:40]!r}; pass qviz.viz.graph(model) or its .svg()"
        )
    return svg[start:].strip()


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


class GraphWidget(anywidget.AnyWidget):  # type: ignore[misc]
    """A Graphviz SVG of a model with selection, module clicks, search, pan and zoom.

    Attributes:
        svg: the drawing (an ``<svg>`` element, prolog stripped); set it with :meth:`show`.
        selected: the node name, ``"producer -> consumer"`` edge or marker tensor last
            clicked; setting it from Python outlines and centres that element.
        module_click: ``{"path": module path, "n": click count}``, set by the browser.
        search: the search box's text; setting it from Python searches too.
        height: the CSS height of the drawing's viewport (e.g. ``"480px"``).

    In the browser: click a node, edge, marker or module; drag to pan; the mouse wheel (or
    the + / − buttons) zooms about the pointer, "reset" fits the whole graph; Enter in the
    search box moves to the next match.

    Example:
        >>> w = GraphWidget(selected="conv2d", search="relu")
        >>> w.selected, w.search, w.height
        ('conv2d', 'relu', '480px')
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
    height = traitlets.Unicode("480px").tag(sync=True)
    #: ``{marker name: [plan tensors]}``: what a click on an observer marker selects.
    _marker_refs = traitlets.Dict({}).tag(sync=True)

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
            svg, refs = drawing.svg(), marker_refs(drawing)
        elif isinstance(drawing, str):
            svg, refs = drawing, {}
        else:
            raise ConfigError(
                f"GraphWidget.show draws a QGraph or an SVG string, got "
                f"{type(drawing).__name__}: pass qviz.viz.graph(model)"
            )
        with self.hold_sync():
            self._marker_refs = refs
            self.svg = strip_prolog(svg)
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
