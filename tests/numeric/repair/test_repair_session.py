"""RepairSession: each step's "before" is the previous report, its "after" a pipeline run by hand
with the same remedy; undo gives back the very objects; failures change nothing."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.quantizers.override import OverrideQuantizer
from qviz.engine.repair import bias_correction, cross_layer_equalization
from qviz.errors import ConfigError, QvizError
from qviz.numeric import RepairSession, compare


def _planted():
    """linear -> relu -> linear whose first layer has four output channels 50x the others:
    one per-tensor weight scale starves the rest (cross-layer equalization's case)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    with torch.no_grad():
        model[0].weight[:4] *= 50
        model[0].bias[:4] *= 50
    gen = torch.Generator().manual_seed(1)
    calibration = [torch.randn(32, 16, generator=gen) for _ in range(3)]
    data = [torch.randn(32, 16, generator=gen) for _ in range(3)]
    return qviz.export(model, (data[0],)), calibration, data


def _quantizer():
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=False))


def _manual(gm, quantizer, calibration, data):
    """prepare -> calibrate -> convert -> compare, by hand."""
    prepared = qviz.prepare_pt2e(gm, quantizer)
    qviz.calibrate(prepared, calibration, progress=False)
    converted = qviz.convert_pt2e(prepared)
    return converted, compare(gm, converted, data, progress=False)


def _same(a, b):
    assert np.array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float), equal_nan=True)


@pytest.fixture(scope="module")
def planted():
    return _planted()


@pytest.fixture
def session(planted):
    gm, calibration, data = planted
    return RepairSession(gm, _quantizer(), calibration, data, progress=False)


def test_baseline_is_the_manual_pipeline(planted, session):
    gm, calibration, data = planted
    _, report = _manual(gm, _quantizer(), calibration, data)
    assert session.report is session.baseline and session.history == ()
    _same(session.report.df["local_sqnr"], report.df["local_sqnr"])
    assert session.report.output_sqnr == report.output_sqnr
    assert len(session.diagnosis) > 0  # the planted outliers are found


def test_equalization_improves_and_matches_a_manual_run(planted, session):
    gm, calibration, data = planted
    base = session.report
    step = session.apply("cross_layer_equalization")
    assert step.output_sqnr_after > step.output_sqnr_before + 1.0
    kinds = [r.kind for r in session.transforms]
    assert kinds and set(kinds) == {"cross_layer_equalization"}
    assert step.transforms == session.transforms
    df = step.df
    # before: the baseline's numbers exactly
    assert list(df["node"]) == list(base.df["node"])
    _same(df["local_sqnr_before"], base.df["local_sqnr"])
    _same(df["cumulative_sqnr_before"], base.df["cumulative_sqnr"])
    assert step.output_sqnr_before == base.output_sqnr
    # after: an independent run of the same remedy
    equalized = cross_layer_equalization(gm)
    converted, report = _manual(equalized, _quantizer(), calibration, data)
    _same(df["local_sqnr_after"], report.df["local_sqnr"])
    _same(df["cumulative_sqnr_after"], report.df["cumulative_sqnr"])
    assert step.output_sqnr_after == report.output_sqnr
    x = data[0]
    assert torch.equal(session.quantized_model(x)[0], converted(x)[0])


def test_undo_restores_the_same_objects(session):
    base_report, base_model = session.report, session.quantized_model
    base_diagnosis = session.diagnosis
    session.apply("cross_layer_equalization")
    first_report, first_model = session.report, session.quantized_model
    session.apply("fallback", nodes="linear_1")
    assert "linear_1" not in set(session.report.df["node"])
    assert session.undo() is session
    assert session.report is first_report and session.quantized_model is first_model
    assert len(session.history) == 1
    session.undo()
    assert session.report is base_report and session.quantized_model is base_model
    assert session.diagnosis is base_diagnosis and session.history == ()
    with pytest.raises(ConfigError, match="no remedy to undo"):
        session.undo()


def test_stages_run_in_a_fixed_order(planted, session):
    """bias correction applied before equalization still runs after convert, on the equalized
    model; the plan lists equalization first."""
    gm, calibration, data = planted
    session.apply("bias_correction")
    step = session.apply("cross_layer_equalization")
    kinds = [r.kind for r in session.transforms]
    first_bc = kinds.index("bias_correction")
    assert set(kinds[:first_bc]) == {"cross_layer_equalization"}
    assert set(kinds[first_bc:]) == {"bias_correction"}
    equalized = cross_layer_equalization(gm)
    converted, _ = _manual(equalized, _quantizer(), calibration, data)
    corrected = bias_correction(converted, equalized, calibration)
    report = compare(equalized, corrected, data, progress=False)
    assert step.output_sqnr_after == report.output_sqnr
    _same(step.df["local_sqnr_after"], report.df["local_sqnr"])


def test_applying_a_finding(planted, session):
    gm, calibration, data = planted
    findings = {f.prescription.function.rsplit(".", 1)[-1]: f for f in session.diagnosis}
    override = findings["OverrideQuantizer"]
    step = session.apply(override)
    assert step.remedy == "override"
    edits = dict(override.prescription.arguments)["overrides"]
    _, report = _manual(gm, OverrideQuantizer(_quantizer(), edits), calibration, data)
    assert step.output_sqnr_after == report.output_sqnr
    _same(step.df["local_sqnr_after"], report.df["local_sqnr"])
    (edge,) = edits
    assert session.prepared_model.plan.group_of(edge).spec.qscheme.startswith("per_channel")
    session.undo()
    cle = findings["cross_layer_equalization"]
    step = session.apply(cle)
    assert step.remedy == "cross_layer_equalization" and step.scope == ("linear", "linear_1")
    assert step.output_sqnr_after > step.output_sqnr_before


def test_per_channel_equals_its_override(planted, session):
    gm, calibration, data = planted
    step = session.apply("per_channel", nodes=["linear"])
    linear = next(n for n in gm.graph.nodes if n.name == "linear")
    edits = {f"{linear.args[1].name} -> linear": {"qscheme": "per_channel_symmetric", "ch_axis": 0}}
    _, report = _manual(gm, OverrideQuantizer(_quantizer(), edits), calibration, data)
    assert step.output_sqnr_after == report.output_sqnr
    assert step.transforms == ()


def test_a_failing_remedy_changes_nothing(session):
    session.apply("cross_layer_equalization")
    report, model, history = session.report, session.quantized_model, session.history
    with pytest.raises(ConfigError, match=r"apply\('fallback'\).*session is unchanged.*nope"):
        session.apply("fallback", nodes="nope")
    with pytest.raises(QvizError, match=r"apply\('adaround'\)"):
        session.apply("adaround", iterations=0)
    with pytest.raises(ConfigError, match="unknown argument 'alpha'"):
        session.apply("cross_layer_equalization", alpha=0.5)
    with pytest.raises(ConfigError, match="closest"):
        session.apply("equalization")
    assert session.report is report and session.quantized_model is model
    assert session.history == history


def test_the_callers_graph_is_unchanged(planted):
    gm, calibration, data = planted
    code, state = gm.code, copy.deepcopy(gm.state_dict())
    s = RepairSession(gm, _quantizer(), calibration, data, progress=False)
    s.apply("cross_layer_equalization")
    with pytest.warns(UserWarning, match="smooth_quant skipped"):  # no LayerNorm to smooth
        s.apply("smooth_quant", alpha=0.5)
    s.apply("bias_correction")
    assert gm.code == code
    assert state.keys() == gm.state_dict().keys()
    assert all(torch.equal(v, gm.state_dict()[k]) for k, v in state.items())


def test_views(session):
    step = session.apply("cross_layer_equalization")
    html = session._repr_html_()
    assert "baseline" in html and "cross_layer_equalization" in html
    assert f"{step.output_sqnr_after:.3g} dB" in html and f"{step.delta:+.3g} dB" in html
    assert step.remedy in step._repr_html_() and "cumulative Δ" in step._repr_html_()
    assert "cross_layer_equalization" in repr(session) and "RepairStep(" in repr(step)
    assert set(step.df.columns) >= {"local_delta", "cumulative_delta"}


def test_an_adaround_prescription_rounds_only_its_layer(planted, session):
    """AdaRound from a finding acts on the layer the finding named (its ``nodes``), as
    ``adaround(..., nodes=...)`` run by hand on the same converted model does."""
    from qviz.engine.repair import adaround
    from qviz.numeric.diagnose.rules import Prescription

    gm, calibration, _ = planted
    prescription = Prescription(
        "learn the rounding of linear_1", "qviz.engine.repair.adaround", (("nodes", ("linear_1",)),)
    )
    converted = session.quantized_model
    step = session.apply(prescription, iterations=30)
    assert step.remedy == "adaround" and step.scope == ("linear_1",)
    assert [r.nodes for r in step.transforms] == [("linear_1",)]
    by_hand = adaround(converted, gm, calibration, iterations=30, nodes="linear_1", progress=False)
    for key, value in by_hand.state_dict().items():
        assert torch.equal(session.quantized_model.state_dict()[key], value), key
