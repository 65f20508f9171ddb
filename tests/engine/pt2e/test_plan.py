"""QuantPlan: records a view can rely on, and a printout a person can read."""

import pytest
import torch

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.pt2e.plan import FloatReason, TensorRef
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import ConfigError


@pytest.fixture(scope="module")
def converted():
    batches = [x for x, _ in digits_loaders(batch_size=64).calibration]  # last batch is short
    gm = qviz.export(digits_model(), (batches[0],), dynamic_batch=True)
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    prepared = qviz.prepare_pt2e(gm, quantizer.set_module_name("fc", None))
    qviz.calibrate(prepared, batches, progress=False)
    return prepared, qviz.convert_pt2e(prepared)


def test_records_cover_every_observed_tensor_once(converted):
    prepared, _ = converted
    plan = prepared.plan
    refs = [t.tensor for t in plan]
    assert len(refs) == len(set(refs)) == sum(len(g.members) for g in plan.groups)
    assert plan.record("relu", "conv2d_1").how == "implicit"
    assert plan.record("relu_2", "max_pool2d").how == "explicit"  # as XNNPACK wrote it
    assert plan.group_of("relu", "conv2d_1") is plan.group_of("relu")
    with pytest.raises(ConfigError, match=r"linear is not observed in this plan"):
        plan.record("linear")
    assert plan.record("relu -> conv2d_1") is plan.record("relu", "conv2d_1")  # as printed


def test_float_nodes_carry_the_quantizers_reason(converted):
    prepared, _ = converted
    (linear,) = prepared.plan.float_nodes
    assert (linear.node, linear.reason) == ("linear", FloatReason.FILTERED_BY_MODULE_NAME)
    assert "set_module_name('fc', None)" in str(prepared.plan)


def test_convert_adds_qparams_and_the_printout_shows_them(converted):
    prepared, quantized = converted
    assert all(g.qparams is None for g in prepared.plan.groups)
    text = str(quantized.plan)
    for g in quantized.plan.groups:
        assert g.qparams is not None
        if isinstance(g.qparams.scale, tuple):
            assert len(g.qparams.scale) in (32, 64) and "channels)" in text
        else:
            assert f"scale={g.qparams.scale:.4g} zp={g.qparams.zero_point}" in text


def test_records_are_plain_data(converted):
    _, quantized = converted
    rows = quantized.plan.to_records("groups")
    assert {"group", "observer", "owner", "spec", "members", "qparams"} <= set(rows[0])
    assert not any(isinstance(v, torch.Tensor) for row in rows for v in row.values())
    assert TensorRef("a", "b") == TensorRef("a", "b") and str(TensorRef("a", "b")) == "a -> b"
    with pytest.raises(ValueError, match="kind must be one of"):
        quantized.plan.to_records("edges")
