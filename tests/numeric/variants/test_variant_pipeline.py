"""THE variant pipeline: every entry point that builds a variant gets its batches from
variant_batches and builds it with prepare_variant / quantize_variant, so the same quantizer on the
same data gives the same model bit for bit wherever it is built."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import CalibrationError, ConfigError
from qviz.numeric import RepairSession, fallback
from qviz.numeric.variants.variants import prepare_variant, quantize_variant, variant_batches


def _model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    gen = torch.Generator().manual_seed(1)
    calibration = [torch.randn(16, 8, generator=gen) for _ in range(2)]
    data = [torch.randn(16, 8, generator=gen) for _ in range(2)]
    return qviz.export(model, (data[0],)), calibration, data


def _quantizer():
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config())


def _by_hand(gm, quantizer, calibration):
    prepared = qviz.prepare_pt2e(gm, quantizer)
    qviz.calibrate(prepared, calibration, progress=False)
    return qviz.convert_pt2e(prepared)


def _same_outputs(a, b, data):
    with torch.no_grad():
        return all(torch.equal(a(x), b(x)) for x in data)


def test_calibration_falls_back_to_the_data_and_is_checked_when_given():
    gm, calibration, data = _model_and_data()
    evaluation, same = variant_batches(data, None, gm, "demo")
    assert same is evaluation and len(evaluation) == 2
    evaluation, own = variant_batches(data, calibration, gm, "demo")
    assert own == calibration and evaluation == data
    with pytest.raises(ConfigError, match=r"demo\(calibration_data=\.\.\.\): batch 1"):
        variant_batches(data, [calibration[0], torch.randn(16, 5)], gm, "demo")
    with pytest.raises(CalibrationError, match=r"demo\(calibration_data=\.\.\.\): batch 0"):
        variant_batches(data, [torch.full((16, 8), float("nan"))], gm, "demo")
    with pytest.raises(CalibrationError, match="demo got no batches"):
        variant_batches([], calibration, gm, "demo")
    assert variant_batches([], None, gm, "demo", allow_empty=True) == ([], [])


def test_every_builder_builds_the_model_built_by_hand():
    gm, calibration, data = _model_and_data()
    by_hand = _by_hand(gm, _quantizer(), calibration)
    built = quantize_variant(gm, _quantizer(), calibration)
    assert _same_outputs(built, by_hand, data)
    prepared = prepare_variant(gm, _quantizer(), calibration)
    assert _same_outputs(qviz.convert_pt2e(prepared), by_hand, data)
    session = RepairSession(gm, _quantizer(), calibration, data, progress=False)
    assert _same_outputs(session.quantized_model, by_hand, data)


def test_a_session_without_calibration_data_calibrates_on_its_data():
    gm, _, data = _model_and_data()
    session = RepairSession(gm, _quantizer(), None, data, progress=False)
    assert _same_outputs(session.quantized_model, _by_hand(gm, _quantizer(), data), data)


def test_the_dashboards_fallback_is_the_pipelines_variant():
    from qviz.widgets import NumericDashboard

    gm, calibration, data = _model_and_data()
    quantized = quantize_variant(gm, _quantizer(), calibration)
    dash = NumericDashboard.from_models(
        gm, quantized, data, quantizer=_quantizer(), calibration_data=calibration, graph=False
    )
    dash.toggle_fallback("linear")
    assert dash.error is None and dash.state.fallback == ("linear",)
    expected = quantize_variant(gm, fallback(_quantizer(), ["linear"]), calibration)
    assert _same_outputs(dash.quantized_model, expected, data)


def test_the_dashboard_checks_its_calibration_data_before_anything_runs():
    from qviz.widgets import NumericDashboard

    gm, calibration, data = _model_and_data()
    quantized = quantize_variant(gm, _quantizer(), calibration)
    with pytest.raises(ConfigError, match=r"from_models\(calibration_data=\.\.\.\): batch 0"):
        bad = [torch.randn(16, 3)]
        NumericDashboard.from_models(
            gm, quantized, data, quantizer=_quantizer(), calibration_data=bad, graph=False
        )


def test_only_the_variant_pipeline_calibrates():
    """Above the engine, qviz.calibrate is called in qviz/numeric/variants alone: a second copy
    of "prepare, calibrate, convert" is a second place for the variants to disagree."""
    root = Path(qviz.__file__).parent
    callers = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(("engine/", "numeric/variants/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "calibrate":
                    callers.append(f"{relative}:{node.lineno}")
    assert callers == []


def test_scores_of_the_simulation_are_the_converted_models_scores(monkeypatch):
    """The scorer runs each variant's exact simulation; running the converted models
    themselves gives the same frame, value for value (digits: convs, pools, a linear head)."""
    from qviz.data import digits_loaders, digits_model
    from qviz.numeric import sensitivity
    from qviz.numeric.variants import variants

    loaders = digits_loaders(batch_size=64)
    calib, test = list(loaders.calibration)[:1], list(loaders.test)[:1]
    gm = qviz.export(digits_model().eval(), (calib[0][0],), dynamic_batch=True)
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))

    def accuracy(float_out, quant_out, target):
        return float((quant_out.argmax(1) == target).float().mean())

    def frame():
        return sensitivity(gm, q, test, metric=accuracy, calibration_data=calib,
                           progress=False)  # fmt: skip

    simulated = frame()
    monkeypatch.setattr(variants, "simulated", lambda model, **_: model)  # the converted models
    pd.testing.assert_frame_equal(simulated, frame(), check_exact=True)
