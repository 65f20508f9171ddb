"""qviz.viz.report: one self-contained HTML page of a prepared or converted model."""

from __future__ import annotations

import importlib
import re
from html import escape as html_escape

import pandas as pd
import pytest
import torch

import qviz
from qviz.data import digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import ConfigError

report_module = importlib.import_module("qviz.viz.report.html_report")
report = report_module.report

_EXTERNAL = re.compile(
    r"<script|<link\b|<iframe|@import|url\(|(?:src|href)\s*=\s*[\"']?(?:https?:)?//", re.I
)


def _quantizer(fc_in_float: bool = False) -> XNNPACKQuantizer:
    config = get_symmetric_quantization_config(is_per_channel=True)
    quantizer = XNNPACKQuantizer().set_global(config)
    return quantizer.set_module_name("fc", None) if fc_in_float else quantizer


def _prepared(*, calibrate: bool = True, fc_in_float: bool = False):
    torch.manual_seed(0)
    x = torch.rand(4, 1, 8, 8)
    gm = qviz.export(digits_model(), (x,), dynamic_batch=True)
    prepared = qviz.prepare_pt2e(gm, _quantizer(fc_in_float))
    if calibrate:
        qviz.calibrate(prepared, [torch.rand(16, 1, 8, 8) for _ in range(2)], progress=False)
    return prepared


@pytest.fixture(scope="module")
def prepared():
    return _prepared()


_FRAME = pd.DataFrame({"layer": ["conv<1>", "fc"], "sqnr_db": [31.5, 22.25]})


@pytest.fixture(scope="module")
def page(prepared, tmp_path_factory):
    """The full report (all histograms) of the calibrated digits model, rendered once."""
    out = tmp_path_factory.mktemp("report") / "r.html"
    assert report(prepared, out, ns=_FRAME, title="<b>mine & yours</b>") == out
    return out.read_text(encoding="utf-8")


@pytest.fixture
def no_histograms(monkeypatch):
    """Skip the per-observer histograms (the slow part) in tests about other sections."""
    monkeypatch.setattr(report_module, "_MAX_HISTOGRAMS", 0)


def _external_refs(text: str) -> list[str]:
    """http(s) references outside the SVG's xmlns attributes."""
    stripped = re.sub(r'xmlns(?::\w+)?="http://www\.w3\.org/[^"]*"', "", text)
    return re.findall(r"https?://\S+", stripped)


def test_prepared_report_is_self_contained_with_every_view(prepared, page):
    text = page
    assert text.startswith("<!DOCTYPE html>")
    assert "<svg" in text and "<?xml" not in text and "<!DOCTYPE svg" not in text
    assert text.count("data:image/png;base64,") >= 1  # the range overview
    assert text.count('data-gid="observed"') >= 1  # the histograms, inline SVG
    assert _external_refs(text) == []
    assert not _EXTERNAL.search(text)
    for group in prepared.plan.groups:
        assert f">{group.observer}<" in text  # in the group table
    assert "Nodes left in float" in text and "None: every quantizable op" in text


def test_histogram_per_histogram_observer_with_members_as_caption(prepared, page):
    from qviz.engine.observers import HistogramObserver

    text = page
    hist = [
        g
        for g in prepared.plan.groups
        if isinstance(prepared.get_submodule(g.observer), HistogramObserver)
    ]
    assert hist and text.count("<figure>") == len(hist) + 1  # + the range overview
    first = hist[0]
    members = ", ".join(str(m) for m in first.members).replace(">", "&gt;")
    assert f"group {first.group} ({first.observer}): {members}" in text


def test_float_reason_is_listed(tmp_path, no_histograms):
    model = _prepared(fc_in_float=True)
    reasons = {str(f.reason) for f in model.plan.float_nodes}
    assert "filtered by module name" in reasons
    text = report(model, tmp_path / "r.html").read_text()
    assert "filtered by module name" in text and "<td>linear</td>" in text


def test_numeric_suite_table_from_a_frame_or_an_object_with_df(
    prepared, page, tmp_path, no_histograms
):
    assert "Numeric suite" in page and "conv&lt;1&gt;" in page and "22.25" in page

    class Suite:
        df = _FRAME

    assert "31.5" in report(prepared, tmp_path / "b.html", ns=Suite()).read_text()
    assert "Numeric suite" not in report(prepared, tmp_path / "c.html").read_text()


def test_text_is_escaped(page):
    text = page
    assert "&lt;b&gt;mine &amp; yours&lt;/b&gt;" in text and "<b>mine" not in text


def test_converted_model_has_graph_and_plan_but_no_histograms(prepared, tmp_path):
    converted = qviz.convert_pt2e(_prepared())
    text = report(converted, tmp_path / "q.html").read_text()
    assert "stage: converted" in text and "<svg" in text and "qparams" in text
    assert "data:image/png" not in text and "no observers" in text
    assert "scale " in text  # the plan's qparams in the group table
    assert _external_refs(text) == [] and not _EXTERNAL.search(text)


def test_uncalibrated_model_notes_instead_of_failing(tmp_path):
    text = report(_prepared(calibrate=False), tmp_path / "u.html").read_text()
    assert "No range overview" in text and "Saw no data" in text
    assert "data:image/png" not in text


def test_big_graph_is_collapsed_and_histograms_are_capped(prepared, tmp_path, monkeypatch):
    monkeypatch.setattr(report_module, "_BIG_GRAPH", 5)
    monkeypatch.setattr(report_module, "_MAX_HISTOGRAMS", 2)
    text = report(prepared, tmp_path / "r.html").read_text()
    assert "modules are collapsed to depth 2" in text
    assert "more HistogramObserver groups are left out" in text
    assert text.count("<figure>") == 3


def test_errors(prepared, tmp_path):
    with pytest.raises(ConfigError, match=r"prepare_pt2e.*convert_pt2e"):
        report(digits_model(), tmp_path / "r.html")
    float_gm = qviz.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),))
    with pytest.raises(ConfigError, match=r"without \.plan"):
        report(float_gm, tmp_path / "r.html")
    with pytest.raises(ConfigError, match="does not exist"):
        report(prepared, tmp_path / "missing" / "r.html")
    with pytest.raises(ConfigError, match="is a folder"):
        report(prepared, tmp_path)
    with pytest.raises(ConfigError, match="DataFrame"):
        report(prepared, tmp_path / "r.html", ns=[1, 2])
    assert not (tmp_path / "r.html").exists()


def test_a_numeric_report_of_another_model_is_refused(tmp_path):
    """Rule 14: a report names the model it measured; another model's is an error, not a
    partial match on node names."""
    import copy

    from tests.helpers.two_models import two_models

    models = two_models()
    large = models.large
    with pytest.raises(ConfigError, match=r"report\(ns=...\).*another model.*\(1 operator\).*"
                       r"\(2 operators\).*qviz.numeric.compare on this model"):  # fmt: skip
        report(large.quantized, tmp_path / "r.html", ns=models.small.report)
    assert not (tmp_path / "r.html").exists()
    report(copy.deepcopy(large.quantized), tmp_path / "r.html", ns=copy.deepcopy(large.report))
    assert "linear" in (tmp_path / "r.html").read_text()


def test_the_repair_transforms_applied_are_listed(tmp_path):
    """A model equalized before it was prepared: the report lists the transform per pair, with
    the nodes it changed, what and why, and its numbers, as the plan records them."""
    from qviz.engine.repair import cross_layer_equalization

    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU6(),
        torch.nn.Linear(8, 2),
    ).eval()  # fmt: skip
    gm = cross_layer_equalization(qviz.export(model, (torch.randn(3, 4),)))
    prepared = qviz.prepare_pt2e(
        gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    )
    records = prepared.plan.transforms
    assert records and "cross_layer_equalization" in str(prepared.plan)
    page = report_module.report(prepared, tmp_path / "r.html").read_text()
    section = page[page.index(f"Repair transforms: {len(records)}") :]
    for record in records:
        assert ", ".join(record.nodes) in section
        assert html_escape(record.detail) in section
