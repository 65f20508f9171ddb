"""The notebook views of the numeric suite's records fit a notebook's output area: few
columns, long text wrapped in its column, numbers with three significant digits, no torch run."""

from __future__ import annotations

import math
import re

from qviz.numeric.bands import CLIPPED, SQNR
from qviz.numeric.report import COLUMNS, NumericReport
from qviz.numeric.report_view import VIEW_COLUMNS


def _headers(page: str) -> list[str]:
    return re.findall(r"<th[^>]*>([^<]*)</th>", page)


def _report() -> NumericReport:
    rows = [
        {"node": "conv2d", "op": "conv2d", "module": "features.0", "local_sqnr": 8.1234,
         "cumulative_sqnr": 35.55, "weight_sqnr": 41.0, "clipped": 0.02, "local_mse": 0.5},
        {"node": "linear_" + "x" * 60, "op": "linear", "module": "a.b." * 20,
         "local_sqnr": math.nan, "cumulative_sqnr": 12.0},
    ]  # fmt: skip
    return NumericReport.from_table(rows, output_sqnr=11.0, metric=0.5, samples=8)


def test_the_report_view_shows_the_chosen_columns_and_names_the_rest():
    report = _report()
    page = report._repr_html_()
    assert _headers(page) == list(VIEW_COLUMNS)
    assert len(_headers(page)) <= 8 and "report.df" in page
    rest = [c for c in COLUMNS if c not in VIEW_COLUMNS]
    assert f"{len(rest)} more" in page and all(c in page for c in rest)
    assert "output SQNR 11.00 dB" in page and "metric 0.5" in page
    assert list(report.df.columns) == list(COLUMNS)  # the DataFrame keeps every column


def test_the_report_view_colours_formats_and_wraps():
    page = _report()._repr_html_()
    assert ">8.12<" in page and ">35.5<" in page and ">2 %<" in page
    assert f"background:{SQNR.colour(8.1234)}" in page
    assert f"background:{SQNR.colour(35.55)}" in page
    assert f"background:{CLIPPED.colour(0.02)}" in page
    module_cell = re.search(r'<td style="([^"]*)">a\.b\.', page).group(1)
    assert "overflow-wrap:anywhere" in module_cell and "max-width" in module_cell
    assert "overflow-x" not in page and "overflow:auto" not in page  # no inner scroll box
