"""A number from one model is never read against another (house rule 14): the same graph with
other weights, other qparams or another calibration is refused at every boundary where a record
meets a model, the message says which of the two differs, and the refused call changes nothing."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import qviz
import qviz.numeric
from qviz.engine.repair import cross_layer_equalization
from qviz.errors import CalibrationError, ConfigError, ModelMismatchError, StageError
from tests.helpers.lineage_models import models as _models
from tests.helpers.lineage_models import quantizer as _quantizer
from tests.helpers.lineage_models import state as _state
from tests.helpers.lineage_models import unchanged as _unchanged
from tests.helpers.quantize import quantize

pytest.importorskip("pandas")


def test_a_lowered_program_refuses_a_converted_model_with_other_qparams_or_weights(lowered):
    m = _models()
    with pytest.raises(ModelMismatchError, match=r"compare_lowered\(converted=...\): the "
                       r"lowered program was made from another model than this one: the "
                       r"same operators and float weights with other qparams"):  # fmt: skip
        qviz.numeric.compare_lowered(m.other_qparams, lowered, m.data)
    with pytest.raises(ModelMismatchError, match="made from another float model"):
        qviz.numeric.bisect_lowering(m.other_weights, lowered, m.data)
    qviz.numeric.compare_lowered(m.converted, lowered, m.data)  # its own: accepted


def test_a_prepared_model_passed_as_converted_is_refused_before_it_runs(lowered):
    m = _models()
    prepared = copy.deepcopy(m.prepared)
    before = _state(prepared)
    with pytest.raises(StageError, match=r"takes .* as converted, but got a prepared"):
        qviz.numeric.compare_lowered(prepared, lowered, m.data)
    assert _unchanged(prepared, before)  # its observers saw nothing


def test_the_float_reference_must_be_the_model_that_was_prepared(lowered):
    m = _models()
    folded = qviz.export(_folded(m.net), (m.data[0],))
    for wrong in (folded, m.other_gm):
        with pytest.raises(ModelMismatchError, match=r"prepared from another float model .* than "
                           r"float_model"):  # fmt: skip
            qviz.numeric.compare_lowered(m.converted, lowered, m.data, float_model=wrong)
    with pytest.raises(ModelMismatchError, match=r"compare: the quantized model was prepared from "
                       r"another float model"):  # fmt: skip
        qviz.numeric.compare(m.other_gm, m.converted, m.data, progress=False)
    qviz.numeric.compare(m.net, m.converted, m.data, progress=False)  # the eager module: its own


def _folded(net: nn.Module) -> nn.Module:
    """``net`` with its BatchNorm folded into the conv before it: the same function."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    layers = list(copy.deepcopy(net))
    return nn.Sequential(fuse_conv_bn_eval(layers[0], layers[1]), *layers[2:]).eval()


def test_a_function_preserving_transform_keeps_the_float_model_it_started_from():
    m = _models()
    equalized = cross_layer_equalization(m.gm)
    converted = quantize(equalized, m.data, _quantizer()).converted
    report = qviz.numeric.compare(m.gm, converted, m.data, progress=False)  # accepted
    assert report.fingerprint.origin == report.float_fingerprint.tensors


def test_diagnose_refuses_an_uncalibrated_or_recalibrated_prepared_model():
    m = _models()
    uncalibrated = qviz.prepare_pt2e(m.gm, _quantizer())
    with pytest.raises(CalibrationError, match=r"diagnose\(prepared=...\): no observer"):
        qviz.numeric.diagnose(m.report, uncalibrated)
    with pytest.raises(ConfigError, match=r"not converted from this prepared model: the same "
                       r"model with other observer statistics"):  # fmt: skip
        qviz.numeric.diagnose(m.report, m.recalibrated)
    assert qviz.numeric.diagnose(m.report, m.prepared).fingerprint == m.report.fingerprint


def test_views_accept_each_stage_of_the_measured_model_and_refuse_another():
    m = _models()
    for model in (m.gm, m.prepared, m.converted):
        qviz.viz.graph(model, metrics=m.report)
    for model, why in ((m.recalibrated, "other qparams or statistics"),
                       (m.other_weights, "made from another float model")):  # fmt: skip
        with pytest.raises(ConfigError, match=f"the report measured another model than this "
                           f"one: the same operators.* {why}"):  # fmt: skip
            qviz.viz.graph(model, metrics=m.report)


def test_a_finding_of_another_session_is_refused_and_the_session_unchanged():
    m = _models()
    sessions = []
    for gm in (m.gm, m.other_gm):
        outlier = copy.deepcopy(gm)
        with torch.no_grad():  # one weight far out: per-tensor weights starve the others
            outlier.get_parameter("3.weight")[0, 0, 0, 0] = 40.0
        sessions.append(
            qviz.numeric.RepairSession(outlier, _quantizer(), m.data, m.data, progress=False)
        )
    ours, theirs = sessions
    assert ours.diagnosis.findings and theirs.diagnosis.findings
    history, before = list(ours.history), _state(ours.quantized_model)
    with pytest.raises(ConfigError, match=r"not one of this session's diagnoses"):
        ours.apply(theirs.diagnosis.findings[0])
    assert list(ours.history) == history and _unchanged(ours.quantized_model, before)


def test_a_dashboard_refuses_a_report_of_another_model_beside_a_session():
    pytest.importorskip("ipywidgets")
    from qviz.widgets import NumericDashboard

    m = _models()
    session = qviz.numeric.RepairSession(m.other_gm, _quantizer(), m.data, m.data, progress=False)
    with pytest.raises(ConfigError, match=r"NumericDashboard\(session=...\): the report measured "
                       r"another model"):  # fmt: skip
        NumericDashboard(m.report, session=session, graph=False)


def test_a_wrong_stage_and_another_model_can_be_caught_apart_and_as_config_errors():
    """StageError and ModelMismatchError are ConfigErrors (older ``except`` clauses still hold)
    exported from qviz, and neither is raised for the other's case."""
    assert issubclass(qviz.StageError, ConfigError) and issubclass(
        qviz.ModelMismatchError, ConfigError
    )
    assert not issubclass(qviz.StageError, qviz.ModelMismatchError)
    m = _models()
    with pytest.raises(StageError) as stage:
        qviz.numeric.compare(m.gm, m.prepared, m.data, progress=False)
    assert not isinstance(stage.value, ModelMismatchError)
    with pytest.raises(ModelMismatchError) as other:
        qviz.numeric.compare(m.other_gm, m.converted, m.data, progress=False)
    assert not isinstance(other.value, StageError)
