"""How the widgets lay out: a graph pane beside a panel that stays inside the notebook cell.

Every widget puts its graph and its panel side by side with :func:`split`. Both panes are flex
items that share the cell's width: the graph pane starts at a share of it (``graph_width``,
e.g. 45 %) and can be dragged wider or narrower (the bar on its right edge, drawn by the
GraphWidget), and the panel takes the rest, so at 1920 pixels both are wider than at 1280. The
graph's height follows the browser window: :data:`PANE_HEIGHT` is a share of the viewport
height between a floor and a ceiling. The panel never spills out of the cell: its rows of
controls wrap (:func:`row`), its tables wrap long cells and scroll sideways inside the panel
when they still do not fit. The rules live in :data:`PANEL_CSS`, scoped under the
``qviz-panel`` class.

Figures follow one rule: no text under :data:`MIN_TEXT_PX` (10 CSS pixels) at the default zoom.
A matplotlib Figure is shown at :data:`FIGURE_CSS_DPI` CSS pixels per inch (a 10 pt label is
11 px), drawn at :data:`PIXEL_DENSITY` times that many pixels so that it stays sharp on a
high-density screen, and never stretched: :func:`figure_image` renders it (raising any text
that would fall under the floor) and :func:`show_figure` puts it in an ``ipywidgets.Image`` at
its CSS width, narrowed only when the cell is narrower, with its aspect ratio kept.

Example:
    >>> import ipywidgets as w
    >>> box = split(w.HTML("graph"), w.VBox([row([w.Button(), w.Button()])]))
    >>> box.children[0].layout.flex, box.children[1].layout.flex
    ('0 1 48%', '1 1 0%')
    >>> "qviz-panel" in box.children[1]._dom_classes
    True
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from qviz.errors import ConfigError

_BREAK = re.compile(r"(?<=_)|(?<=[a-z0-9])(?=[A-Z])")

#: The graph pane's height: 62 % of the browser window's height, never under 360 pixels (a
#: laptop still shows a few layers) nor over 960 (the panel's controls stay in reach).
PANE_HEIGHT = "clamp(360px, 62vh, 960px)"
#: The smallest text, in CSS pixels at the default zoom, that a figure or widget may show.
MIN_TEXT_PX = 10.0
#: CSS pixels per inch of a matplotlib Figure shown in a widget: 10 pt text is 11.1 px.
FIGURE_CSS_DPI = 80
#: Image pixels per CSS pixel: a figure is drawn at twice its display size (sharp on a
#: high-density screen) and shown at half its natural width, never stretched past it.
PIXEL_DENSITY = 2

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


@dataclass(frozen=True)
class FigureImage:
    """A figure drawn for an ``ipywidgets.Image``: its PNG and the CSS size to show it at.

    Attributes:
        png: the PNG bytes, :data:`PIXEL_DENSITY` image pixels per CSS pixel.
        width, height: the CSS pixels it is shown at (its natural size over the density).
    """

    png: bytes
    width: int
    height: int


def text_px(fig: Any, css_dpi: float = FIGURE_CSS_DPI) -> float:
    """The smallest text of ``fig`` (titles, labels, ticks, legends, tables) in CSS pixels when
    the figure is shown at ``css_dpi`` pixels per inch; ``inf`` when it has no visible text.

    Example:
        >>> from qviz.display.figure import new_figure
        >>> fig = new_figure(figsize=(3, 2))
        >>> _ = fig.subplots().set_title("t", fontsize=9)
        >>> round(text_px(fig), 1)   # 9 pt at 80 px per inch
        10.0
    """
    from matplotlib.text import Text

    fig.draw_without_rendering()  # tick labels exist once the figure has been laid out
    sizes = [
        t.get_fontsize()
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.get_figure() is not None
    ]
    return min(sizes, default=float("inf")) * css_dpi / 72


def legible(fig: Any, min_px: float = MIN_TEXT_PX, css_dpi: float = FIGURE_CSS_DPI) -> Any:
    """Raise every text of ``fig`` smaller than ``min_px`` CSS pixels (shown at ``css_dpi``)
    to ``min_px``; returns ``fig``.

    Example:
        >>> from qviz.display.figure import new_figure
        >>> fig = new_figure(figsize=(3, 2))
        >>> ax = fig.subplots()
        >>> _ = ax.legend(handles=ax.plot([0, 1], label="a"), fontsize=6)
        >>> round(text_px(fig), 1), round(text_px(legible(fig)), 1)
        (6.7, 10.0)
    """
    from matplotlib.text import Text

    floor = min_px * 72 / css_dpi
    fig.draw_without_rendering()
    for ax in fig.axes:  # tick labels are made afresh at each draw: raise the axis's own size
        for axis in (ax.xaxis, ax.yaxis):
            labels = axis.get_ticklabels(which="both")
            if labels and min(t.get_fontsize() for t in labels) < floor:
                axis.set_tick_params(which="both", labelsize=floor)
    for t in fig.findobj(Text):
        if t.get_fontsize() < floor:
            t.set_fontsize(floor)
    return fig


def figure_image(fig: Any, *, density: int = PIXEL_DENSITY) -> FigureImage:
    """``fig`` as a :class:`FigureImage`: its text raised to :data:`MIN_TEXT_PX` (see
    :func:`legible`), drawn at ``density`` × :data:`FIGURE_CSS_DPI` pixels per inch.

    Raises:
        ConfigError: ``density`` is not a positive whole number.

    Example:
        >>> from qviz.display.figure import new_figure
        >>> picture = figure_image(new_figure(figsize=(3, 2)))
        >>> picture.width, picture.height, picture.png[:4]
        (240, 160, b'\\x89PNG')
    """
    if not isinstance(density, int) or density < 1:
        raise ConfigError(f"figure_image: density must be a whole number >= 1, got {density!r}")
    legible(fig)
    width, height = fig.get_size_inches() * FIGURE_CSS_DPI
    png = figure_png(fig, dpi=FIGURE_CSS_DPI * density)
    return FigureImage(png, round(float(width)), round(float(height)))


def show_figure(image: Any, picture: FigureImage | None) -> None:
    """Show ``picture`` in the ``ipywidgets.Image`` ``image`` at its CSS width, narrower only when
    the cell is (its aspect ratio kept, never stretched past its natural size); ``None`` empties
    it.

    Example:
        >>> import ipywidgets as w
        >>> from qviz.display.figure import new_figure
        >>> image = w.Image(format="png")
        >>> show_figure(image, figure_image(new_figure(figsize=(3, 2))))
        >>> image.layout.width, image.layout.max_width, image.layout.height
        ('240px', '100%', 'auto')
    """
    if picture is None:
        image.value = b""
        image.layout.width = None
        return
    image.value = picture.png
    image.layout.width = f"{picture.width}px"
    image.layout.max_width = "100%"
    image.layout.height = "auto"
    image.layout.align_self = "flex-start"
    image.layout.object_fit = "contain"


def row(children: Sequence[Any]) -> Any:
    """Controls side by side that wrap onto the next line when the panel is narrow."""
    import ipywidgets as w

    return w.HBox(list(children), layout=w.Layout(flex_flow="row wrap", max_width="100%"))


def scrolling(table_html: str) -> str:
    """An HTML table wrapped so long cells wrap and a table still too wide scrolls sideways."""
    return f'<div class="qviz-scroll">{table_html}</div>'


def split(
    graph: Any | None, panel: Any, *, graph_width: str = "48%", panel_width: int = 380
) -> Any:
    """``graph`` (a GraphWidget) and ``panel`` side by side, the panel kept inside the cell;
    without a graph (``graph=None``), the panel alone.

    A graph wider than its share at a legible scale does not open cropped where the cell has
    room: the pane widens to show the graph's whole width as far as the panel keeps
    ``panel_width`` pixels (the GraphWidget's first view does it, see
    :attr:`~qviz.widgets.kit.graph_widget.GraphWidget.panel_width`).

    Args:
        graph: the graph pane; it starts at ``graph_width`` and the user can drag its edge.
        panel: the controls; they get the rest of the width and the ``qviz-panel`` rules.
        graph_width: the graph's starting share of the width (a flex basis: it follows the
            cell's width as the window grows or shrinks).
        panel_width: the width in CSS pixels the panel needs beside the graph.
    """
    import ipywidgets as w

    if graph is None:
        return _prepare_panel(panel)
    graph.layout.width = None
    graph.layout.flex = f"0 1 {graph_width}"  # its share of the cell, whatever the cell's width
    graph.layout.min_width = "200px"
    if hasattr(graph, "panel_width"):
        graph.panel_width = panel_width
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
