"""NumericDashboard without a kernel: find the broken layer, look at it, fall it back, check."""

from __future__ import annotations

import html
import math
import shutil

import numpy as np
import pytest
import torch

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import ConfigError
from qviz.numeric import compare, sqnr
from qviz.numeric.compare.detail import layer_detail
from qviz.widgets.dashboard import NumericDashboard

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs graphviz's dot")


def agreement(float_out, quant_out, target):
    """Share of samples where the quantized model picks the float model's class."""
    return float((quant_out.argmax(1) == float_out.argmax(1)).float().mean())


@pytest.fixture(scope="module")
def broken(make_broken_model):
    """conv2 holds one huge weight (on a dead input channel): per-tensor weights ruin it."""
    model = make_broken_model()
    data = [torch.randn(16, 3, 12, 12) for _ in range(3)]
    gm = qviz.export(model, (data[0],), dynamic_batch=True)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = qviz.calibrate(qviz.prepare_pt2e(gm, quantizer), data, progress=False)
    quantized = qviz.convert_pt2e(prepared)
    report = compare(gm, quantized, data, metric=agreement, progress=False)
    return gm, quantizer, data, quantized, report


def _dashboard(broken, *, graph=False, quantizer=True):
    gm, q, data, quantized, report = broken
    return NumericDashboard(
        report, quantized_model=quantized, float_model=gm, data=data,
        quantizer=q if quantizer else None, metric=agreement, graph=graph,
    )  # fmt: skip


def test_opens_on_the_worst_layer_and_sorts_worst_first(broken):
    dash = _dashboard(broken)
    report = broken[-1]
    assert dash.state.selected == "conv2d_1" and dash.error is None
    assert dash.rows[0]["node"] == "conv2d_1"  # by local SQNR
    assert [r["node"] for r in dash.sort("graph").rows] == report.df["node"].tolist()
    cumulative = [r["cumulative_sqnr"] for r in dash.sort("cumulative_sqnr").rows]
    assert cumulative == sorted(cumulative)  # low SQNR is bad: ascending
    mse = [r["cumulative_mse"] for r in dash.sort("cumulative_mse").rows]
    assert mse == sorted(mse, reverse=True)  # high MSE is bad: descending
    assert dash.view.rows.options[0][1] == dash.rows[0]["node"]  # the control follows
    assert "conv2d_1" in dash.view.rows.options[0][0]


def test_errors_keep_the_state_and_say_why(broken):
    dash = _dashboard(broken, quantizer=False)
    before = dash.state
    dash.select("conv2d_9")
    assert dash.state == before and "not a layer" in dash.error and "conv2d_1" in dash.error
    assert "⚠" in dash.view.status.value
    dash.toggle_fallback()
    assert dash.state == before and "pass quantizer=" in dash.error
    dash.sort("speed")
    assert dash.state == before and "choose one of" in dash.error
    dash.color_by("speed")
    assert dash.state == before and "colour by" in dash.error
    dash.select("relu")
    assert dash.error is None and dash.state.selected == "relu"
    with pytest.raises(ConfigError, match="not a layer"):
        dash.detail("nothing")


def test_detail_shows_the_layer_outputs_the_report_measured(broken):
    gm, _, data, quantized, _ = broken
    one = compare(gm, quantized, data[:1], progress=False)  # the detail's sample batch
    dash = _dashboard(broken)
    for node, expected in zip(one.df["node"], one.df["cumulative_sqnr"], strict=True):
        detail = dash.detail(node)
        assert detail.sqnr == pytest.approx(expected, abs=0.05), node
    detail = dash.detail("conv2d_1")
    assert detail.numel == 16 * 8 * 12 * 12 and len(detail.float_values) == 5000
    # the points are float and quantized values of the same positions: their SQNR matches
    assert sqnr(torch.from_numpy(detail.float_values), torch.from_numpy(detail.quantized_values)
                ) == pytest.approx(detail.sqnr, abs=1.5)  # fmt: skip
    assert detail.error_counts.sum() == detail.numel and len(detail.error_edges) == 61
    fig = detail.plot()
    scatter, hist = fig.axes
    offsets = scatter.collections[0].get_offsets()
    assert np.allclose(offsets[:, 0], detail.float_values)
    assert np.allclose(offsets[:, 1], detail.quantized_values)
    assert "SQNR" in hist.get_title() and dash.view.detail.value[:4] == b"\x89PNG"
    # drawn at twice the size it is shown at (80 px per inch): sharp, never stretched
    image = dash.view.detail
    width, height = (round(v * 80) for v in fig.get_size_inches())
    assert (image.layout.width, image.layout.height) == (f"{width}px", "auto")
    assert int.from_bytes(image.value[16:20], "big") == 2 * width
    assert int.from_bytes(image.value[20:24], "big") == 2 * height


def test_fallback_restores_the_model_and_toggling_back_restores_the_plan(broken):
    _, _, _, quantized, report = broken
    dash = _dashboard(broken)
    dash.view.fallback.value = True  # the button: falls back the selected layer, conv2d_1
    assert dash.error is None and dash.state.fallback == ("conv2d_1",)
    assert (
        dash.view.progress.value == dash.view.progress.max == 6
    )  # 3 calibration + 3 compare batches
    first, after = dash.history
    assert first == {
        "fallback": [],
        "output_sqnr": report.output_sqnr,
        "metric": report.metric,
        "remedy": "",
    }
    assert after["fallback"] == ["conv2d_1"]
    assert after["output_sqnr"] > first["output_sqnr"] + 20.0
    assert after["metric"] >= first["metric"]
    plan = dash.quantized_model.plan
    assert [(f.node, f.reason.value) for f in plan.float_nodes] == [("conv2d_1", "user fallback")]
    row = next(r for r in dash.rows if r["node"] == "conv2d_1")
    assert row["fallback"] and math.isnan(row["local_sqnr"])
    assert "in float" in dash.view.rows.options[-1][0]  # NaN rows last
    assert "→" in dash.view.history.value and "conv2d_1" in dash.view.history.value
    assert dash.detail("conv2d_1").in_float  # in float now: only inherited error left
    dash.toggle_fallback("conv2d_1")
    assert dash.state.fallback == () and dash.quantized_model is quantized
    assert dash.report is report and len(dash.history) == 3
    assert dash.history[-1]["output_sqnr"] == first["output_sqnr"]
    assert dash.view.fallback.value is False


def test_fallback_of_an_unknown_layer_keeps_the_state(broken):
    dash = _dashboard(broken)
    before = dash.state
    dash.toggle_fallback("conv")
    assert dash.state == before and "not a layer" in dash.error


def test_report_alone_shows_the_table(broken):
    report = broken[-1]
    dash = NumericDashboard(report)
    assert dash.view.graph is None and len(dash.rows) == len(report.df)
    assert "from_models" in dash.view.detail_note.value
    with pytest.raises(ConfigError, match="from_models"):
        dash.detail()
    dash.toggle_fallback()
    assert "quantizer" in dash.error
    with pytest.raises(ConfigError, match="NumericReport"):
        NumericDashboard(report.df)


@needs_dot
def test_graph_heatmap_and_clicks_select_rows(broken):
    dash = _dashboard(broken, graph=True)
    svg = dash.view.graph.svg
    assert svg.startswith("<svg") and "local_sqnr" in svg
    assert dash.view.graph.selected == "conv2d_1"
    dash.view.graph.module_click = {"path": "conv2", "n": 1}  # a click on a module: it folds
    assert "module/conv2" in dash.view.graph.svg
    dash.view.graph.module_click = {"path": "conv2", "n": 2}
    assert "module/conv2" not in dash.view.graph.svg
    dash.view.graph.selected = "relu_2"  # a click on a node
    assert dash.state.selected == "relu_2" and dash.view.rows.value == "relu_2"
    nodes = {n.name: n for n in dash.quantized_model.graph.nodes}
    conv = nodes["conv2d_1"]
    output_dq = next(iter(next(iter(nodes["relu"].users)).users))  # relu -> q -> dq
    dash.view.graph.selected = output_dq.name  # a q/dq node stands for the operator it follows
    assert dash.state.selected == "relu", output_dq.name
    dash.view.graph.selected = conv.args[1].name  # the weight's dequantize: the conv it feeds
    assert dash.state.selected == "conv2d_1" and dash.error is None
    dash.select("relu")
    dash.view.graph.selected = "relu -> conv2d_1"  # an edge: its consumer
    assert dash.state.selected == "conv2d_1"
    dash.view.color_by.value = "cumulative_sqnr"
    assert dash.state.color_by == "cumulative_sqnr" and dash.view.graph.svg != svg
    dash.color_by("cumulative_mse")  # an error: the legend says low is green
    assert "mse: low (green) to high (red)" in dash.view.graph.svg
    dash.view.rows.value = "linear"  # a click on a row
    assert dash.state.selected == "linear" and dash.view.graph.selected == "linear"


def test_from_models_on_the_digits_model():
    from qviz.data import digits_loaders, digits_model

    images, labels = next(iter(digits_loaders(batch_size=64).test))
    data = [(images, labels)]
    gm = qviz.export(digits_model(), (images,), dynamic_batch=True)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    quantized = qviz.convert_pt2e(
        qviz.calibrate(qviz.prepare_pt2e(gm, quantizer), [images], progress=False)
    )

    def accuracy(float_out, quant_out, target):
        return float((quant_out.argmax(1) == target).float().mean())

    dash = NumericDashboard.from_models(
        digits_model(), quantized, data, metric=accuracy, quantizer=quantizer, progress=False,
        graph=False,
    )  # fmt: skip
    assert len(dash.rows) == 15 and dash.history[0]["metric"] > 0.9
    worst = dash.state.selected
    assert worst == dash.report.worst(1)["node"].item()
    expected = dash.report.df.set_index("node").loc[worst, "cumulative_sqnr"]
    assert dash.detail().sqnr == pytest.approx(expected, abs=0.05)  # one batch: the same batch
    direct = layer_detail(dash.float_model, quantized, worst, (images,))
    assert direct.sqnr == dash.detail().sqnr


def test_the_report_of_another_model_is_refused():
    """Rule 14: the dashboard shows a report with the model it measured, not another model
    whose node names happen to coincide."""
    import copy

    from tests.helpers.two_models import two_models

    models = two_models()
    large = models.large
    with pytest.raises(ConfigError, match=r"NumericDashboard.*another model.*\(1 operator\).*"
                       r"\(2 operators\).*qviz.numeric.compare on this model"):  # fmt: skip
        NumericDashboard(models.small.report, quantized_model=large.quantized)
    dash = NumericDashboard(
        copy.deepcopy(large.report), quantized_model=copy.deepcopy(large.quantized)
    )
    assert len(dash.rows) == 2


@needs_dot
def test_the_lowering_error_beside_the_quantization_error(broken):
    """With the lowered model and its comparison, the graph marks each op's kernel and can be
    coloured by steps from the reference; a fallback run (another model) drops both."""
    pytest.importorskip("onnxruntime")
    from qviz.numeric import compare_lowered

    gm, q, data, quantized, report = broken
    lowered = qviz.lower(quantized, (data[0],), backend="onnxruntime")
    lowering = compare_lowered(quantized, lowered, data)
    dash = NumericDashboard(
        report, quantized_model=quantized, float_model=gm, data=data, quantizer=q,
        metric=agreement, lowered=lowered, lowering=lowering,
    )  # fmt: skip
    assert "integer kernel: QLinearConv" in dash.view.graph.svg  # the partition, on SQNR colours
    assert "steps from reference (lowered)" in dash.view.color_by.options
    dash.view.color_by.value = "steps from reference (lowered)"
    svg = dash.view.graph.svg
    assert "steps from reference" in svg and "integer kernel" in svg
    dash.toggle_fallback("conv2d_1")
    assert dash.error is None and "integer kernel" not in dash.view.graph.svg
    plain = _dashboard(broken)
    assert plain.color_by("steps from reference (lowered)").error.startswith("colour by")
    x = torch.randn(4, 3)
    small = qviz.export(torch.nn.Linear(3, 2).eval(), (x,))
    small = qviz.prepare_pt2e(small, q)
    qviz.calibrate(small, x, progress=False)
    other = qviz.lower(qviz.convert_pt2e(small), (x,), backend="onnxruntime")
    with pytest.raises(ConfigError, match=r"NumericDashboard\(lowered=\.\.\.\)"):
        NumericDashboard(report, quantized_model=quantized, lowered=other)


@needs_dot
def test_a_repair_session_dashboard_applies_the_prescription_and_undoes_it(broken):
    """from_session: the broken layer's diagnosis with its prescription; "apply" rebuilds and
    re-measures (the graph and table show the new model), "undo" brings back the same report
    object; the graph colours by cause; the caller's float graph is never changed."""
    from qviz.numeric import RepairSession
    from qviz.numeric.diagnose.rules import CAUSE_COLOURS, Cause

    gm, quantizer, data, _, _ = broken
    before_state = {k: v.clone() for k, v in gm.state_dict().items()}
    session = RepairSession(gm, quantizer, data, data, metric=agreement, progress=False)
    dash = NumericDashboard.from_session(session)
    assert "cause" in dash.color_options
    assert dash.state.selected == "conv2d_1"  # the worst layer
    finding = dash.finding()
    assert finding.cause is Cause.OUTLIER_CHANNELS
    view = dash.view
    assert "outlier channels" in view.diagnosis.value
    assert html.escape(finding.prescription.action)[:40] in view.diagnosis.value
    assert html.escape(finding.verdict) in view.diagnosis.value
    baseline = session.report
    dash.color_by("cause")
    assert dash.error is None
    assert "cause: outlier channels" in view.graph.svg
    assert CAUSE_COLOURS[Cause.OUTLIER_CHANNELS] in view.graph.svg

    dash.apply()  # the selected layer's prescription
    assert dash.error is None and len(session.history) == 1
    step = session.history[-1]
    assert step.output_sqnr_after > step.output_sqnr_before + 10
    assert dash.report is session.report is not baseline
    assert dash.history[-1] == {"fallback": [], "output_sqnr": step.output_sqnr_after,
                                "metric": step.metric_after, "remedy": step.remedy}  # fmt: skip
    assert "after <b>override</b>" in view.diagnosis.value
    local = session.report.df.set_index("node")["local_sqnr"]
    row = next(r for r in dash.rows if r["node"] == "conv2d_1")  # the table shows the new model
    assert (
        row["local_sqnr"]
        == local["conv2d_1"]
        > baseline.df.set_index("node")["local_sqnr"]["conv2d_1"]
    )
    assert [v for _, v in view.rows.options] == [r["node"] for r in dash.rows]
    delta = step.df.set_index("node")["cumulative_delta"]["conv2d_1"]
    assert row["cumulative_delta"] == delta > 10  # the last remedy's change, per layer
    assert f"{delta:+.2f}" in dict((v, k) for k, v in view.rows.options)["conv2d_1"]
    assert "Δcumul" in view.header.value
    assert view.rows.value == dash.state.selected

    dash.undo()
    assert dash.error is None and dash.report is baseline and not session.history
    assert all("cumulative_delta" not in r for r in dash.rows) and "Δ" not in view.header.value
    assert [r["remedy"] for r in dash.history] == ["", "override", "undo override"]
    assert dash.history[-1]["output_sqnr"] == dash.history[0]["output_sqnr"]
    dash.undo()
    assert "no remedy" in dash.error and len(dash.history) == 3
    dash.toggle_fallback()
    assert "apply('fallback')" in dash.error
    dash.apply("fallback")
    assert dash.error is None and "conv2d_1" not in set(session.report.df["node"])
    assert dash.state.selected in set(session.report.df["node"])  # moved to a layer it has
    for key, value in gm.state_dict().items():
        assert torch.equal(value, before_state[key]), key
