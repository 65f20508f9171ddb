"""XNNPACKQuantizer against torchao's XNNPACKQuantizer (the reference), node by node.

Each model is exported once (``torch.export.export(model.eval(), inputs).module()``, BatchNorm
folded as prepare_pt2e does unless the test is about the unfolded pattern); the reference and
qviz each annotate their own deep copy, and every node's annotation is compared: input specs
keyed by producer name, output spec, ``allow_implicit_sharing`` and ``_annotated``. Observed
specs compare dtype, range, qscheme, ch_axis, is_dynamic and the observer class name with its
bound arguments; shared specs compare the names of the edge or node they share.

The comparison helpers are the ``compare`` fixture (conftest.py). Where qviz deliberately
differs, the differing nodes are listed in ``KNOWN`` with the reason, the test checks that
exactly those nodes differ, and a separate test checks what qviz does there. Settings (module
name / type, operator type, dynamic) are tested in test_xnnpack_settings.py.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule

from qviz.engine.pt2e.passes.bn_fold import fold_batch_norm
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.specs import FixedQParamsQuantizationSpec, SharedQuantizationSpec

pytestmark = pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated")
KEY = "quantization_annotation"


# -- models ---------------------------------------------------------------------------------------


class Net(nn.Module):
    """A module whose forward is ``body(self, *inputs)``, with the given submodules."""

    def __init__(self, body: Callable, **modules: nn.Module) -> None:
        super().__init__()
        self.body = body
        for name, module in modules.items():
            self.add_module(name, module)

    def forward(self, *inputs):
        return self.body(self, *inputs)


def _conv(cin=3, cout=4, k=3, **kw):
    return nn.Conv2d(cin, cout, k, **kw)


IMG = (torch.randn(1, 3, 8, 8),)
TWO = (torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8))
VEC = (torch.randn(2, 6),)

TOY: dict[str, tuple[Callable[[], nn.Module], tuple]] = {
    "conv1d": (
        lambda: Net(lambda s, x: s.conv(x), conv=nn.Conv1d(3, 4, 3)),
        (torch.randn(1, 3, 9),),
    ),
    "conv2d": (lambda: Net(lambda s, x: s.conv(x), conv=_conv()), IMG),
    "conv2d_no_bias": (lambda: Net(lambda s, x: s.conv(x), conv=_conv(bias=False)), IMG),
    "conv_bn": (lambda: Net(lambda s, x: s.bn(s.conv(x)), conv=_conv(), bn=nn.BatchNorm2d(4)), IMG),
    "conv_bn_relu": (
        lambda: Net(lambda s, x: F.relu(s.bn(s.conv(x))), conv=_conv(), bn=nn.BatchNorm2d(4)),
        IMG,
    ),
    "conv_transpose_relu": (
        lambda: Net(
            lambda s, x: F.relu(s.conv_transpose(x)), conv_transpose=nn.ConvTranspose2d(3, 4, 2)
        ),
        IMG,
    ),
    "conv_transpose_bn_relu": (
        lambda: Net(
            lambda s, x: F.relu(s.bn(s.conv_transpose(x))),
            conv_transpose=nn.ConvTranspose2d(3, 4, 2),
            bn=nn.BatchNorm2d(4),
        ),
        IMG,
    ),
    "conv_relu": (lambda: Net(lambda s, x: s.act(s.conv(x)), conv=_conv(), act=nn.ReLU()), IMG),
    "conv_relu_inplace": (
        lambda: Net(lambda s, x: s.act(s.conv(x)), conv=_conv(), act=nn.ReLU(inplace=True)),
        IMG,
    ),
    "conv1d_relu": (
        lambda: Net(lambda s, x: F.relu(s.conv(x)), conv=nn.Conv1d(3, 4, 3)),
        (torch.randn(1, 3, 9),),
    ),
    "conv_hardtanh": (
        lambda: Net(lambda s, x: s.act(s.conv(x)), conv=_conv(), act=nn.Hardtanh()),
        IMG,
    ),
    "conv_relu6": (lambda: Net(lambda s, x: s.act(s.conv(x)), conv=_conv(), act=nn.ReLU6()), IMG),
    "conv_two_users": (
        lambda: Net(lambda s, x: (F.relu(y := s.conv(x)), y * 2.0), conv=_conv()),
        IMG,
    ),
    "linear": (lambda: Net(lambda s, x: s.fc(x), fc=nn.Linear(6, 5)), VEC),
    "linear_no_bias": (lambda: Net(lambda s, x: s.fc(x), fc=nn.Linear(6, 5, bias=False)), VEC),
    "linear_relu": (lambda: Net(lambda s, x: F.relu(s.fc(x)), fc=nn.Linear(6, 5)), VEC),
    "linear_linear": (
        lambda: Net(lambda s, x: s.b(s.a(x)), a=nn.Linear(6, 6), b=nn.Linear(6, 2)),
        VEC,
    ),
    "add": (lambda: Net(lambda s, x, y: x + y), TWO),
    "add_scalar": (lambda: Net(lambda s, x: x + 1.0), IMG),
    "add_relu": (lambda: Net(lambda s, x, y: F.relu(x + y)), TWO),
    "add_relu_same_input": (lambda: Net(lambda s, x: F.relu(x + x)), IMG),
    "add_inplace_relu": (
        lambda: Net(lambda s, x, y: F.relu(s.a(x).add_(s.b(y))), a=_conv(), b=_conv()),
        TWO,
    ),
    "add_int": (lambda: Net(lambda s, x, i: x + i), (torch.randn(2, 3), torch.arange(3))),
    "mul": (lambda: Net(lambda s, x, y: x * y), TWO),
    "mul_scalar": (lambda: Net(lambda s, x: x * 0.5), IMG),
    "mul_relu": (lambda: Net(lambda s, x, y: F.relu(x * y)), TWO),
    "cat": (lambda: Net(lambda s, x: torch.cat([s.a(x), s.b(x)], 1), a=_conv(), b=_conv()), IMG),
    "maxpool2d": (
        lambda: Net(lambda s, x: s.pool(s.conv(x)), conv=_conv(), pool=nn.MaxPool2d(2)),
        IMG,
    ),
    "avgpool2d": (
        lambda: Net(lambda s, x: s.pool(s.conv(x)), conv=_conv(), pool=nn.AvgPool2d(2)),
        IMG,
    ),
    "adaptive_avg_pool2d": (
        lambda: Net(lambda s, x: s.pool(s.conv(x)), conv=_conv(), pool=nn.AdaptiveAvgPool2d(1)),
        IMG,
    ),
    "adaptive_avg_pool2d_functional": (
        lambda: Net(lambda s, x: F.adaptive_avg_pool2d(s.conv(x), 1), conv=_conv()),
        IMG,
    ),
    "adaptive_avg_pool2d_of_input": (
        lambda: Net(lambda s, x: s.pool(x), pool=nn.AdaptiveAvgPool2d(1)),
        IMG,
    ),
    "mean": (lambda: Net(lambda s, x: s.conv(x).mean((2, 3)), conv=_conv()), IMG),
    "flatten": (
        lambda: Net(
            lambda s, x: s.fc(torch.flatten(s.conv(x), 1)), conv=_conv(), fc=nn.Linear(144, 2)
        ),
        IMG,
    ),
    "reshape_view": (
        lambda: Net(
            lambda s, x: s.fc(s.conv(x).reshape(1, -1).view(1, 144)),
            conv=_conv(),
            fc=nn.Linear(144, 2),
        ),
        IMG,
    ),
    "view": (
        lambda: Net(lambda s, x: s.fc(s.conv(x).view(1, -1)), conv=_conv(), fc=nn.Linear(144, 2)),
        IMG,
    ),
    "permute": (lambda: Net(lambda s, x: s.conv(x).permute(0, 2, 3, 1), conv=_conv()), IMG),
    "squeeze_unsqueeze": (
        lambda: Net(lambda s, x: s.conv(x).unsqueeze(0).squeeze(0), conv=_conv()),
        IMG,
    ),
    "squeeze": (lambda: Net(lambda s, x: s.conv(x).squeeze(), conv=_conv()), IMG),
    "transpose": (lambda: Net(lambda s, x: s.fc(x).transpose(0, 1), fc=nn.Linear(6, 5)), VEC),
    "slice": (lambda: Net(lambda s, x: s.conv(x)[:, :2], conv=_conv()), IMG),
    "sigmoid": (lambda: Net(lambda s, x: torch.sigmoid(s.fc(x)), fc=nn.Linear(6, 5)), VEC),
    "tanh": (lambda: Net(lambda s, x: torch.tanh(s.fc(x)), fc=nn.Linear(6, 5)), VEC),
    "softmax": (lambda: Net(lambda s, x: F.softmax(s.fc(x), dim=-1), fc=nn.Linear(6, 5)), VEC),
}

#: Nodes where qviz deliberately differs from the reference, and why.
KNOWN: dict[str, dict[str, str]] = {
    "avgpool2d": {"avg_pool2d": "qviz: avg_pool2d shares its input (reference: left float)"},
    "reshape_view": {
        "reshape": "qviz: reshape shares its input (reference: left float)",
        "view": "so the view after it shares too (reference: its input is float)",
    },
    "squeeze_unsqueeze": {
        "unsqueeze": "qviz: unsqueeze shares its input (reference: left float)",
        "squeeze": "so the squeeze after it shares too",
    },
    "squeeze": {"squeeze": "qviz: squeeze.default (all dims) shares (reference: squeeze.dim only)"},
    "transpose": {"transpose": "qviz: transpose shares its input (reference: left float)"},
    "slice": {"slice_1": "qviz: slice.Tensor shares (reference: only slice_copy)"},
    "sigmoid": {"sigmoid": "qviz: fixed qparams 1/256, -128 (reference: left float)"},
    "tanh": {"tanh": "qviz: fixed qparams 1/128, 0 (reference: left float)"},
    "softmax": {"softmax": "qviz: fixed qparams 1/256, -128 (reference: left float)"},
    "cat": {"cat": "reference's cat pattern needs source_fn_stack: strict export only"},
    "adaptive_avg_pool2d_functional": {
        "adaptive_avg_pool2d": "reference finds F.adaptive_avg_pool2d only under strict export; "
        "it then shares by propagation: output Shared(conv) instead of Shared((conv, pool))"
    },
}

#: On graphs whose BatchNorm is not folded: qviz always claims conv → bn [→ relu] as one pattern
#: (torchao only for QAT configs; its PTQ run claims the conv alone).
KNOWN_UNFOLDED: dict[str, dict[str, str]] = {
    "conv_bn": {
        "conv2d": "qviz: conv inputs only (reference PTQ: conv inputs and output)",
        "batch_norm": "qviz: the output spec is on the batch norm (reference PTQ: float)",
    },
    "conv_bn_relu": {
        "conv2d": "qviz: conv inputs only (reference PTQ: conv inputs and output)",
        "relu": "qviz: the output spec is on the relu (reference PTQ: float)",
    },
    "conv_transpose_bn_relu": {
        "conv_transpose2d": "qviz: conv_transpose inputs (reference PTQ: nothing, no pattern)",
        "relu": "qviz: the output spec is on the relu (reference PTQ: float)",
        "conv_transpose_weight": "claimed with its conv_transpose",
        "conv_transpose_bias": "claimed with its conv_transpose",
    },
}


@functools.cache
def exported(name: str, fold: bool = True, strict: bool = False) -> GraphModule:
    make, inputs = TOY[name]
    gm = torch.export.export(make().eval(), inputs, strict=strict).module()
    if fold:
        fold_batch_norm(gm)
    return gm


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("name", sorted(TOY))
def test_toy_models_match_reference(compare, name: str, per_channel: bool) -> None:
    known = KNOWN.get(name, {})
    qviz_gm = compare.check_same(exported(name), *compare.global_setup(per_channel), known=known)
    assert compare.describe(qviz_gm) or name == "add_int", "nothing was annotated"


@pytest.mark.parametrize("name", ["cat", "adaptive_avg_pool2d_functional"])
def test_strict_export_matches_reference_where_non_strict_does_not(compare, name: str) -> None:
    """With strict export (source_fn_stack recorded) the reference finds these patterns too."""
    compare.check_same(exported(name, strict=True), *compare.global_setup(False))


@pytest.mark.parametrize("name", sorted(KNOWN_UNFOLDED))
def test_unfolded_conv_bn_matches_reference_conv_bn_pattern(compare, name: str) -> None:
    """Unfolded conv-bn: qviz claims the pattern as the reference's conv-bn annotators do.

    The reference runs those annotators only for QAT configs; running it with its PTQ specs and
    is_qat=True shows the same annotation. Its plain PTQ run claims the conv alone (KNOWN).
    """
    gm = exported(name, fold=False)
    compare.check_same(gm, compare.qat_setup(False), compare.global_setup(False)[1])
    compare.check_same(gm, *compare.global_setup(False), known=KNOWN_UNFOLDED[name])


# -- whole models ---------------------------------------------------------------------------------


@functools.cache
def exported_model(name: str, fold: bool = True) -> GraphModule:
    if name == "digits":
        from qviz.data import digits_model

        model, inputs = digits_model(), (torch.randn(2, 1, 8, 8),)
    else:
        torchvision = pytest.importorskip("torchvision")
        model, inputs = (
            getattr(torchvision.models, name)(weights=None),
            (torch.randn(1, 3, 224, 224),),
        )
    gm = torch.export.export(model.eval(), inputs).module()
    if fold:
        fold_batch_norm(gm)
    return gm


MODEL_KNOWN = {
    "mobilenet_v2": {
        "adaptive_avg_pool2d": "torchvision calls F.adaptive_avg_pool2d: see KNOWN['adaptive_avg_pool2d_functional']"  # noqa: E501
    },
}


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("name", ["digits", "resnet18", "mobilenet_v2"])
def test_models_match_reference(compare, name: str, per_channel: bool) -> None:
    gm = compare.check_same(
        exported_model(name), *compare.global_setup(per_channel), known=MODEL_KNOWN.get(name, {})
    )
    convs = [n for n in gm.graph.nodes if n.target == torch.ops.aten.conv2d.default]
    assert convs and all(KEY in n.meta for n in convs)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_unfolded_digits_matches_reference_conv_bn_patterns(compare, per_channel: bool) -> None:
    gm = compare.check_same(
        exported_model("digits", fold=False),
        compare.qat_setup(per_channel),
        compare.global_setup(per_channel)[1],
    )
    bns = [n for n in gm.graph.nodes if n.target == torch.ops.aten.batch_norm.default]
    # inside claimed conv-bn(-relu) patterns: no float reason; only the last bn (no relu) has a spec
    assert len(bns) == 5 and not any("qviz_float_reason" in n.meta for n in bns)
    assert [n.name for n in bns if KEY in n.meta] == ["batch_norm_2"]


# -- what qviz adds: shape ops that share, fixed qparams ------------------------------------------


def _qviz(name: str, per_channel: bool = False) -> dict[str, torch.fx.Node]:
    gm = copy.deepcopy(exported(name))
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(per_channel))
    quantizer.annotate(quantizer.transform_for_annotation(gm))
    return {n.name: n for n in gm.graph.nodes}


@pytest.mark.parametrize(
    ("name", "chain"),
    [
        ("avgpool2d", ["conv2d", "avg_pool2d"]),
        ("reshape_view", ["conv2d", "reshape", "view"]),
        ("squeeze_unsqueeze", ["conv2d", "unsqueeze", "squeeze"]),
        ("squeeze", ["conv2d", "squeeze"]),
        ("transpose", ["linear", "transpose"]),
        ("slice", ["conv2d", "slice_1"]),
    ],
)
def test_extra_shape_ops_share_their_input(name: str, chain: list[str]) -> None:
    nodes = _qviz(name)
    for producer, consumer in itertools.pairwise(chain):
        a = nodes[consumer].meta[KEY]
        assert isinstance(a.output_qspec, SharedQuantizationSpec)
        assert a.output_qspec.edge_or_node is nodes[producer]
        assert a.input_qspec_map == {nodes[producer]: a.output_qspec} and a._annotated


@pytest.mark.parametrize(
    ("name", "scale", "zero_point"),
    [("sigmoid", 1 / 256, -128), ("tanh", 1 / 128, 0), ("softmax", 1 / 256, -128)],
)
def test_sigmoid_tanh_softmax_get_fixed_qparams(
    compare, name: str, scale: float, zero_point: int
) -> None:
    nodes = _qviz(name)
    a = nodes[name].meta[KEY]
    assert a.output_qspec == FixedQParamsQuantizationSpec(
        dtype=torch.int8,
        scale=scale,
        zero_point=zero_point,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_tensor_affine,
    )
    act = get_symmetric_quantization_config().input_activation
    assert {k: compare.spec_key(v) for k, v in a.input_qspec_map.items()} == {
        nodes["linear"]: compare.spec_key(act)
    }


def test_fixed_qparams_follow_the_activation_range() -> None:
    gm = copy.deepcopy(exported("sigmoid"))
    config = get_symmetric_quantization_config(act_qmin=-127, act_qmax=127)
    XNNPACKQuantizer().set_global(config).annotate(gm)
    spec = next(n for n in gm.graph.nodes if n.name == "sigmoid").meta[KEY].output_qspec
    assert (spec.scale, spec.zero_point, spec.quant_min, spec.quant_max) == (
        1 / 255,
        -127,
        -127,
        127,
    )


# -- dtype constraint -----------------------------------------------------------------------------


def test_add_of_an_integer_tensor_stays_float_as_in_the_reference(compare) -> None:
    ref_gm, qviz_gm = compare.annotate_both(exported("add_int"), *compare.global_setup(False))
    assert compare.describe(ref_gm) == compare.describe(qviz_gm) == {}
    add = next(n for n in qviz_gm.graph.nodes if n.name == "add")
    assert add.meta["qviz_float_reason"] == "dtype constraint violated"
    assert "torch.int64" in add.meta["qviz_float_detail"]
