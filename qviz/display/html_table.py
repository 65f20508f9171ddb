"""Narrow HTML tables for the numeric suite's notebook views.

A notebook's output area is about 850 px wide in a 1280 px window. A pandas table of every
column scrolls sideways there and hides what matters; these tables show few columns, wrap long
text inside its column (``white-space: normal; overflow-wrap: anywhere`` and a ``max-width``),
write numbers with three significant digits and may colour a cell (the fixed bands of
:mod:`qviz.display.bands`). Styles are inline, so JupyterLab's, VS Code's and a saved HTML
page's style sheets all show the same table.

Example:
    >>> cols = (Column("node", wrap="10em"), Column("SQNR dB", numeric=True))
    >>> page = table(cols, [[Cell("conv2d"), Cell(sig3(31.25), "#d9ef8b")]])
    >>> "31.2" in page, "overflow-wrap:anywhere" in page, "background:#d9ef8b" in page
    (True, True, True)
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

_TABLE = "border-collapse:collapse;table-layout:auto;width:auto;max-width:100%;margin:0 0 0.5em 0"
_CELL = "padding:2px 6px;vertical-align:top;line-height:1.3;border-bottom:1px solid #ddd"


@dataclass(frozen=True)
class Column:
    """One column of a narrow table.

    Attributes:
        header: its heading (a ``.df`` column name where there is one, so readers find it).
        wrap: a CSS length: the column's text wraps at this width (anywhere, when a word is
            longer); empty: the column never wraps (short numbers and names).
        numeric: right-aligned.
        title: a tooltip for the heading (what the column means, its unit).

    Example:
        >>> Column("evidence", wrap="18em").wrap
        '18em'
    """

    header: str
    wrap: str = ""
    numeric: bool = False
    title: str = ""

    def style(self) -> str:
        """The inline style of the column's cells."""
        align = "text-align:right" if self.numeric else "text-align:left"
        if self.wrap:
            wrap = f"white-space:normal;overflow-wrap:anywhere;max-width:{self.wrap}"
            return f"{_CELL};{align};{wrap}"
        return f"{_CELL};{align};white-space:nowrap"


@dataclass(frozen=True)
class Cell:
    """One cell: its text and an optional background colour. The text is escaped when drawn; a
    newline starts a new line and a zero-width space (``\u200b``) becomes ``<wbr>``, a place a
    long name may break that copying the text leaves out."""

    text: str
    colour: str | None = None


def sig3(value: Any, unit: str = "") -> str:
    """``value`` with three significant digits (and ``unit``); empty for None or NaN.

    Example:
        >>> sig3(31.2549), sig3(0.000123456), sig3(float("nan")), sig3(7), sig3(-1.5, " dB")
        ('31.3', '0.000123', '', '7', '-1.5 dB')
    """
    if value is None or isinstance(value, bool):
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value}{unit}"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "" if math.isnan(number) else f"{number:.3g}{unit}"


def table(columns: Sequence[Column], rows: Iterable[Sequence[Cell]]) -> str:
    """An HTML table of ``rows`` (one :class:`Cell` per column), styled inline.

    Example:
        >>> table((Column("a"),), [[Cell("x<y")]]).count("<tr>"), "x&lt;y" in table(
        ...     (Column("a"),), [[Cell("x<y")]])
        (2, True)
    """
    head = "".join(
        f'<th style="{c.style()};font-weight:bold"'
        + (f' title="{html.escape(c.title)}"' if c.title else "")
        + f">{html.escape(c.header)}</th>"
        for c in columns
    )
    body = []
    for row in rows:
        cells = []
        for column, cell in zip(columns, row, strict=True):
            fill = f";background:{cell.colour};color:#000" if cell.colour else ""
            text = html.escape(cell.text).replace("\n", "<br>").replace("\u200b", "<wbr>")
            cells.append(f'<td style="{column.style()}{fill}">{text}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table style="{_TABLE}"><tr>{head}</tr>{"".join(body)}</table>'
