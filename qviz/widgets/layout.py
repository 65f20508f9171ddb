"""How the widgets lay out: a graph pane beside a panel that stays inside the notebook cell.

Every widget puts its graph and its panel side by side with :func:`split`: the graph pane
starts at a share of the width and can be dragged wider or narrower (the bar on its right edge,
drawn by the GraphWidget), and the panel takes the rest. The panel never spills out of the
cell: its rows of controls wrap (:func:`row`), its tables wrap long cells and scroll sideways
inside the panel when they still do not fit. The rules live in :data:`PANEL_CSS`, scoped under
the ``qviz-panel`` class.

Example:
    >>> import ipywidgets as w
    >>> box = split(w.HTML("graph"), w.VBox([row([w.Button(), w.Button()])]))
    >>> box.children[1].layout.flex, "qviz-panel" in box.children[1]._dom_classes
    ('1 1 0%', True)
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

_BREAK = re.compile(r"(?<=_)|(?<=[a-z0-9])(?=[A-Z])")

#: The panel's rules: wrap rows, wrap table cells, scroll what still does not fit.
PANEL_CSS = (
    "<style>"
    ".qviz-panel {min-width: 0; overflow-x: auto; box-sizing: border-box; padding-left: 6px}"
    ".qviz-panel .widget-hbox {flex-wrap: wrap; max-width: 100%}"
    ".qviz-panel > .jupyter-widgets {max-width: calc(100% - 2 * var(--jp-widgets-margin, 2px))}"
    ".qviz-panel .widget-html, .qviz-panel .widget-html-content {max-width: 100%}"
    ".qviz-panel .widget-dropdown, .qviz-panel .widget-hslider {max-width: 100%}"
    ".qviz-panel svg {max-width: 100%; height: auto}"
    ".qviz-panel .widget-toggle-buttons {flex-wrap: wrap; max-width: 100%}"
    ".qviz-panel .widget-toggle-buttons .widget-toggle-button {max-width: 100%}"
    ".qviz-scroll {max-width: 100%; overflow-x: auto}"
    ".qviz-scroll table th, .qviz-scroll table td "
    "{padding: 2px 6px; white-space: normal; overflow-wrap: normal}"
    "</style>"
)


def breakable(text: str) -> str:
    """``text`` escaped for HTML, with line-break opportunities after underscores and between
    camelCase words, so a narrow table cell wraps ``per_channel_symmetric`` or
    ``PerChannelMinMaxObserver`` at word boundaries instead of widening the table.

    Example:
        >>> breakable("per_tensor_affine")
        'per_<wbr>tensor_<wbr>affine'
        >>> breakable("HistogramObserver <a>")
        'Histogram<wbr>Observer &lt;a&gt;'
    """
    return "<wbr>".join(html.escape(part) for part in _BREAK.split(text))


def figure_png(fig: Any, dpi: int = 80) -> bytes:
    """A matplotlib Figure as PNG bytes (what an ``ipywidgets.Image`` shows)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def row(children: Sequence[Any]) -> Any:
    """Controls side by side that wrap onto the next line when the panel is narrow."""
    import ipywidgets as w

    return w.HBox(list(children), layout=w.Layout(flex_flow="row wrap", max_width="100%"))


def scrolling(table_html: str) -> str:
    """An HTML table wrapped so long cells wrap and a table still too wide scrolls sideways."""
    return f'<div class="qviz-scroll">{table_html}</div>'


def split(graph: Any | None, panel: Any, *, graph_width: str = "48%") -> Any:
    """``graph`` (a GraphWidget) and ``panel`` side by side, the panel kept inside the cell;
    without a graph (``graph=None``), the panel alone.

    Args:
        graph: the graph pane; it starts at ``graph_width`` and the user can drag its edge.
        panel: the controls; they get the rest of the width and the ``qviz-panel`` rules.
        graph_width: the graph's starting share of the width.
    """
    import ipywidgets as w

    if graph is None:
        return _prepare_panel(panel)
    graph.layout.width = graph_width
    graph.layout.flex = "0 0 auto"
    graph.layout.min_width = "200px"
    _prepare_panel(panel)
    return w.HBox(
        [graph, panel], layout=w.Layout(width="100%", align_items="flex-start", overflow="hidden")
    )


def _prepare_panel(panel: Any) -> Any:
    """Give ``panel`` the rest of the width, the panel rules and its style sheet; return it."""
    import ipywidgets as w

    panel.layout.flex = "1 1 0%"
    panel.layout.min_width = "0"
    panel.add_class("qviz-panel")
    if not any(getattr(c, "value", None) == PANEL_CSS for c in panel.children):
        panel.children = (w.HTML(PANEL_CSS), *panel.children)
    return panel
