"""The snippets of "How to Write a Quantizer for PyTorch 2 Export Quantization", as tests.

Each custom quantizer annotates a tiny exported model; the tests check the documented number of
observers and which tensors share one instance, then the qparams convert uses.
"""

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.specs import (
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    SharedQuantizationSpec,
)
from qviz.errors import AnnotationError
from tests.helpers.quantize import quantize
from tests.helpers.tutorial_quantizers import ACT, WEIGHT, Annotate, TwoConvCat

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def _observers(prepared) -> dict[str, nn.Module]:
    return {
        n.name: prepared.get_submodule(n.target)
        for n in prepared.graph.nodes
        if n.op == "call_module" and n.target.startswith("activation_post_process_")
    }


def _flow(model, inputs, fn, batches=3):
    g = torch.Generator().manual_seed(0)
    data = [tuple(torch.randn(t.shape, generator=g) for t in inputs) for _ in range(batches)]
    _, prepared, quantized = quantize(model, data, Annotate(fn), example=inputs)
    return prepared, quantized


class Add(nn.Module):
    def forward(self, x, y):
        return x + y


def test_add_with_separate_specs_has_three_observers():
    def fn(node):
        if node.target == aten.add.Tensor:
            x, y = node.args
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                {x: ACT, y: ACT}, ACT, _annotated=True
            )

    prepared, _ = _flow(Add(), (torch.randn(4), torch.randn(4)), fn)
    assert len({id(m) for m in _observers(prepared).values()}) == 3
    assert len(prepared.plan.groups) == 3


def test_add_with_shared_inputs_uses_one_observer_for_both():
    def fn(node):
        if node.target == aten.add.Tensor:
            x, y = node.args
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                {x: ACT, y: SharedQuantizationSpec((x, node))}, ACT, _annotated=True
            )

    prepared, quantized = _flow(Add(), (torch.randn(4), torch.randn(4)), fn)
    obs = _observers(prepared)
    assert len({id(m) for m in obs.values()}) == 2
    add = next(n for n in prepared.graph.nodes if n.target == aten.add.Tensor)
    x_obs, y_obs = (prepared.get_submodule(a.target) for a in add.args)
    assert x_obs is y_obs
    # both inputs are quantized with the same qparams
    q = [n.args[1:3] for n in quantized.graph.nodes if n.target == qd.quantize_per_tensor.default]
    assert q[0] == q[1]


def test_sigmoid_with_fixed_qparams():
    fixed = FixedQParamsQuantizationSpec(
        dtype=torch.uint8, scale=1.0 / 256.0, zero_point=0, quant_min=0, quant_max=255,
        qscheme=torch.per_tensor_affine,
    )  # fmt: skip

    def fn(node):
        if node.target == aten.sigmoid.default:
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                {node.args[0]: ACT}, fixed, _annotated=True
            )

    prepared, quantized = _flow(nn.Sigmoid(), (torch.randn(8),), fn)
    assert type(prepared.plan.group_of("sigmoid")).__name__ == "GroupRecord"
    assert prepared.plan.group_of("sigmoid").spec.kind == "fixed"
    sig = next(n for n in quantized.graph.nodes if n.target == aten.sigmoid.default)
    (quant,) = sig.users
    assert quant.args[1:] == (1.0 / 256.0, 0, 0, 255, torch.uint8)


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x)


def _derive_bias_qparams(obs_or_fqs):
    act_scale, _ = obs_or_fqs[0].calculate_qparams()
    weight_scale, _ = obs_or_fqs[1].calculate_qparams()
    scale = act_scale * weight_scale
    return scale, torch.zeros_like(scale, dtype=torch.int32)


def test_conv_with_derived_bias():
    def fn(node):
        if node.target == aten.conv2d.default:
            x, w, b = node.args[:3]
            bias = DerivedQuantizationSpec(
                derived_from=[(x, node), (w, node)],
                derive_qparams_fn=_derive_bias_qparams,
                dtype=torch.int32,
                quant_min=-(2**31),
                quant_max=2**31 - 1,
                qscheme=torch.per_tensor_symmetric,
            )
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                {x: ACT, w: WEIGHT, b: bias}, ACT, _annotated=True
            )

    prepared, quantized = _flow(Conv(), (torch.randn(1, 3, 6, 6),), fn)
    assert prepared.plan.group_of("conv_bias", "conv2d").spec.kind == "derived"
    args = {
        n.args[0].name: n.args[1:]
        for n in quantized.graph.nodes
        if n.target == qd.dequantize_per_tensor.default
    }
    act_scale = next(a[0] for name, a in args.items() if name.startswith("quantize"))
    bias = next(a for a in args.values() if a[-1] == torch.int32)
    weight = next(a for a in args.values() if a[-1] == torch.int8 and a[1] == 0 and a[2] == -127)
    assert bias[0] == pytest.approx(act_scale * weight[0], rel=1e-6)
    assert bias[1] == 0


def test_cat_transitivity_one_observer_for_both_convs_and_both_inputs():
    def fn(node):
        if node.target == aten.conv2d.default:
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                {node.args[0]: ACT, node.args[1]: WEIGHT}, ACT, _annotated=True
            )
        if node.target == aten.cat.default:
            conv1, conv2 = node.args[0]
            shared = SharedQuantizationSpec((conv1, node))
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                {conv1: ACT, conv2: shared}, shared, _annotated=True
            )

    prepared, quantized = _flow(TwoConvCat(), (torch.randn(1, 3, 4, 4),), fn)
    plan = prepared.plan
    group = plan.group_of("conv2d", "cat")
    assert {str(m) for m in group.members} == {
        "conv2d", "conv2d_1", "conv2d -> cat", "conv2d_1 -> cat", "cat",
    }  # fmt: skip
    cat = next(n for n in prepared.graph.nodes if n.target == aten.cat.default)
    first, second = (prepared.get_submodule(a.target) for a in cat.args[0])
    assert first is second is prepared.get_submodule(group.observer)
    outs = [n for n in quantized.graph.nodes if n.target == qd.quantize_per_tensor.default]
    assert len({n.args[1:] for n in outs if n.args[0].name != "x"}) == 1


def test_unresolvable_sharing_is_an_annotation_error_naming_the_edge():
    def fn(node):
        if node.target == aten.cat.default:
            conv1, conv2 = node.args[0]
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                {conv2: SharedQuantizationSpec((conv1, node))}, None, _annotated=True
            )

    gm = qviz.export(TwoConvCat().eval(), (torch.randn(1, 3, 4, 4),))
    with pytest.raises(AnnotationError, match=r"conv2d_1 -> cat: .*points at conv2d -> cat"):
        qviz.prepare_pt2e(gm, Annotate(fn))


def test_an_input_spec_keyed_by_a_non_input_is_named():
    def fn(node):
        if node.target == aten.cat.default:
            x = next(iter(n for n in node.graph.nodes if n.op == "placeholder"))
            node.meta["quantization_annotation"] = QuantizationAnnotation({x: ACT}, None)

    gm = qviz.export(TwoConvCat().eval(), (torch.randn(1, 3, 4, 4),))
    with pytest.raises(AnnotationError, match=r"key .*x.* is not an input of cat"):
        qviz.prepare_pt2e(gm, Annotate(fn))
