"""The precision search's notebook view: its summary and a narrow table of the fully measured
assignments (:mod:`qviz.display.html_table`); the Pareto plot is :mod:`.plot`.

Example:
    >>> from types import SimpleNamespace
    >>> e = SimpleNamespace(point=0, cost=1.5e6, meets=True)
    >>> result = SimpleNamespace(full_evaluations=[e], front=[SimpleNamespace(estimate=31.25)],
    ...     figure_of=lambda e: 30.875, summary=lambda: "w8a8 everywhere meets 30 dB")
    >>> page = result_html(result)
    >>> "1.500e+06" in page, "30.88" in page, page.count("<tr>")
    (True, True, 2)
"""

from __future__ import annotations

import html
from typing import Any

from qviz.display.html_table import Cell, Column, table

_COLUMNS = (
    Column("point", numeric=True, title="the assignment's index on the estimated front"),
    Column("cost", numeric=True),
    Column("estimate", numeric=True, title="the figure the screening estimated"),
    Column("measured", numeric=True, title="the figure measured on the full data"),
    Column("meets", title="whether the measured figure meets the target"),
)


def result_html(result: Any) -> str:
    """The HTML of a :class:`~qviz.numeric.precision.result.PrecisionResult`."""
    rows = [
        [
            Cell(str(e.point)),
            Cell(f"{e.cost:#.4g}"),
            Cell(f"{result.front[e.point].estimate:#.4g}"),
            Cell(f"{result.figure_of(e):#.4g}"),
            Cell("yes" if e.meets else "no"),
        ]
        for e in result.full_evaluations
        if e.point is not None
    ]
    summary = f"<p><b>search_precision</b>: {html.escape(result.summary())}</p>"
    return summary + table(_COLUMNS, rows)
