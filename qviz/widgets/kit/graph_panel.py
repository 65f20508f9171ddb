"""The graph pane the widgets share: a GraphWidget whose clicks call the widget's Python methods.

:func:`linked_graph` wires a :class:`~qviz.widgets.kit.graph_widget.GraphWidget` to two callbacks: a
click on a node or an edge calls ``on_select(name)``, a click on a module box or cluster calls
``on_module(path)``. :class:`FoldedGraph` is that pane for one model drawn with its big modules
folded (:class:`~qviz.widgets.kit.folding.Folding`): a module click expands or collapses it and
redraws with the same drawing options; a drawing qviz refuses (no ``dot`` program) shows its
message in the pane, so the rest of the widget keeps working.

Example:
    >>> import torch, qviz
    >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()).eval(),
    ...                  (torch.randn(1, 2),))
    >>> picked = []
    >>> pane = FoldedGraph(on_select=picked.append)
    >>> pane.draw(gm).widget.svg.startswith("<svg")
    True
    >>> pane.widget.selected = "relu"   # a click on a node
    >>> pane.select("linear")           # set from Python: no callback
    >>> picked, pane.widget.selected
    (['relu'], 'linear')
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from torch.fx import GraphModule

from qviz.errors import QvizError
from qviz.widgets.kit.folding import Folding
from qviz.widgets.kit.graph_widget import GraphWidget


def linked_graph(
    on_select: Callable[[str], Any],
    on_module: Callable[[str], Any],
    *,
    modules_select: bool = False,
) -> GraphWidget:
    """A GraphWidget whose node / edge clicks call ``on_select(name)`` and module clicks
    ``on_module(path)``.

    Args:
        on_select: called with a clicked node's name or an edge's ``"a -> b"``.
        on_module: called with the path of a clicked module box or cluster.
        modules_select: also pass a module's selection (``"module/<path>"``) to ``on_select``.

    Example:
        >>> seen = []
        >>> g = linked_graph(seen.append, lambda path: seen.append(f"fold {path}"))
        >>> g.selected = "conv2d"; g.selected = "module/layer1"
        >>> g.module_click = {"path": "layer1", "n": 1}
        >>> seen
        ['conv2d', 'fold layer1']
    """
    widget = GraphWidget()

    def selected(change: dict[str, Any]) -> None:
        name = change["new"]
        if name and (modules_select or not name.startswith("module/")):
            on_select(name)

    def module(change: dict[str, Any]) -> None:
        path = (change["new"] or {}).get("path")
        if path:
            on_module(path)

    widget.observe(selected, "selected")
    widget.observe(module, "module_click")
    return widget


class FoldedGraph:
    """One model's graph pane: big modules folded, a module click toggles and redraws.

    Args:
        on_select: called with the name of a node or edge the user clicks (not when
            :meth:`select` sets the selection from Python).

    Attributes:
        widget: the :class:`~qviz.widgets.kit.graph_widget.GraphWidget` shown.
        folding: the :class:`~qviz.widgets.kit.folding.Folding` of the model first drawn (None
            before), kept across redraws of the same model and of its variants.
    """

    def __init__(self, on_select: Callable[[str], Any] | None = None) -> None:
        self._on_select = on_select
        self._quiet = False
        self._drawn: tuple[GraphModule, dict[str, Any]] | None = None
        self.folding: Folding | None = None
        self.widget = linked_graph(self._selected, self._toggle)

    def draw(self, model: GraphModule, **graph_kwargs: Any) -> FoldedGraph:
        """Draw ``model`` with :func:`qviz.viz.graph` (``graph_kwargs`` as it takes them),
        folded as the pane's :attr:`folding` says; module clicks redraw with the same options."""
        from qviz.viz import graph

        if self.folding is None:
            self.folding = Folding(model)  # big models open collapsed; a click expands a module
        self._drawn = (model, graph_kwargs)
        try:
            self.widget.show(graph(model, collapse=self.folding.collapse, **graph_kwargs))
        except QvizError as exc:  # e.g. no dot program: the rest of the widget still works
            self.widget.show(f"<svg><text y='20'>{html.escape(str(exc))}</text></svg>")
        return self

    def select(self, name: str) -> None:
        """Outline ``name`` in the graph without calling ``on_select``."""
        self._quiet = True
        try:
            self.widget.selected = name
        finally:
            self._quiet = False

    def _selected(self, name: str) -> None:
        if not self._quiet and self._on_select is not None:
            self._on_select(name)

    def _toggle(self, path: str) -> None:
        if self.folding is None or self._drawn is None:
            return
        self.folding.toggle(path)
        model, kwargs = self._drawn
        self.draw(model, **kwargs)
