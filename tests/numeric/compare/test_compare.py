"""qviz.numeric.compare on the embedded digits model: the report's numbers, views and errors."""

import math

import pytest
import torch
from torch import nn

import qviz
from qviz.data import digits_loaders, digits_model, evaluate
from qviz.engine.quantizers import get_symmetric_quantization_config
from qviz.errors import ConfigError
from qviz.numeric import NumericReport, compare, compare_configs, fallback, sensitivity, sqnr
from tests.helpers.quantize import quantize, xnnpack


@pytest.fixture(scope="module")
def digits():
    model = digits_model()
    loaders = digits_loaders(batch_size=64)
    calib = [x for x, _ in loaders.calibration]
    quantizer = xnnpack(per_channel=True)
    gm, _, quantized = quantize(model, calib, quantizer, dynamic_batch=True)
    test = list(loaders.test)
    return model, gm, quantizer, quantized, test


def accuracy(float_out, quant_out, target):
    return float((quant_out.argmax(1) == target).float().mean())


@pytest.fixture(scope="module")
def report(digits):
    _, gm, _, quantized, test = digits
    return compare(gm, quantized, test, metric=accuracy, progress=False)


def test_one_row_per_quantized_operator_in_graph_order(digits, report):
    _, _, _, quantized, _ = digits
    order = [n.name for n in quantized.graph.nodes]
    nodes = report.df["node"].tolist()
    assert nodes == sorted(nodes, key=order.index)
    assert {"conv2d", "add", "max_pool2d", "adaptive_avg_pool2d", "linear"} <= set(nodes)
    assert len(nodes) == 15 and report.samples == 360 and report.batches == 6
    assert report.df["handle"].is_unique


def test_model_figures_match_a_direct_computation(digits, report):
    _, gm, _, quantized, test = digits
    images = torch.cat([x for x, _ in test])
    with torch.no_grad():
        direct = sqnr(gm(images), quantized(images))
    assert report.output_sqnr == pytest.approx(direct, abs=1e-6)
    assert report.metric == pytest.approx(evaluate(quantized, test), abs=1e-9)


def test_first_operator_local_equals_cumulative(report):
    first = report.df.iloc[0]  # its input is the model input: no inherited error
    assert first["node"] == "conv2d"
    assert first["local_sqnr"] == pytest.approx(first["cumulative_sqnr"], abs=1e-9)


def test_local_is_never_much_worse_than_cumulative_on_a_healthy_model(report):
    df = report.df
    assert (
        df["local_sqnr"] >= df["cumulative_sqnr"] - 1.0
    ).all()  # error accumulates along the graph
    assert (df["local_sqnr"] > 35.0).all() and (df["cumulative_cosine"] > 0.999).all()


def test_grid_columns_read_the_output_quantization(digits, report):
    _, _, _, quantized, _ = digits
    df = report.df.set_index("node")
    plan = quantized.plan
    relu = df.loc["relu"]  # the stem's output: quantized, with the plan's qparams
    qp = plan.group_of("relu").qparams
    assert relu["grid_min"] == pytest.approx(qp.scale * (-128 - qp.zero_point))
    assert relu["grid_max"] == pytest.approx(qp.scale * (127 - qp.zero_point))
    assert relu["float_min"] == 0.0 and relu["float_max"] > relu["grid_max"]  # l2 clips a tail
    assert 0.15 < relu["rmse_scale"] < 0.45  # about rounding noise, 1/sqrt(12) = 0.29
    assert math.isnan(df.loc["conv2d", "rmse_scale"])  # conv -> relu: conv's output not quantized


def test_weight_sqnr_is_measured_against_the_folded_float_weight(report):
    df = report.df.set_index("node")
    assert df.loc["conv2d", "weight_sqnr"] > 40.0  # stem conv: BatchNorm folded in
    assert df.loc["linear", "weight_sqnr"] > 40.0
    assert df["weight_sqnr"].notna().sum() == 6  # five convs and the linear
    assert math.isnan(df.loc["add", "weight_sqnr"])


def test_streaming_equals_one_big_batch(digits, report):
    _, gm, _, quantized, test = digits
    big = [(torch.cat([x for x, _ in test]), torch.cat([y for _, y in test]))]
    one = compare(gm, quantized, big, metric=accuracy, progress=False)
    for col in (
        "cumulative_sqnr",
        "local_sqnr",
        "cumulative_mse",
        "cumulative_max_abs_err",
        "clipped",
        "rmse_scale",
    ):
        a, b = report.df[col].to_numpy(), one.df[col].to_numpy()
        assert a == pytest.approx(b, rel=1e-5, abs=1e-9, nan_ok=True), col
    assert one.metric == pytest.approx(report.metric)


def test_compare_each_runs_the_float_model_once_per_batch_and_equals_compare(
    digits, report, monkeypatch
):
    """Several quantized models against one float run per batch: each report is compare's,
    bit for bit (compare_configs measures its configs this way)."""
    import sys

    import pandas as pd

    from qviz.numeric import compare_each

    compare_module = sys.modules["qviz.numeric.compare.compare"]  # the name is the function

    _, gm, _, quantized, test = digits
    calibrated = qviz.calibrate(qviz.prepare_pt2e(gm, xnnpack()), [x for x, _ in test[:2]],
                                progress=False)  # fmt: skip
    per_tensor = qviz.convert_pt2e(calibrated)
    alone = compare(gm, per_tensor, test, metric=accuracy, progress=False)
    runs = []
    real_run = compare_module.FloatRun.run
    monkeypatch.setattr(compare_module.FloatRun, "run",
                        lambda self, *a: runs.append(1) or real_run(self, *a))  # fmt: skip
    both = compare_each(gm, [quantized, per_tensor], test, metric=accuracy, progress=False)
    assert len(runs) == len(test)  # not once per batch and model
    for mine, reference in zip(both, [report, alone], strict=True):
        pd.testing.assert_frame_equal(mine.df, reference.df, check_exact=True)
        assert (mine.output_sqnr, mine.metric) == (reference.output_sqnr, reference.metric)
    with pytest.raises(ConfigError, match="at least one quantized model"):
        compare_each(gm, [], test)
    with pytest.raises(ConfigError, match=r"quantized_models\[1\]"):
        compare_each(gm, [quantized, gm], test)


@pytest.mark.parametrize("per_channel", [True, False])
def test_fused_quantize_dequantize_pairs_give_the_reference_ops_report_bit_for_bit(
    digits, per_channel, monkeypatch
):
    """compare computes each per-tensor quantize / dequantize pair as one exact fake_quantize
    (in the quantized run and in every local replay): the report is the one the reference
    operators give, bit for bit, on a model with residual adds and a pool that shares its
    input's grid."""
    import sys

    import pandas as pd

    compare_module = sys.modules["qviz.numeric.compare.compare"]
    _, gm, _, quantized, test = digits
    if not per_channel:
        calibrated = qviz.calibrate(qviz.prepare_pt2e(gm, xnnpack()), [x for x, _ in test[:2]],
                                    progress=False)  # fmt: skip
        quantized = qviz.convert_pt2e(calibrated)
    assert len(compare_module.fusable_quantizes(quantized)) > 10
    fused = compare(gm, quantized, test, metric=accuracy, progress=False)
    monkeypatch.setattr(compare_module, "fusable_quantizes", lambda gm: set())
    reference = compare(gm, quantized, test, metric=accuracy, progress=False)
    pd.testing.assert_frame_equal(fused.df, reference.df, check_exact=True)
    assert (fused.output_sqnr, fused.metric) == (reference.output_sqnr, reference.metric)


def test_the_float_module_itself_gives_the_same_report(digits, report):
    model, _, _, quantized, test = digits
    again = compare(model, quantized, test, progress=False)  # exported inside, same handles
    assert again.df["cumulative_sqnr"].to_numpy() == pytest.approx(
        report.df["cumulative_sqnr"].to_numpy()
    )


def test_report_views(tmp_path, report):
    worst = report.worst(3, by="cumulative_sqnr")
    assert worst["cumulative_sqnr"].is_monotonic_increasing and len(worst) == 3
    with pytest.raises(ConfigError, match="not a numeric column"):
        report.worst(by="node")
    fig = report.plot()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == report.df["node"].tolist()
    assert len(fig.axes[0].get_yticklabels()) == 15
    assert [t.get_text() for t in report.plot(top=3).axes[0].get_yticklabels()] == sorted(
        report.worst(3)["node"], key=labels.index
    )
    html = report._repr_html_()
    assert "output SQNR" in html and "<table" in html and "local_sqnr" in html
    path = tmp_path / "ns.csv"
    report.to_csv(path)
    text = path.read_text().splitlines()
    assert text[0].startswith("# output_sqnr_db=") and text[2].startswith("node,op,module")
    assert "NumericReport(15 quantized ops, 360 samples" in repr(report)


def test_graph_heatmap_reads_the_report(digits, report):
    from qviz.viz import graph

    _, _, _, quantized, _ = digits
    g = graph(quantized, metrics=report)
    worst = report.worst(1).iloc[0]
    assert g.view.metric == "local_sqnr"
    assert f"local_sqnr {worst['local_sqnr']:.3g}" in g.dot


def test_inplace_relu_does_not_corrupt_the_recorded_output():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3)
    data = [torch.randn(4, 3, 12, 12) for _ in range(2)]

    def build(inplace):
        model = nn.Sequential(conv, nn.ReLU(inplace=inplace))
        gm, _, converted = quantize(model, data, per_channel=False)
        return compare(gm, converted, data, progress=False).df

    inplace, plain = build(True), build(False)
    assert inplace["op"].tolist() == ["conv2d", "relu_"] and plain["op"][1] == "relu"
    # the conv is compared before relu_ overwrites its output, exactly as without in-place
    assert inplace["cumulative_sqnr"].to_numpy() == pytest.approx(
        plain["cumulative_sqnr"].to_numpy(), abs=1e-9
    )
    assert inplace["cumulative_sqnr"].iloc[0] > 30.0


def test_bad_input_gets_a_clear_error(digits):
    model, gm, quantizer, quantized, test = digits
    with pytest.raises(ConfigError, match=r"got a float GraphModule.*qviz\.convert_pt2e"):
        compare(gm, gm, test, progress=False)
    with pytest.raises(ConfigError, match=r"takes the model qviz\.convert_pt2e returned"):
        compare(gm, model, test, progress=False)
    other = qviz.export(nn.Sequential(nn.Linear(64, 10)).eval(), (torch.randn(2, 64),))
    with pytest.raises(ConfigError, match="prepared from another float model"):
        compare(other, quantized, test, progress=False)
    with pytest.raises(ConfigError, match="at least one batch"):
        compare(gm, quantized, [], progress=False)
    with pytest.raises(ConfigError, match="metric must be a function"):
        compare(gm, quantized, test, metric="accuracy", progress=False)
    with pytest.raises(ConfigError, match="DataLoader, an iterable of batches"):
        compare(gm, quantized, 3, progress=False)
    with pytest.raises(ConfigError, match="mode='both'"):
        sensitivity(gm, quantizer, test, mode="both")


WRONG_BATCHES = {
    "size": (
        [(torch.randn(4, 1, 9, 8), torch.zeros(4))],
        r"has shape \(4, 1, 9, 8\).*\(\*, 1, 8, 8\)",
    ),
    "dtype": ([(torch.randint(0, 5, (4, 1, 8, 8)), torch.zeros(4))], r"is torch.int64.*float32"),
}


@pytest.mark.parametrize("problem", sorted(WRONG_BATCHES))
def test_every_numeric_entry_point_names_a_batch_that_does_not_fit(digits, problem):
    """The same check everywhere: compare, sensitivity, compare_configs, the dashboard, evaluate."""
    from qviz.widgets import NumericDashboard

    _, gm, quantizer, quantized, test = digits
    bad, pattern = WRONG_BATCHES[problem]
    data = [test[0], *bad]  # the second batch is the bad one
    before = {k: v.clone() for k, v in quantized.state_dict().items()}
    calls = {
        "compare": lambda: compare(gm, quantized, data, progress=False),
        "sensitivity": lambda: sensitivity(gm, quantizer, data, progress=False),
        "compare_configs": lambda: compare_configs(
            gm, {"a": get_symmetric_quantization_config()}, data, progress=False
        ),
        "NumericDashboard.from_models": lambda: NumericDashboard.from_models(
            gm, quantized, data, progress=False
        ),
        "evaluate": lambda: evaluate(quantized, data),
    }
    for where, call in calls.items():
        with pytest.raises(ConfigError, match=rf"{where}: batch 1: input 0 \('x'\) {pattern}"):
            call()
    assert all(torch.equal(v, quantized.state_dict()[k]) for k, v in before.items())


def test_fallback_names_are_checked_against_the_graph(digits):
    _, gm, quantizer, _, _ = digits
    with pytest.raises(ConfigError, match=r"\['conv2d_9'\] name no operator.*closest"):
        qviz.prepare_pt2e(gm, fallback(quantizer, "conv2d_9"))
    with pytest.raises(ConfigError, match="node names or module paths"):
        fallback(quantizer, 3)


def test_fallback_of_a_shared_producer_keeps_its_consumers_quantized(digits):
    _, gm, quantizer, _, _ = digits
    # max_pool2d shares relu_2's observer (SharedQuantizationSpec(relu_2)); relu_2 falls back
    plan = qviz.prepare_pt2e(gm, fallback(quantizer, "relu_2")).plan
    assert [(f.node, f.reason.value) for f in plan.float_nodes] == [("relu_2", "user fallback")]
    pool_in = plan.group_of("relu_2", "max_pool2d")
    assert pool_in is not None and pool_in.spec.dtype == "int8"
    observed = {str(t.tensor) for t in plan.tensors}
    assert "relu_2" not in observed  # relu_2's own output is no longer observed


def test_sensitivity_with_a_metric_ranks_by_it(digits):
    _, gm, quantizer, _, test = digits
    df = sensitivity(gm, quantizer, test[:2], metric=accuracy, progress=False)
    assert df.attrs["ranked_by"] == "metric"
    assert df["metric"].is_monotonic_decreasing
    assert {"delta_metric", "delta_sqnr", "module"} <= set(df.columns)
    assert len(df) == 15


def test_report_from_plain_records():
    r = NumericReport.from_table([{"node": "a", "local_sqnr": 1.0, "cumulative_sqnr": 2.0}])
    assert list(r.df.columns)[:4] == ["node", "op", "module", "local_sqnr"]
    assert r.summary().startswith("1 quantized ops")


def test_html_report_shows_the_suite_and_colours_the_graph(digits, report, tmp_path):
    from qviz.viz import report as html_report

    _, _, _, quantized, _ = digits
    page = html_report(quantized, tmp_path / "r.html", ns=report).read_text()
    assert "local (own) and cumulative SQNR per operator" in page  # the bars, inline PNG
    assert "local_sqnr: fixed SQNR bands" in page  # the graph's legend: the same bands
    assert "≤ 10 dB" in page and "&gt; 40 dB" in page  # in every report
    assert report.summary() in page


def test_solo_mode_measures_each_operators_cost_against_float(digits):
    _, gm, quantizer, _, test = digits
    df = sensitivity(gm, quantizer, test[:2], metric=accuracy, mode="solo", progress=False)
    assert "delta_sqnr" not in df.columns
    float_accuracy = evaluate(gm, test[:2])
    assert df.attrs["float_metric"] == pytest.approx(float_accuracy)
    assert df["delta_metric"].to_numpy() == pytest.approx(df["metric"].to_numpy() - float_accuracy)
    assert df["metric"].is_monotonic_increasing  # the costliest operator first


def test_every_error_column_says_which_comparison_it_comes_from():
    from qviz.numeric.compare.report import COLUMNS

    errors = [c for c in COLUMNS if c.endswith(("sqnr", "mse", "cosine", "max_abs_err"))]
    assert errors and all(c.startswith(("local_", "cumulative_", "weight_")) for c in errors)
    r = NumericReport.from_table([{"node": "a", "local_sqnr": 1.0, "cumulative_sqnr": 2.0}])
    with pytest.raises(ConfigError, match="the cumulative one is named 'cumulative_sqnr'"):
        r.worst(1, by="sqnr")


def test_a_model_quantized_only_inside_a_loop_says_compare_reads_the_top_level():
    from tests.helpers.control_flow import ScanModel
    from tests.helpers.control_flow import reference_xnnpack_quantizer as _quantizer

    batches = [(torch.randn(3, 5), torch.zeros(5))]
    gm = torch.export.export(ScanModel().eval(), batches[0]).module()
    prepared = qviz.prepare_pt2e(gm, _quantizer())
    qviz.calibrate(prepared, batches, progress=False)
    with pytest.raises(ConfigError, match="inside loop bodies"):
        compare(gm, qviz.convert_pt2e(prepared), batches, progress=False)


@pytest.mark.parametrize("returned", ["abc", None, [0.5, 0.5], torch.ones(2)])
def test_a_metric_that_returns_no_number_is_named(returned):
    """Issue 25: a metric returning a string raised ValueError from float() deep in the sums."""
    x = torch.randn(4, 4)
    gm, _, quantized = quantize(nn.Sequential(nn.Linear(4, 4)), [x], per_channel=False)
    with pytest.raises(ConfigError, match=r"batch 0: the metric returned .*return a finite number"):
        compare(gm, quantized, [x], metric=lambda f, q, t: returned, progress=False)
    report = compare(gm, quantized, [x], metric=lambda f, q, t: torch.tensor(0.5), progress=False)
    assert report.metric == 0.5
