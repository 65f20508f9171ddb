"""QuantPlan: records a view can rely on, and a printout a person can read."""

import copy
import pickle

import pytest
import torch

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.pt2e.plan import (
    PLAN_KEY,
    FloatReason,
    QuantPlan,
    TensorRef,
    plan_of,
    require_plan,
    set_plan,
)
from qviz.errors import ConfigError
from tests.helpers.quantize import quantize, xnnpack


@pytest.fixture(scope="module")
def converted():
    batches = [x for x, _ in digits_loaders(batch_size=64).calibration]  # last batch is short
    quantizer = xnnpack(per_channel=True).set_module_name("fc", None)
    _, prepared, converted = quantize(digits_model(), batches, quantizer, dynamic_batch=True)
    return prepared, converted


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


def test_the_plan_lives_in_the_graph_modules_meta_and_copies_keep_it(converted):
    prepared, quantized = converted
    assert prepared.meta[PLAN_KEY] is prepared.plan is plan_of(prepared)
    assert "plan" not in vars(prepared)  # one source: meta, read by the .plan property
    copied = copy.deepcopy(prepared)  # nothing re-attaches it: GraphModule copies meta
    assert copied.plan == prepared.plan and plan_of(copied) == prepared.plan
    assert copy.deepcopy(copied).plan == prepared.plan  # the copy's class offers .plan too
    assert plan_of(quantized) is quantized.plan and quantized.meta[PLAN_KEY] is quantized.plan
    groups = [g.group for g in prepared.plan.groups]
    assert [g.group for g in quantized.plan.groups] == groups
    assert all(g.qparams is not None for g in quantized.plan.groups if g.spec.kind == "observed")
    again = qviz.convert_pt2e(copied)  # convert of a copy: the same plan and qparams
    assert again.plan == quantized.plan
    copied.plan = copied.plan.with_choices({0: "mse"})  # the setter writes the meta
    assert plan_of(copied).groups[0].choice == "mse" and prepared.plan.groups[0].choice is None


def test_set_plan_works_on_any_graph_module_and_survives_pickle():
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    assert plan_of(gm) is None and getattr(gm, "plan", None) is None
    plan = QuantPlan((), (), loop_bodies=("body",))
    set_plan(gm, plan)
    assert gm.plan is plan and torch.equal(gm(torch.ones(2)), torch.ones(2))
    assert pickle.loads(pickle.dumps(gm)).plan == plan
    assert set_plan(gm, None) is gm and getattr(gm, "plan", None) is None
    with pytest.raises(ConfigError, match="must be a QuantPlan"):
        gm.plan = "not a plan"
    with pytest.raises(ConfigError, match=r"report needs a model from qviz.prepare_pt2e .* \(a "):
        require_plan(gm, "report")


def test_a_graph_prepared_by_torchao_has_no_plan_and_still_converts():
    ref_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
    ref_xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")
    x = torch.randn(4, 4)
    gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval(), (x,))
    quantizer = ref_xnnpack.XNNPACKQuantizer().set_global(
        ref_xnnpack.get_symmetric_quantization_config()
    )
    prepared = ref_pt2e.prepare_pt2e(gm, quantizer)
    prepared(x)
    assert plan_of(prepared) is None and getattr(prepared, "plan", None) is None
    quantized = qviz.convert_pt2e(prepared)
    assert plan_of(quantized) is None and quantized(x).shape == (4, 4)
