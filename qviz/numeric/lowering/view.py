"""The bisection's notebook view: its verdict, how it probed, and a narrow table of the probes
(:mod:`qviz.display.html_table`), one row per tensor compared.

Example:
    >>> from types import SimpleNamespace
    >>> probe = {"tensor": "quantize_per_tensor_1", "op": "relu", "role": "bisect",
    ...          "departed": True, "max_steps": 30, "share": 5.4e-05}
    >>> result = SimpleNamespace(probes=[probe], method="the converted model's cuts",
    ...                          summary=lambda: "first departure at quantize_per_tensor_1")
    >>> page = bisection_html(result)
    >>> "quantize_per_tensor_1" in page, "5.4e-05" in page, page.count("<tr>")
    (True, True, 2)
"""

from __future__ import annotations

import html
from typing import Any

from qviz.display.html_table import Cell, Column, sig3, table

_COLUMNS = (
    Column("tensor", wrap="16em"),
    Column("op", wrap="10em"),
    Column("role", title="output: a model output; bisect: a tensor the bisection probed"),
    Column("departed", title="more than the tolerance from the reference"),
    Column("max_steps", numeric=True, title="largest difference, in steps of the tensor's grid"),
    Column("share", numeric=True, title="fraction of the tensor's elements that differ"),
)


def bisection_html(result: Any) -> str:
    """The HTML of a :class:`~qviz.numeric.lowering.bisect.BisectionResult`."""
    rows = [
        [
            Cell(str(p["tensor"])),
            Cell(str(p["op"])),
            Cell(str(p["role"])),
            Cell("yes" if p["departed"] else "no"),
            Cell(sig3(p["max_steps"])),
            Cell(sig3(p["share"])),
        ]
        for p in result.probes
    ]
    return (
        f"<p>{html.escape(result.summary())}</p><p>probe: {html.escape(result.method)}</p>"
        + table(_COLUMNS, rows)
    )
