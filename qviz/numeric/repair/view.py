"""The notebook views of :class:`~qviz.numeric.repair.session.RepairSession` and its steps.

A step's per-layer table (``step.df``: seven columns with names like ``cumulative_sqnr_before``)
scrolls sideways in a notebook; the view here writes the same figures under short headings,
with three significant digits and SQNR cells in the fixed bands of :mod:`qviz.display.bands`,
about 650 px wide.

Example:
    >>> import math
    >>> from qviz.numeric.repair.session import RepairStep
    >>> step = RepairStep(remedy="fallback", arguments=(), scope=(), transforms=(), layers=(("relu",
    ...     30.0, math.nan, 28.0, 33.25),),
    ...                   output_sqnr_before=28.0, output_sqnr_after=31.5, metric_before=None,
    ...                   metric_after=None, seconds=0.1)
    >>> page = step_html(step)
    >>> "+3.5 dB" in page, ">33.2<" in page, "cumulative Δ" in page
    (True, True, True)
"""

from __future__ import annotations

import html
import math
from typing import Any

from qviz.display.bands import SQNR
from qviz.display.html_table import Cell, Column, sig3, table

_STEP_COLUMNS = (
    Column("node", wrap="11em"),
    Column("local before", numeric=True, title="local_sqnr_before, dB"),
    Column("local after", numeric=True, title="local_sqnr_after, dB"),
    Column("local Δ", numeric=True, title="local_delta, dB"),
    Column("cumulative before", numeric=True, title="cumulative_sqnr_before, dB"),
    Column("cumulative after", numeric=True, title="cumulative_sqnr_after, dB"),
    Column("cumulative Δ", numeric=True, title="cumulative_delta, dB"),
)


def signed(value: float, unit: str = "") -> str:
    """A change with its sign and three significant digits; empty for NaN.

    Example:
        >>> signed(3.456, " dB"), signed(-0.01234), signed(0.0), signed(math.nan)
        ('+3.46 dB', '-0.0123', '0', '')
    """
    if value is None or math.isnan(value):
        return ""
    return f"0{unit}" if value == 0 else f"{value:+.3g}{unit}"


def _sqnr(value: float) -> Cell:
    return Cell(sig3(value), SQNR.colour(value))


def step_html(step: Any) -> str:
    """A :class:`RepairStep`: its summary line, then per layer the SQNR before, after and the
    change (local, then cumulative), in the order of ``step.layers``.

    Example:
        >>> from qviz.numeric.repair.session import RepairStep
        >>> "<table" in step_html(RepairStep(remedy="fallback", arguments=(), scope=(),
        ...     transforms=(), layers=(), output_sqnr_before=1.0, output_sqnr_after=2.0,
        ...     metric_before=None, metric_after=None, seconds=0))
        False
    """
    parts = [
        f"output SQNR {sig3(step.output_sqnr_before)} → {sig3(step.output_sqnr_after)} dB "
        f"({signed(step.delta, ' dB') if step.gained else step.verdict.split(' (')[0]})"
    ]
    if step.metric_before is not None and step.metric_after is not None:
        parts.append(f"metric {sig3(step.metric_before)} → {sig3(step.metric_after)}")
    parts.append(f"{step.seconds:.1f} s")
    head = f"<p><b>RepairStep</b> {html.escape(step.remedy)}: {html.escape(', '.join(parts))}</p>"
    if not step.layers:
        return head
    rows = [
        [Cell(node), _sqnr(lb), _sqnr(la), Cell(signed(la - lb)),
         _sqnr(cb), _sqnr(ca), Cell(signed(ca - cb))]
        for node, lb, la, cb, ca in step.layers
    ]  # fmt: skip
    note = (
        '<p style="font-size:0.9em;color:#555">SQNR in dB; <code>step.df</code> holds the same '
        "figures (local_sqnr_before, ..., cumulative_delta)</p>"
    )
    return head + table(_STEP_COLUMNS, rows) + note


def session_html(rows: list[tuple[str, float, float | None, float]]) -> str:
    """A :class:`RepairSession`: per row (the baseline, then each step) the remedy, the output
    SQNR, the metric and the change in output SQNR.

    Example:
        >>> ">+2.5 dB<" in session_html([("baseline", 28.0, None, math.nan),
        ...                              ("fallback", 30.5, None, 2.5)])
        True
    """
    columns = (
        Column("remedy", wrap="16em"),
        Column("output SQNR", numeric=True),
        Column("metric", numeric=True),
        Column("Δ", numeric=True, title="change in output SQNR"),
    )
    body = [
        [Cell(r), Cell(sig3(s, " dB"), SQNR.colour(s)), Cell(sig3(m)), Cell(signed(d, " dB"))]
        for r, s, m, d in rows
    ]
    return f"<p><b>RepairSession</b></p>{table(columns, body)}"
