"""The notebook view of a :class:`~qviz.numeric.compare.report.NumericReport`.

The report's table has 24 columns; all of them side by side scroll far past a notebook's output
area. The view shows the summary line, then the columns a reader needs first
(:data:`VIEW_COLUMNS`: where the operator is, its own and its cumulative SQNR, its weight's
SQNR, the share its range clips), SQNR and clipped cells in the fixed bands of
:mod:`qviz.display.bands`, and a line naming the columns only ``report.df`` holds.

Example:
    >>> from qviz.numeric.compare.report import NumericReport
    >>> r = NumericReport.from_table([{"node": "conv2d", "op": "conv2d", "local_sqnr": 8.0,
    ...                                "cumulative_sqnr": 7.5, "clipped": 0.02}])
    >>> page = report_html(r)
    >>> "report.df" in page, "cumulative_mse" in page, page.count("<th")
    (True, True, 7)
"""

from __future__ import annotations

import html
from typing import Any

from qviz.display.bands import CLIPPED, SQNR
from qviz.display.html_table import Cell, Column, sig3, table

#: The report columns the notebook view shows, in this order.
VIEW_COLUMNS = (
    "node",
    "op",
    "module",
    "local_sqnr",
    "cumulative_sqnr",
    "weight_sqnr",
    "clipped",
)
#: The most rows the view draws (``report.df`` has them all).
MAX_ROWS = 400

_TITLES = {
    "local_sqnr": "dB: the operator's own error, fed the float model's inputs",
    "cumulative_sqnr": "dB: the quantized model end to end, everything upstream included",
    "weight_sqnr": "dB: the quantized weight against the float one",
    "clipped": "share of the float output beyond the grid's last level, in percent",
}
_WRAP = {"node": "11em", "op": "12em", "module": "13em"}


def _cell(column: str, value: Any) -> Cell:
    if column in _WRAP:
        return Cell("" if value is None else str(value))
    if column == "clipped":
        return Cell(sig3(value * 100.0, " %") if value == value else "", CLIPPED.colour(value))
    return Cell(sig3(value), SQNR.colour(value))


def report_html(report: Any) -> str:
    """The report's summary, its :data:`VIEW_COLUMNS` and a note on the rest of ``report.df``.

    Example:
        >>> from qviz.numeric.compare.report import NumericReport
        >>> "local_sqnr" in report_html(NumericReport.from_table([{"node": "a"}]))
        True
    """
    df = report.df
    shown = [c for c in VIEW_COLUMNS if c in df.columns]
    columns = [
        Column(c, wrap=_WRAP.get(c, ""), numeric=c not in _WRAP, title=_TITLES.get(c, ""))
        for c in shown
    ]
    records = df[shown].head(MAX_ROWS).to_dict("records")
    rows = [[_cell(c, record[c]) for c in shown] for record in records]
    rest = [str(c) for c in df.columns if c not in shown]
    cut = f"the first {MAX_ROWS} of {len(df)} rows; " if len(df) > MAX_ROWS else ""
    note = (
        f"{cut}<code>report.df</code> holds every column: {len(rest)} more "
        f"({html.escape(', '.join(rest))})"
        if rest
        else f"{cut}<code>report.df</code> holds the table"
    )
    return (
        f"<p><b>NumericReport</b>: {html.escape(report.summary())}</p>{table(columns, rows)}"
        f'<p style="font-size:0.9em;color:#555;white-space:normal">{note}</p>'
    )
