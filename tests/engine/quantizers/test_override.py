"""OverrideQuantizer: plain-data edits of another quantizer's annotations, on the digits model."""

import json

import pytest
import torch

import qviz
from qviz.data import digits_model
from qviz.engine.compat import quantized_decomposed
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.quantizers.override import OverrideQuantizer
from qviz.errors import AnnotationError, ConfigError, QvizError


@pytest.fixture(scope="module")
def digits():
    torch.manual_seed(0)
    data = [torch.randn(16, 1, 8, 8) for _ in range(2)]
    gm = qviz.export(digits_model(), (data[0],), dynamic_batch=True)
    base = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    return gm, base, data


def plan_of(digits, overrides):
    gm, base, _ = digits
    return qviz.prepare_pt2e(gm, OverrideQuantizer(base, overrides)).plan


def test_no_overrides_is_the_base_plan(digits):
    gm, base, _ = digits
    assert str(plan_of(digits, {})) == str(qviz.prepare_pt2e(gm, base).plan)


def test_dtype_takes_its_full_range_and_the_observer_can_change(digits):
    spec = (
        plan_of(digits, {"relu": {"dtype": "uint8", "observer": "MinMaxObserver"}})
        .group_of("relu")
        .spec
    )
    assert (spec.dtype, spec.quant_min, spec.quant_max, spec.observer) == (
        "uint8",
        0,
        255,
        "MinMaxObserver",
    )


def test_int4_range_reaches_the_converted_graph(digits):
    gm, base, data = digits
    q = OverrideQuantizer(base, {"relu_3": {"quant_min": -8, "quant_max": 7}})
    prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), data, progress=False)
    converted = qviz.convert_pt2e(prepared)
    qd = quantized_decomposed()
    (quant,) = [
        n
        for n in converted.graph.nodes
        if n.target == qd.quantize_per_tensor.default and n.args[0].name == "relu_3"
    ]
    assert quant.args[3:5] == (-8, 7)


def test_weight_edge_per_tensor_and_back(digits):
    edge = "conv1_0_weight -> conv2d_3"
    plan = plan_of(digits, {edge: {"qscheme": "per_tensor_symmetric"}})
    spec = plan.group_of("conv1_0_weight", "conv2d_3").spec
    assert (spec.qscheme, spec.observer) == ("per_tensor_symmetric", "MinMaxObserver")
    spec = plan.group_of("conv2_0_weight", "conv2d_4").spec  # the others keep per-channel
    assert (spec.qscheme, spec.observer) == ("per_channel_symmetric", "PerChannelMinMaxObserver")


def test_per_channel_activations_default_to_the_channel_axis(digits):
    gm, base, data = digits
    q = OverrideQuantizer(base, {"relu_3": {"qscheme": "per_channel_affine"}})
    prepared = qviz.prepare_pt2e(gm, q)
    spec = prepared.plan.group_of("relu_3").spec
    assert (spec.qscheme, spec.ch_axis, spec.observer) == (
        "per_channel_affine",
        1,
        "PerChannelMinMaxObserver",
    )
    qviz.calibrate(prepared, [data[0], data[1][:5]], progress=False)  # batch sizes may change


def test_histogram_method(digits):
    gm, base, _ = digits
    q = OverrideQuantizer(base, {"relu_1": {"method": "entropy"}})
    prepared = qviz.prepare_pt2e(gm, q)
    observer = prepared.get_submodule(prepared.plan.group_of("relu_1").observer)
    assert observer.method == "entropy"
    with pytest.raises(ConfigError, match="needs observer='HistogramObserver'"):
        plan_of(digits, {"relu_1": {"method": "entropy", "observer": "MinMaxObserver"}})


def test_quantize_false_on_a_node_and_on_an_edge(digits):
    plan = plan_of(digits, {"linear": {"quantize": False}, "relu -> add": {"quantize": False}})
    assert [(f.node, f.reason.value) for f in plan.float_nodes] == [("linear", "user fallback")]
    observed = {str(t.tensor) for t in plan.tensors}
    assert "relu -> add" not in observed and "relu -> conv2d_1" in observed
    assert "linear" not in observed and "flatten -> linear" not in observed


def test_quantize_true_on_a_node_the_base_left_in_float(digits):
    gm, _, _ = digits
    base = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    base.set_module_name("fc", None)
    assert "linear" in [f.node for f in qviz.prepare_pt2e(gm, base).plan.float_nodes]
    plan = qviz.prepare_pt2e(gm, OverrideQuantizer(base, {"linear": {"quantize": True}})).plan
    assert plan.float_nodes == ()
    assert plan.group_of("linear").spec.dtype == "int8"


def test_share_with_makes_the_add_share_its_inputs(digits):
    before = plan_of(digits, {})
    assert before.group_of("conv2d_2", "add").group != before.group_of("relu", "add").group
    plan = plan_of(digits, {"conv2d_2 -> add": {"share_with": "relu -> add"}})
    assert plan.group_of("conv2d_2", "add").group == plan.group_of("relu", "add").group


def test_fixed_qparams(digits):
    spec = plan_of(digits, {"relu_4": {"scale": 0.05, "zero_point": -128}}).group_of("relu_4").spec
    assert (spec.kind, spec.scale, spec.zero_point) == ("fixed", 0.05, -128)


def test_module_and_op_type_keys(digits):
    plan = plan_of(digits, {"block": {"dtype": "uint8"}})
    for node in ("relu_1", "add"):
        assert plan.group_of(node).spec.dtype == "uint8", node
    assert plan.group_of("relu").spec.dtype == "int8"  # the stem is outside block
    plan = plan_of(digits, {"op:relu": {"observer": "MinMaxObserver"}})
    assert {plan.group_of(n).spec.observer for n in ("relu", "relu_3", "relu_4")} == {
        "MinMaxObserver"
    }


def test_overrides_are_plain_json_and_the_model_is_not_changed(digits):
    gm, base, _ = digits
    text = str(gm.graph)
    q = OverrideQuantizer(base, {"relu": {"dtype": torch.uint8, "share_with": ("a", "b")}})
    assert json.loads(json.dumps(q.overrides)) == {
        "relu": {"dtype": "uint8", "share_with": "a -> b"}
    }
    qviz.prepare_pt2e(gm, OverrideQuantizer(base, {"relu": {"dtype": "uint8"}}))
    assert str(gm.graph) == text
    assert not any("quantization_annotation" in n.meta for n in gm.graph.nodes)


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"conv2d_9": {"dtype": "uint8"}}, ConfigError, r"names no node.*closest.*conv2d"),
        ({"relu_4 -> add": {"dtype": "uint8"}}, ConfigError, "relu_4 is not an input of add"),
        ({"relu": {"dtype": "int3"}}, ConfigError, "dtype 'int3' is not one of"),
        ({"relu": {"dtype": "uint8", "quant_min": -5}}, ConfigError, r"quant_min=-5 does not fit"),
        ({"relu": {"bits": 4}}, ConfigError, "unknown change 'bits'"),
        ({"relu": {"scale": 0.1}}, ConfigError, "need both scale and zero_point"),
        ({"relu": {"quantize": "no"}}, ConfigError, "quantize must be True or False"),
        ({"relu -> add": {"share_with": "relu -> add"}}, AnnotationError, "relu -> add"),
        (
            {"conv2d_2 -> add": {"share_with": "stem_0_weight -> conv2d"}},
            ConfigError,
            "is a weight .constant. but conv2d_2 -> add is an activation",
        ),
        (
            {"add": {"qscheme": "per_channel_symmetric", "ch_axis": 0}},
            ConfigError,
            "ch_axis=0 is its batch dimension",
        ),
    ],
)
def test_invalid_edits_name_the_key_and_the_fix(digits, overrides, error, message):
    with pytest.raises(error, match=message) as info:
        plan_of(digits, overrides)
    assert isinstance(info.value, QvizError)
