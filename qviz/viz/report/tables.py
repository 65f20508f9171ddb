"""The HTML report's tables: shown whole (no scroll box), numbers to four significant digits,
SQNR and clipped cells in their fixed band's colour (:mod:`qviz.display.bands`), each table of a
numeric suite with the legend of its columns (:mod:`qviz.viz.report.guide`).

Example:
    >>> import pandas as pd
    >>> page = frame_tables(pd.DataFrame({"node": ["conv2d"], "local_sqnr": [36.9]}))
    >>> '<td class="num" style="background:#d9ef8b">36.9</td>' in page
    True
"""

from __future__ import annotations

import html
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from qviz.display.bands import Bands, bands_for


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _note(text: str) -> str:
    return f'<p class="note">{_esc(text)}</p>'


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """An HTML table shown whole (no scroll box); every cell is escaped, numbers are
    right-aligned, newlines become <br>."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            num = isinstance(cell, int | float) and not isinstance(cell, bool)
            text = _esc("" if cell is None else cell).replace("\n", "<br>")
            cells.append(f'<td class="num">{text}</td>' if num else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


#: The numeric report's columns by what they tell: one table each, led by the node's name;
#: columns of no group follow in a last table.
COLUMN_GROUPS = (
    ("Error per operator", ("op", "module", "local_sqnr", "cumulative_sqnr", "weight_sqnr",
     "local_mse", "cumulative_mse", "cumulative_cosine", "cumulative_max_abs_err")),
    ("Output grid: range, clipping, rounding", ("float_min", "float_max", "grid_min",
     "grid_max", "clipped", "rmse_scale", "clip_error_share")),
    ("Slices: the worst token and channel, bias", ("local_worst_token_sqnr", "worst_token",
     "local_worst_channel_sqnr", "worst_channel", "local_bias_share",
     "worst_channel_bias_share", "handle")),
)  # fmt: skip
#: At most this many rows per table; the rest are counted in a note.
_MAX_ROWS = 1000


def frame_tables(
    frame: Any,
    groups: Sequence[tuple[str, Sequence[str]]] = (),
    terms: Mapping[str, str] | None = None,
) -> str:
    """``frame`` as tables shown whole: one per group of ``groups`` that it has columns of, the
    ``node`` column (or the index) first in each, then one of the columns no group names; each
    with the legend of its columns from ``terms`` (default: the numeric suite's,
    :data:`~qviz.viz.report.guide.TABLE_TERMS`).

    Example:
        >>> import pandas as pd
        >>> frame = pd.DataFrame({"node": ["a"], "clipped": [0.0], "x": [1]})
        >>> page = frame_tables(frame, COLUMN_GROUPS)
        >>> page.count("<table>"), "<h3>Other columns</h3>" in page
        (2, True)
    """
    from qviz.viz.report.guide import TABLE_TERMS, glossary

    terms = TABLE_TERMS if terms is None else terms
    key = [c for c in frame.columns if str(c) == "node"][:1]
    named = {c for _, group in groups for c in group}
    by_name = {str(c): c for c in frame.columns}
    parts = [(title, [by_name[n] for n in group if n in by_name]) for title, group in groups]
    parts = [(title, shown) for title, shown in parts if shown]
    rest = [c for c in frame.columns if str(c) not in named and c not in key]
    if rest:
        parts.append(("Other columns", rest))
    out = []
    if len(frame) > _MAX_ROWS:
        out.append(_note(f"The first {_MAX_ROWS} of {len(frame)} rows are shown; the whole "
                         f"table is the report's .df (to_csv writes it)."))  # fmt: skip
    for i, (title, shown) in enumerate(parts):
        heading = f"<h3>{_esc(title)}</h3>" if len(parts) > 1 else ""
        explained = [str(c) for c in (shown if i else key + shown)]  # the key column once
        out.append(heading + _banded_table(frame, key + shown) + glossary(explained, terms))
    return "".join(out)


def _banded_table(frame: Any, columns: Sequence[Any]) -> str:
    """Columns of ``frame`` as an HTML table; SQNR and clipped cells take their band's colour.
    The index leads unless it is the default 0..n-1; long names break after ``_``."""
    show_index = not _default_index(frame)
    names = ([str(frame.index.name or "")] if show_index else []) + [str(c) for c in columns]
    head = "".join(f"<th>{_esc(n).replace('_', '_<wbr>')}</th>" for n in names)
    bands = [bands_for(str(c)) for c in columns]
    shown = frame[list(columns)].head(_MAX_ROWS)
    body = []
    for label, row in zip(shown.index, shown.itertuples(index=False, name=None), strict=True):
        cells = [f"<td>{_esc(label)}</td>"] if show_index else []
        cells += [_cell(v, b) for v, b in zip(row, bands, strict=True)]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _default_index(frame: Any) -> bool:
    index = frame.index
    return index.name is None and list(index) == list(range(len(index)))


def _cell(value: Any, bands: Bands | None) -> str:
    """One cell: numbers to 4 significant digits, right-aligned, in their band's colour; NaN
    and None empty."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not number:
        return f"<td>{_esc('' if value is None else value)}</td>"
    if math.isnan(value):
        return '<td class="num"></td>'
    text = str(value) if isinstance(value, numbers.Integral) else f"{value:.4g}"
    colour = bands.colour(value) if bands is not None else None
    style = f' style="background:{colour}"' if colour else ""
    return f'<td class="num"{style}>{_esc(text)}</td>'
