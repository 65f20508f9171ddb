"""A Graphviz SVG as HTML for a notebook output: inline, fitted to the page, folded when tall.

JupyterLab and Voila draw an ``image/svg+xml`` output as an ``<img>``, where the SVG's
tooltips never show; they prefer ``text/html``, so :class:`~qviz.viz.QGraph` also offers the
SVG inline in HTML (:func:`inline_html`). What the HTML does to the SVG:

* **no prolog**: the XML declaration, doctype and comments before ``<svg`` go;
* **tooltips**: each ``<a xlink:title="...">`` Graphviz writes for a tooltip also gets a
  ``<title>`` child, the element every browser shows on hover;
* **ids unique on the page**: Graphviz numbers ``graph0``, ``node1``, ``edge1``, ``clust1``
  and gradients ``l_1`` the same way in every drawing; each id (and each ``#id`` or
  ``url(#id)`` pointing at one) gets a prefix made from the drawing and a per-process count,
  so two graphs in one page never clash (and a re-run notebook writes the same HTML);
* **fitted width**: the SVG keeps its aspect ratio and shrinks to the output's width
  (``max-width:100%; height:auto``), but never so far that any of its text (11 pt op names,
  8 pt edge specs and markers: 10.7 px unscaled) drops below ``min_text_px`` (10 px):
  past that it keeps the legible size and scrolls in its own box; a graph too wide to fit
  legibly on a ``page_width`` output gets a box at most 90 % of the window high, so that its
  horizontal scrollbar is on screen rather than under a long output;
* **folded when tall**: a graph taller than ``max_height`` (2200 px, about
  three screens) at its fitted width on a
  ``page_width`` (1000 px) output is folded in a ``<details>`` whose summary says the stage,
  node count and full size, and names ``qviz.widgets.GraphWidget`` (pan, zoom, search) to
  explore it; a click on the summary unfolds it.

:class:`InlineLayout` holds those choices; ``qviz.viz.graph(..., fold=...)`` and
:meth:`QGraph.with_layout <qviz.viz.QGraph.with_layout>` set them.

JupyterLab sanitizes the HTML of an untrusted notebook's saved outputs (one opened from
elsewhere), which removes inline SVG: run the cell again, or trust the notebook, to see it.

Example:
    >>> svg = ('<?xml version="1.0"?><svg width="60pt" height="30pt" viewBox="0 0 60 30">'
    ...        '<g id="node1"><a xlink:title="relu"><text font-size="11.00">r</text></a></g>'
    ...        '</svg>')
    >>> html = inline_html(svg, InlineLayout(), "float graph, 1 node")
    >>> "<?xml" in html, 'id="node1"' in html, "<title>relu</title>" in html, "<details" in html
    (False, False, True, False)
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass

from qviz.errors import ConfigError

#: CSS px per unit of an SVG length (Graphviz writes pt: 1 pt = 4/3 px).
_UNITS = {"pt": 4 / 3, "px": 1.0, "": 1.0, "in": 96.0, "pc": 16.0, "mm": 96 / 25.4, "cm": 96 / 2.54}
_LENGTH = re.compile(r"^\s*([0-9.]+)\s*([a-z]*)\s*$")
_COUNT = itertools.count()


@dataclass(frozen=True, kw_only=True)
class InlineLayout:
    """How a graph sits in a notebook output (all sizes in CSS px).

    Attributes:
        fold: ``True`` folds the graph in a ``<details>``, ``False`` never does, ``None``
            (default) folds it when taller than ``max_height`` at its fitted width.
        max_height: the tallest graph shown unfolded when ``fold`` is None.
        page_width: the output width the folding decision assumes (JupyterLab's output area
            is about 1100 px wide in a 1280 px window).
        min_text_px: the smallest text size the fitting may shrink to; a wider graph
            scrolls sideways instead.

    Raises:
        ConfigError: ``fold`` is not a bool or None, or a size is not a positive number.

    Example:
        >>> InlineLayout(fold=True).fold
        True
        >>> InlineLayout(max_height=0)
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: InlineLayout(max_height=0): give a positive number of CSS px
    """

    fold: bool | None = None
    max_height: float = 2200
    page_width: float = 1000
    min_text_px: float = 10.0

    def __post_init__(self) -> None:
        if self.fold is not None and not isinstance(self.fold, bool):
            raise ConfigError(
                f"InlineLayout(fold={self.fold!r}): give True (always fold), False (never) or "
                f"None (fold a graph taller than max_height)"
            )
        for name in ("max_height", "page_width", "min_text_px"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(
                    f"InlineLayout({name}={value!r}): give a positive number of CSS px"
                )


def strip_prolog(svg: str) -> str:
    """``svg`` from its ``<svg`` tag on (no XML declaration, doctype or comments before it).

    Raises:
        ConfigError: ``svg`` has no ``<svg`` element.

    Example:
        >>> strip_prolog('<?xml version="1.0"?>\\n<!DOCTYPE svg>\\n<!-- dot -->\\n<svg/>')
        '<svg/>'
    """
    start = svg.find("<svg")
    if start < 0:
        raise ConfigError(f"expected an SVG document, got text starting {svg[:40]!r}")
    return svg[start:].strip()


def _root(svg: str) -> tuple[str, int]:
    """The opening ``<svg ...>`` tag of ``svg`` (prolog stripped) and where it ends."""
    end = svg.find(">")
    return svg[: end + 1], end + 1


def _length(tag: str, name: str) -> float | None:
    found = re.search(rf'\s{name}="([^"]*)"', tag)
    parsed = _LENGTH.match(found.group(1)) if found else None
    if not parsed or parsed.group(2) not in _UNITS:
        return None
    return float(parsed.group(1)) * _UNITS[parsed.group(2)]


def svg_size(svg: str) -> tuple[float, float]:
    """The ``(width, height)`` in CSS px at which a browser draws ``svg`` (prolog stripped)
    unscaled: its ``width``/``height`` attributes, else its ``viewBox``, else ``(0, 0)``.

    Example:
        >>> svg_size('<svg width="75pt" height="30pt" viewBox="0 0 75 30"></svg>')
        (100.0, 40.0)
    """
    tag, _ = _root(svg)
    width, height = _length(tag, "width"), _length(tag, "height")
    if width is None or height is None:
        box = _viewbox(tag)
        return (box[2], box[3]) if box else (0.0, 0.0)
    return (width, height)


def _viewbox(tag: str) -> list[float] | None:
    """The four numbers of the ``viewBox`` of the root ``tag``, or None."""
    found = re.search(r'\sviewBox="([^"]*)"', tag)
    numbers = found.group(1).replace(",", " ").split() if found else []
    try:
        return [float(n) for n in numbers] if len(numbers) == 4 else None
    except ValueError:
        return None


def text_px(svg: str) -> float:
    """The smallest font size of ``svg``'s text, in px at its natural size (0 without text).

    Example:
        >>> text_px('<svg width="30pt" height="9pt" viewBox="0 0 30 9">'
        ...         '<text font-size="9.00">a</text><text font-size="14.00">b</text></svg>')
        12.0
    """
    sizes = [float(s) for s in re.findall(r'<text[^>]*\sfont-size="([0-9.]+)"', svg)]
    if not sizes:
        return 0.0
    width, _ = svg_size(svg)
    box = _viewbox(_root(svg)[0])
    scale = width / box[2] if box and box[2] else 1.0  # px per unit of the drawing
    return min(sizes) * scale


def unique_ids(svg: str, prefix: str) -> str:
    """``svg`` with every ``id`` and every ``#id`` reference to one prefixed by ``prefix``.

    Example:
        >>> unique_ids('<g id="node1"><use href="#l_1" fill="url(#l_1)"/></g>', "q-")
        '<g id="q-node1"><use href="#q-l_1" fill="url(#q-l_1)"/></g>'
    """
    svg = re.sub(r'(\sid=")([^"]+")', rf"\g<1>{prefix}\g<2>", svg)
    svg = re.sub(r'(href="#)([^"]+")', rf"\g<1>{prefix}\g<2>", svg)
    return re.sub(r"(url\(#)([^)]+\))", rf"\g<1>{prefix}\g<2>", svg)


def title_tooltips(svg: str) -> str:
    """``svg`` with a ``<title>`` child in each ``<a xlink:title="...">``, so that browsers
    show the tooltip on hover (Graphviz writes tooltips as link titles only).

    Example:
        >>> title_tooltips('<a xlink:title="x &lt; 1"><text>x</text></a>')
        '<a xlink:title="x &lt; 1"><title>x &lt; 1</title><text>x</text></a>'
    """
    return re.sub(r'(<a\b[^>]*\sxlink:title="([^"]*)"[^>]*>)', r"\1<title>\2</title>", svg)


def _fitted(svg: str, layout: InlineLayout) -> tuple[float, float, float]:
    """``(width, height, smallest width)`` in px: the natural size, and the width below which
    some text would be smaller than ``layout.min_text_px``."""
    width, height = svg_size(svg)
    text = text_px(svg)
    legible = min(1.0, layout.min_text_px / text) if text else 0.0
    return width, height, width * legible


def should_fold(svg: str, layout: InlineLayout) -> bool:
    """Whether ``svg`` (prolog stripped) is folded under ``layout`` (see the module's rules).

    Example:
        >>> tall = '<svg width="300pt" height="3000pt" viewBox="0 0 300 3000"></svg>'
        >>> should_fold(tall, InlineLayout()), should_fold(tall, InlineLayout(fold=False))
        (True, False)
    """
    if layout.fold is not None:
        return layout.fold
    width, height, smallest = _fitted(svg, layout)
    shown = min(width, max(smallest, layout.page_width))
    return height * (shown / width if width else 1.0) > layout.max_height


def _sized(svg: str, width: float, smallest: float) -> str:
    """``svg`` whose root tag draws it ``width`` px wide at most, shrinking with its box (the
    aspect ratio kept) down to ``smallest`` px."""
    tag, end = _root(svg)
    tag = re.sub(r'\s(width|height)="[^"]*"', "", tag)
    style = f"display:block;width:{width:.0f}px;max-width:100%;height:auto"
    if smallest < width:
        style += f";min-width:{smallest:.0f}px"
    return tag[:4] + f' class="qviz-inline-graph" style="{style}"' + tag[4:] + svg[end:]


def inline_html(svg: str, layout: InlineLayout, what: str) -> str:
    """``svg`` (a Graphviz document) as HTML for a notebook output: prolog stripped, tooltips
    as ``<title>``, ids unique, fitted to the width, folded under a summary when tall.

    Args:
        svg: the SVG document.
        layout: the fitting and folding choices.
        what: what the drawing is, for the folded summary (``"observed graph, 42 nodes"``).

    Example:
        >>> html = inline_html('<svg width="30pt" height="3000pt" viewBox="0 0 30 3000"></svg>',
        ...                    InlineLayout(), "float graph, 2 nodes")
        >>> html.startswith("<details"), "40 × 4000 px" in html
        (True, True)
    """
    body = strip_prolog(svg)
    digest = hashlib.sha1(f"{next(_COUNT)}:{body}".encode()).hexdigest()[:8]
    body = title_tooltips(unique_ids(body, f"q{digest}-"))
    width, height, smallest = _fitted(body, layout)
    # too wide to fit legibly: a box at most 90 % of the window high, so that both of its
    # scrollbars are on screen
    scroll = "max-height:90vh;overflow:auto" if smallest > layout.page_width else "overflow-x:auto"
    box = (
        f'<div class="qviz-graph-box" style="max-width:100%;{scroll}">'
        f"{_sized(body, width, smallest)}</div>"
    )
    if not should_fold(body, layout):
        return box
    summary = (
        f"<b>{what}, {width:.0f} × {height:.0f} px</b>: folded, click to show it; to pan, "
        f"zoom and search it: <code>qviz.widgets.GraphWidget.from_model(model)</code>"
    )
    return (
        f'<details class="qviz-graph-fold"><summary style="cursor:pointer">{summary}'
        f"</summary>{box}</details>"
    )
