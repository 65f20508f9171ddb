"""The notebook views of the numeric suite's records fit a notebook's output area: few
columns, long text wrapped in its column, numbers with three significant digits; no model runs."""

from __future__ import annotations

import math
import re

import pytest

from qviz.display.bands import CLIPPED, SQNR
from qviz.errors import ConfigError
from qviz.numeric.compare.report import COLUMNS, NumericReport
from qviz.numeric.compare.view import VIEW_COLUMNS
from qviz.numeric.diagnose.diagnose import Diagnosis, Finding
from qviz.numeric.diagnose.rules import Cause, Prescription
from qviz.numeric.repair.session import RepairStep
from qviz.numeric.repair.view import session_html


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


def _finding(node: str, action: str) -> Finding:
    evidence = (("range_ratio", 123.456789), ("members", "conv2d_1, conv2d_2"),
                ("bits", None), ("clipped", math.nan))  # fmt: skip
    prescription = Prescription(action, "qviz.engine.repair.cross_layer_equalization")
    return Finding(
        node=node,
        op="conv2d",
        cause=Cause.OUTLIER_CHANNELS,
        evidence=evidence,
        prescription=prescription,
        sqnr=3.14159,
        figure="local_sqnr",
        severity=21.8586,
    )


def test_the_diagnosis_view_wraps_its_text_columns():
    long = "equalize the channel ranges of conv1.0 and conv2.0 through the relu " * 3
    page = Diagnosis((_finding("conv2d_" + "y" * 50, long),), 25.0)._repr_html_()
    assert _headers(page) == ["node", "cause", "severity", "prescription", "evidence"]
    assert "21.9 dB" in page and "range_ratio=<wbr>123," in page and "123.456" not in page
    assert "bits=" not in page and "clipped=" not in page  # unknown figures are left out
    for text in ("equalize the channel", "range_ratio", "conv2d_yyy"):
        style = re.search(rf'<td style="([^"]*)">{text}', page).group(1)
        assert "white-space:normal" in style and "overflow-wrap:anywhere" in style
        assert "max-width" in style
    assert "qviz.engine.repair.cross_layer_equalization" in page.replace("<wbr>", "")
    assert "<table" not in Diagnosis((), 25.0)._repr_html_()


def test_the_repair_step_view_and_its_narrowed_table():
    layers = (("conv2d", 10.0, 30.0, 9.0, 29.0), ("relu", 20.0, 21.0, 9.5, 28.0),
              ("linear", 5.0, 5.0, 8.0, 27.12345))  # fmt: skip
    step = RepairStep(
        remedy="per_channel",
        arguments=(),
        scope=(),
        transforms=(),
        layers=layers,
        output_sqnr_before=8.0,
        output_sqnr_after=27.0,
        metric_before=0.1,
        metric_after=0.95,
        seconds=1.25,
    )
    page = step._repr_html_()
    assert len(_headers(page)) == 7 and "step.df" in page
    assert "+19 dB" in page and "metric 0.1 → 0.95" in page and ">27.1<" in page
    assert ">+20<" in page and ">0<" in page  # the changes, with their sign; no change: 0
    assert f"background:{SQNR.colour(5.0)}" in page
    narrowed = step.changes(r"conv|linear", by="cumulative_delta")
    assert [row[0] for row in narrowed.layers] == ["conv2d", "linear"]
    assert narrowed.df["cumulative_delta"].tolist() == sorted(
        narrowed.df["cumulative_delta"], reverse=True
    )
    assert "relu" not in narrowed._repr_html_() and step.changes().layers == layers
    with pytest.raises(ConfigError, match="local_delta"):
        step.changes(by="delta")
    with pytest.raises(ConfigError, match="pattern"):
        step.changes("conv(")


def test_the_session_view_formats_three_digits():
    page = session_html([("baseline", 7.98765, 0.1, math.nan), ("per_channel", 27.0, 0.95, 19.0)])
    assert "7.99 dB" in page and "+19 dB" in page and len(_headers(page)) == 4
