"""The notebook view of a :class:`~qviz.numeric.diagnose.diagnose.Diagnosis`: a narrow HTML table.

The summary, then per finding its node, cause, severity, the prescription (with the function
that applies it) and the evidence, long text wrapped in its column and numbers with three
significant digits (about 750 px wide), drawn with :mod:`qviz.display.html_table`.

Example:
    >>> from qviz.numeric.diagnose.diagnose import Diagnosis
    >>> diagnosis_html(Diagnosis(findings=(), threshold_db=20.0))
    '<p><b>Diagnosis</b>: no layer below 20 dB</p>'
"""

from __future__ import annotations

import html
from typing import Any

from qviz.display.html_table import Cell, Column, sig3, table


def diagnosis_html(diagnosis: Any) -> str:
    """The summary, then one row per finding (about 750 px wide)."""
    summary = f"<p><b>Diagnosis</b>: {html.escape(diagnosis.summary())}</p>"
    if not diagnosis.findings:
        return summary
    columns = (
        Column("node", wrap="8em"),
        Column("cause", wrap="7em"),
        Column("severity", numeric=True, title="dB below the threshold"),
        Column("prescription", wrap="22em", title="what to do; below: the qviz function"),
        Column("evidence", wrap="16em", title="unknown figures left out; .df has all"),
    )
    rows = [
        [Cell(f.node), Cell(f.cause.value), Cell(sig3(f.severity, " dB")),
         Cell(f"{f.prescription.action}\n→\u00a0"
              + f.prescription.function.replace(".", ".\u200b")
              + (f"\nmeasured: {f.verdict}" if f.remedies else "")),
         Cell(", ".join(f"{k}=\u200b{sig3(v)}" for k, v in f.evidence if sig3(v)))]
        for f in diagnosis.findings
    ]  # fmt: skip
    return summary + table(columns, rows)
