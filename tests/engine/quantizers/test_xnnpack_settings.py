"""XNNPACKQuantizer settings: module name / type, operator type, None, dynamic, errors.

Where torchao's XNNPACKQuantizer (the reference) supports a setting, the result is compared with
it node by node (the ``compare`` fixture, conftest.py); where it does not (operator types, None
for module names, nested names) qviz's behaviour is checked directly.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule

from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import ConfigError

ref = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")
RefQ, ref_cfg = ref.XNNPACKQuantizer, ref.get_symmetric_quantization_config
pytestmark = pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated")
KEY = "quantization_annotation"


# -- models ---------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.relu, self.pool = nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(self.relu(self.conv(x)))


class Top(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.act = nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()
        self.block1, self.block2 = Block(), Block()
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        x = self.block2(self.block1(self.act(self.stem(x))))
        return self.fc(torch.flatten(x, 1))


@functools.cache
def top() -> GraphModule:
    return torch.export.export(Top().eval(), (torch.randn(1, 3, 8, 8),)).module()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        return F.relu(self.fc2(F.relu(self.fc1(x))))


@functools.cache
def mlp() -> GraphModule:
    return torch.export.export(MLP().eval(), (torch.randn(2, 6),)).module()


# -- settings and their precedence ----------------------------------------------------------------


PT, PC = ref_cfg(), ref_cfg(is_per_channel=True)
QPT, QPC = get_symmetric_quantization_config(), get_symmetric_quantization_config(True)


def _nodes(gm: GraphModule) -> dict[str, torch.fx.Node]:
    return {n.name: n for n in gm.graph.nodes}


@pytest.mark.parametrize(
    ("setup_ref", "setup_qviz"),
    [
        (lambda q: q.set_global(PT).set_module_name("block1", PC),
         lambda q: q.set_global(QPT).set_module_name("block1", QPC)),
        (lambda q: q.set_global(PT).set_module_type(Block, PC),
         lambda q: q.set_global(QPT).set_module_type(Block, QPC)),
        (lambda q: q.set_global(PT).set_module_type(nn.Linear, PC),
         lambda q: q.set_global(QPT).set_object_type(nn.Linear, QPC)),
        (lambda q: q.set_global(PT).set_module_name("block2", PC).set_module_type(Block, ref_cfg(act_qmin=-127)),  # noqa: E501
         lambda q: q.set_global(QPT).set_module_name("block2", QPC).set_module_type(Block, get_symmetric_quantization_config(act_qmin=-127))),  # noqa: E501
        (lambda q: q.set_module_name("block1", PC),
         lambda q: q.set_module_name("block1", QPC)),
    ],
    ids=["module_name", "module_type", "object_type", "name_beats_type", "name_only"],
)  # fmt: skip
def test_precedence_matches_reference(compare, setup_ref, setup_qviz) -> None:
    compare.check_same(top(), setup_ref, setup_qviz, patch_ref=True)


def test_reference_module_filters_miss_convs_because_weights_have_no_module(compare) -> None:
    """Without the patch the reference leaves block1's conv unannotated (qviz claims it)."""
    setup = (lambda q: q.set_global(PT).set_module_name("block1", PC),
             lambda q: q.set_global(QPT).set_module_name("block1", QPC))  # fmt: skip
    ref_gm, qviz_gm = compare.annotate_both(top(), *setup)
    diff = compare.differing(ref_gm, qviz_gm)
    assert {"conv2d_1", "relu_1", "block1_conv_weight", "block1_conv_bias"} <= set(diff)
    assert diff["conv2d_1"][0] is None
    weight = (
        _nodes(qviz_gm)["conv2d_1"].meta[KEY].input_qspec_map[_nodes(qviz_gm)["block1_conv_weight"]]
    )
    assert weight.qscheme == torch.per_channel_symmetric


def test_module_type_none_keeps_the_whole_module_float(compare) -> None:
    """The reference's propagation still quantizes a float module's max_pool (qviz: float).

    The flatten after the last pool then has no quantized input to share in qviz either.
    """
    setup = (lambda q: q.set_global(PT).set_module_type(nn.MaxPool2d, None),
             lambda q: q.set_global(QPT).set_module_type(nn.MaxPool2d, None))  # fmt: skip
    known = {"max_pool2d", "max_pool2d_1", "flatten"}
    gm = compare.check_same(top(), *setup, known=known, patch_ref=True)
    pool = _nodes(gm)["max_pool2d"]
    assert pool.meta["qviz_float_reason"] == "filtered by module type"
    assert pool.meta["qviz_float_detail"] == "set_module_type(MaxPool2d, None)"


def test_module_name_none_keeps_the_module_float(compare) -> None:
    """torchao asserts on None; its internals handle it when set directly, which we compare to."""
    with pytest.raises(AssertionError):
        RefQ().set_module_name("block1", None)

    def setup_ref(q):
        q.set_global(PT).module_name_config["block1"] = None
        return q

    setup_qviz = lambda q: q.set_global(QPT).set_module_name("block1", None)  # noqa: E731
    gm = compare.check_same(top(), setup_ref, setup_qviz, patch_ref=True)
    nodes = _nodes(gm)
    for name in ("conv2d_1", "relu_1", "max_pool2d"):
        assert KEY not in nodes[name].meta
        assert nodes[name].meta["qviz_float_reason"] == "filtered by module name"
    assert nodes["conv2d_2"].meta[KEY]._annotated


def test_innermost_module_name_wins() -> None:
    """qviz: the most specific name wins (torchao: the first one set)."""
    gm = copy.deepcopy(top())
    q = XNNPACKQuantizer().set_global(QPT).set_module_name("block1", QPC)
    q.set_module_name("block1.conv", None).annotate(gm)
    nodes = _nodes(gm)
    assert KEY not in nodes["conv2d_1"].meta
    assert nodes["conv2d_1"].meta["qviz_float_detail"] == "set_module_name('block1.conv', None)"
    assert nodes["conv2d_2"].meta[KEY]._annotated


@pytest.mark.parametrize("op", [F.linear, torch.ops.aten.linear, torch.ops.aten.linear.default])
def test_operator_type_config(compare, op) -> None:
    """torchao stores set_operator_type but never reads it; qviz applies it."""
    ref_gm, qviz_gm = compare.annotate_both(
        top(), lambda q: q.set_global(PT).set_operator_type(op, PC),
        lambda q: q.set_global(QPT).set_operator_type(op, QPC),
    )  # fmt: skip
    for gm, scheme in (
        (ref_gm, torch.per_tensor_symmetric),
        (qviz_gm, torch.per_channel_symmetric),
    ):
        nodes = _nodes(gm)
        assert nodes["linear"].meta[KEY].input_qspec_map[nodes["fc_weight"]].qscheme == scheme
        assert (
            nodes["conv2d"].meta[KEY].input_qspec_map[nodes["stem_weight"]].qscheme
            == torch.per_tensor_symmetric
        )


def test_operator_type_none_keeps_operator_float() -> None:
    gm = copy.deepcopy(top())
    XNNPACKQuantizer().set_global(QPT).set_object_type(F.conv2d, None).annotate(gm)
    nodes = _nodes(gm)
    assert KEY not in nodes["conv2d"].meta and KEY not in nodes["relu"].meta
    assert nodes["conv2d"].meta["qviz_float_reason"] == "user fallback"
    assert nodes["conv2d"].meta["qviz_float_detail"] == "set_operator_type(conv2d, None)"
    assert nodes["relu"].meta["qviz_float_reason"] == "pattern unsupported"
    assert nodes["relu"].meta["qviz_float_detail"] == (
        "relu.default shares its input's quantization, but its input conv2d is not quantized"
    )
    assert nodes["linear"].meta[KEY]._annotated


def test_no_global_config_is_user_fallback() -> None:
    gm = copy.deepcopy(top())
    XNNPACKQuantizer().set_module_type(nn.Linear, QPT).annotate(gm)
    nodes = _nodes(gm)
    assert nodes["linear"].meta[KEY]._annotated
    assert nodes["conv2d"].meta["qviz_float_reason"] == "user fallback"
    assert "set_global" in nodes["conv2d"].meta["qviz_float_detail"]


def test_unsupported_patterns_say_so() -> None:
    gm = torch.export.export(nn.GELU().eval(), (torch.randn(2),)).module()
    XNNPACKQuantizer().set_global(QPT).annotate(gm)
    gelu = _nodes(gm)["gelu"]
    assert gelu.meta["qviz_float_reason"] == "pattern unsupported"
    assert gelu.meta["qviz_float_detail"] == "XNNPACKQuantizer has no pattern for gelu.default here"


# -- dynamic quantization -------------------------------------------------------------------------


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("model", [mlp, top])
def test_dynamic_linear_matches_reference(compare, model, per_channel: bool) -> None:
    gm = compare.check_same(model(), *compare.global_setup(per_channel, dynamic=True))
    for node in gm.graph.nodes:
        if node.target == torch.ops.aten.linear.default:
            a = node.meta[KEY]
            assert a.output_qspec is None and a.input_qspec_map[node.args[0]].is_dynamic
        elif node.op == "call_function":
            detail = node.meta["qviz_float_detail"]
            assert detail.endswith("dynamic quantization covers linear only")


def test_dynamic_module_inside_static_global_matches_reference(compare) -> None:
    dyn, qdyn = ref_cfg(is_dynamic=True), get_symmetric_quantization_config(is_dynamic=True)
    compare.check_same(
        top(), lambda q: q.set_global(PT).set_module_type(nn.Linear, dyn),
        lambda q: q.set_global(QPT).set_module_type(nn.Linear, qdyn), patch_ref=True,
    )  # fmt: skip


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda q: q.set_global("int8"), "expected a QuantizationConfig"),
        (lambda q: q.set_global(dataclasses.replace(QPT, weight=QPT.input_activation)), "weight spec has qscheme"),  # noqa: E501
        (lambda q: q.set_global(dataclasses.replace(QPT, input_activation=QPC.weight)), "input activation spec has qscheme"),  # noqa: E501
        (lambda q: q.set_global(dataclasses.replace(QPT, bias=QPT.weight)), "bias spec must keep bias in torch.float"),  # noqa: E501
        (lambda q: q.set_module_name(nn.Linear, QPT), "module_name must be a str"),
        (lambda q: q.set_module_type("fc", QPT), "module_type must be a module class"),
        (lambda q: q.set_operator_type(nn.Conv2d, QPT), "module classes go to set_module_type"),
        (lambda q: q.set_operator_type(lambda x: x, QPT), "no ATen operator is named after"),
        (lambda q: q.annotate(nn.Linear(2, 2)), "needs the graph module"),
        (lambda q: q.transform_for_annotation("gm"), "needs the graph module"),
    ],
)  # fmt: skip
def test_errors_name_the_problem_and_the_fix(call, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call(XNNPACKQuantizer())
