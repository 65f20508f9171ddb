"""The converted graph's layout against the reference (torchao 0.18): not only the same bits,
the same q/dq nodes where a backend looks for them.

Each test prepares one exported graph twice (torchao's flow and qviz's) with the same quantizer
and batches, and checks what a backend lowering from the converted graph relies on: one
dequantize per quantized consumer, the partition tags on the q/dq nodes, weights stored as
integers even behind a transpose, embedding and bfloat16 / int16 / float8 models, and the
observer types that convert themselves. Outputs stay bitwise equal throughout.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.fx import GraphModule, Node

import qviz
from qviz.engine.graph.qdq_ops import dequantize_ops, is_qdq
from qviz.engine.pt2e.passes.observer_to_qdq import OBSERVER_KEY
from tests.helpers.quantize import quantize

ref_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ref_xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")
ref_utils = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer_utils")
ref_quantizer = pytest.importorskip("torchao.quantization.pt2e.quantizer")
ref_observer = pytest.importorskip("torchao.quantization.pt2e.observer")


def _xnnpack(**config) -> object:
    return ref_xnnpack.XNNPACKQuantizer().set_global(
        ref_xnnpack.get_symmetric_quantization_config(**config)
    )


def _convert_both(
    model: nn.Module, batches: list[tuple], make_quantizer: Callable[[], object]
) -> tuple[GraphModule, GraphModule]:
    """The reference's and qviz's converted models of one exported graph."""
    gm = torch.export.export(model.eval(), batches[0], strict=True).module()
    return _convert_both_from(gm, batches, make_quantizer)


def _convert_both_from(
    gm: GraphModule, batches: list[tuple], make_quantizer: Callable[[], object]
) -> tuple[GraphModule, GraphModule]:
    """The reference's converted model (torchao's flow) and qviz's, from one graph."""
    ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), make_quantizer())
    for b in batches:
        ref(*b)
    return ref_pt2e.convert_pt2e(ref), quantize(gm, batches, make_quantizer()).converted


def _layout(gm: GraphModule) -> Counter:
    """Every q/dq/choose_qparams node and stored integer weight, with its quantization tag."""
    rows: Counter = Counter()
    for n in gm.graph.nodes:
        if is_qdq(n):
            rows[(n.target.__name__, n.meta.get("quantization_tag"))] += 1
        elif n.op == "get_attr" and str(n.target).startswith("_frozen_param"):
            rows[("frozen", n.meta.get("quantization_tag"))] += 1
    return rows


def _assert_same(ref: GraphModule, ours: GraphModule, batches: list[tuple]) -> None:
    assert _layout(ours) == _layout(ref)
    for b in batches:
        expected, got = ref(*b), ours(*b)
        for e, g in zip(
            expected if isinstance(expected, tuple) else (expected,),
            got if isinstance(got, tuple) else (got,),
            strict=True,
        ):
            assert g.dtype == e.dtype
            assert torch.equal(g, e)


class FanOut(nn.Module):
    """conv1's output feeds a linear (through a view), conv2, an add, a multiply, and two
    consumers no quantizer annotates: an exp and the graph output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 3, 3)
        self.conv2 = nn.Conv2d(3, 3, 1)
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        x = self.conv1(x)
        w = self.linear(x.view(-1, 3))
        y = self.conv2(x)
        return w, x + y, x * 2, x.exp(), x


def _is_annotated(node: Node) -> bool:
    return node.meta.get("quantization_annotation") is not None


def test_each_quantized_consumer_reads_its_own_dequantize():
    batches = [(torch.randn(1, 3, 5, 5),) for _ in range(3)]
    ref, ours = _convert_both(FanOut(), batches, _xnnpack)
    dequantize = dequantize_ops()
    checked = 0
    for node in filter(_is_annotated, ours.graph.nodes):
        for arg in node.all_input_nodes:
            if arg.target in dequantize:
                assert len(arg.users) == 1, f"{arg.name} feeds {list(arg.users)}"
                checked += 1
    assert checked >= 5  # conv1's output is read by conv2 and the add, each through its own dq
    shared = [n for n in ours.graph.nodes if n.target in dequantize and len(n.users) > 1]
    # the float exp and the graph output share one dequantize
    assert shared and not any(_is_annotated(u) for n in shared for u in n.users)
    _assert_same(ref, ours, batches)


class TaggingQuantizer(ref_quantizer.Quantizer):
    """A backend's quantizer: XNNPACK's annotators, each partition tagged for the partitioner."""

    def __init__(self, ops: tuple[str, ...], is_dynamic: bool = False) -> None:
        super().__init__()
        self.ops, self.is_dynamic = ops, is_dynamic

    def annotate(self, gm: GraphModule) -> GraphModule:
        config = ref_xnnpack.get_symmetric_quantization_config(
            is_per_channel=True, is_dynamic=self.is_dynamic
        )
        for op in self.ops:
            for index, partition in enumerate(ref_utils.OP_TO_ANNOTATOR[op](gm, config)):
                for node in partition:
                    node.meta["quantization_tag"] = f"backend_{op}_{index}"
        return gm

    def validate(self, gm: GraphModule) -> None:
        pass


class ConvPoolLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        x = nn.functional.hardtanh(self.pool(self.conv(x)))
        return self.linear(x.view(-1, 3))


@pytest.mark.parametrize(
    "ops",
    [("linear", "conv", "adaptive_avg_pool2d"), ("linear", "conv")],
    ids=["all-tagged", "pool-left-float"],
)
def test_quantization_tags_are_ported_to_q_and_dq_as_in_the_reference(ops):
    batches = [(torch.randn(1, 3, 5, 5),)]
    ref, ours = _convert_both(ConvPoolLinear(), batches, lambda: TaggingQuantizer(ops))
    tags = {t for (_, t), _ in _layout(ours).items() if t is not None}
    assert tags == {f"backend_{op}_0" for op in ops}
    # the dequantize into each tagged operator carries that operator's tag
    for node in ours.graph.nodes:
        tag = node.meta.get("quantization_tag")
        if node.op == "call_function" and not is_qdq(node) and tag is not None:
            for arg in node.all_input_nodes:
                if is_qdq(arg):
                    assert arg.meta.get("quantization_tag") == tag, arg.format_node()
    _assert_same(ref, ours, batches)


def test_dynamic_quantization_tags_its_choose_qparams_quantize_and_dequantize():
    batches = [(torch.randn(1, 3, 5, 5),)]
    ref, ours = _convert_both(
        ConvPoolLinear(), batches, lambda: TaggingQuantizer(("linear",), True)
    )
    dynamic = [n for n in ours.graph.nodes if is_qdq(n) and ".tensor" in n.target.__name__]
    assert {n.target.__name__ for n in dynamic} == {
        "choose_qparams.tensor",
        "quantize_per_tensor.tensor",
        "dequantize_per_tensor.tensor",
    }
    assert {n.meta.get("quantization_tag") for n in dynamic} == {"backend_linear_0"}
    _assert_same(ref, ours, batches)


class TransposedWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, 2))

    def forward(self, x):
        return nn.functional.linear(x, self.weight.t())


def test_a_weight_behind_a_transpose_is_stored_as_integers():
    batches = [(torch.randn(2, 2),) for _ in range(2)]
    ref, ours = _convert_both(TransposedWeight(), batches, lambda: _xnnpack(is_per_channel=False))
    ops = Counter(n.target.__name__ for n in ours.graph.nodes if is_qdq(n))
    assert ops == {"quantize_per_tensor.default": 2, "dequantize_per_tensor.default": 3}
    frozen = [n for n in ours.graph.nodes if n.op == "get_attr" and "frozen" in str(n.target)]
    assert len(frozen) == 1 and getattr(ours, frozen[0].target).dtype == torch.int8
    assert not any(n.target == torch.ops.aten.t.default for n in ours.graph.nodes)
    _assert_same(ref, ours, batches)


class EmbeddingConvLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(num_embeddings=10, embedding_dim=8)
        self.conv = nn.Conv2d(8, 16, (1, 3))
        self.linear = nn.Linear(16, 8)

    def forward(self, indices):
        e = torch.permute(torch.unsqueeze(self.emb(indices), 0), (0, 3, 1, 2))
        c = torch.squeeze(torch.permute(self.conv(e), (0, 2, 3, 1)), 0)
        return self.linear(c)


def test_embedding_quantizer_composed_with_xnnpack_as_in_the_tutorial():
    from torchao.quantization.pt2e.quantizer.composable_quantizer import ComposableQuantizer
    from torchao.quantization.pt2e.quantizer.embedding_quantizer import EmbeddingQuantizer

    batches = [(torch.randint(0, 10, (5, 5)),) for _ in range(2)]
    ref, ours = _convert_both(
        EmbeddingConvLinear(),
        batches,
        lambda: ComposableQuantizer([EmbeddingQuantizer(), _xnnpack(is_per_channel=True)]),
    )
    # the embedding table: per-channel with float zero_points, stored as uint8
    emb = next(n for n in ours.graph.nodes if n.target == torch.ops.aten.embedding.default)
    dq = emb.args[0]
    assert dq.target.__name__ == "dequantize_per_channel.default"
    assert getattr(ours, dq.args[0].target).dtype == torch.uint8
    assert getattr(ours, dq.args[2].target).dtype.is_floating_point  # float zero_points
    group = next(
        g for g in ours.plan.groups if g.spec.qscheme == "per_channel_affine_float_qparams"
    )
    assert len(group.qparams.scale) == 10 and isinstance(group.qparams.zero_point[0], float)
    _assert_same(ref, ours, batches)


class DtypeActQuantizer(ref_quantizer.Quantizer):
    """Activations in ``quant_dtype`` (int16, float8), weights int8, as a backend might ask."""

    def __init__(self, quant_dtype: torch.dtype) -> None:
        super().__init__()
        self.quant_dtype = quant_dtype

    def annotate(self, gm: GraphModule) -> GraphModule:
        info = torch.iinfo if self.quant_dtype == torch.int16 else torch.finfo
        act = ref_quantizer.QuantizationSpec(
            dtype=self.quant_dtype,
            quant_min=int(info(self.quant_dtype).min),
            quant_max=int(info(self.quant_dtype).max),
            qscheme=torch.per_tensor_affine,
            observer_or_fake_quant_ctr=ref_observer.default_observer,
        )
        weight = ref_quantizer.QuantizationSpec(
            dtype=torch.int8,
            quant_min=-128,
            quant_max=127,
            qscheme=torch.per_tensor_symmetric,
            observer_or_fake_quant_ctr=ref_observer.default_weight_observer,
        )
        config = ref_utils.QuantizationConfig(act, act, weight, None)
        ref_utils.OP_TO_ANNOTATOR["conv"](gm, config)
        return gm

    def validate(self, gm: GraphModule) -> None:
        pass


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "quant_dtype", [torch.int16, torch.float8_e4m3fn, torch.float8_e5m2], ids=str
)
def test_bfloat16_models_and_int16_float8_activations(dtype, quant_dtype):
    model = nn.Conv2d(3, 3, 3, dtype=dtype)
    batches = [(torch.randn(1, 3, 5, 5, dtype=dtype),) for _ in range(2)]
    ref, ours = _convert_both(model, batches, lambda: DtypeActQuantizer(quant_dtype))
    for n in ours.graph.nodes:
        if n.op == "call_function" and n.target.__name__ == "dequantize_per_tensor.default":
            assert n.kwargs.get("out_dtype", torch.float32) == dtype  # the model's dtype stays
    assert ours(*batches[0]).dtype == dtype
    _assert_same(ref, ours, batches)


class HalfPrecisionQuantizer(ref_quantizer.Quantizer):
    """Linear inputs and outputs rounded to float16 (a PlaceholderObserver of dtype float16)."""

    def annotate(self, gm: GraphModule) -> GraphModule:
        spec = ref_quantizer.QuantizationSpec(
            dtype=torch.float16,
            observer_or_fake_quant_ctr=ref_observer.PlaceholderObserver.with_args(
                dtype=torch.float16
            ),
        )
        for n in gm.graph.nodes:
            if n.target == torch.ops.aten.linear.default:
                n.meta["quantization_annotation"] = ref_quantizer.QuantizationAnnotation(
                    input_qspec_map={n.args[0]: spec}, output_qspec=spec, _annotated=True
                )
        return gm

    def validate(self, gm: GraphModule) -> None:
        pass


def test_a_float16_observer_becomes_a_half_precision_round_trip():
    batches = [(torch.randn(4, 8) * 1e3,)]
    ref, ours = _convert_both(nn.Linear(8, 4), batches, HalfPrecisionQuantizer)
    converts = [n for n in ours.graph.nodes if "convert_element_type" in str(n.target)]
    assert len(converts) == 4  # to float16 and back, on the input and on the output
    float_out = nn.Linear(8, 4)
    assert not torch.equal(ours(*batches[0]), float_out(*batches[0]))
    for b in batches:
        assert torch.equal(ours(*b), ref(*b))


def test_an_observer_with_its_own_convert_converts_itself():
    """The reference's extension point: an observer whose ``convert(model, node)`` writes its
    own q/dq ops (torchao's affine observers use it for per-group quantization)."""

    class RoundToHalves(ref_observer.ObserverBase):
        def __init__(self, **kwargs):
            super().__init__(dtype=torch.int8)

        def forward(self, x):
            return x

        def calculate_qparams(self):
            return torch.tensor([0.5]), torch.tensor([0])

        def convert(self, model: GraphModule, node: Node) -> None:
            with model.graph.inserting_before(node):
                doubled = model.graph.call_function(torch.mul, (node.args[0], 2))
                q = model.graph.call_function(torch.round, (doubled,))
                dq = model.graph.call_function(torch.div, (q, 2))
            node.replace_all_uses_with(dq)
            model.graph.erase_node(node)

    class Quantizer(ref_quantizer.Quantizer):
        def annotate(self, gm):
            spec = ref_quantizer.QuantizationSpec(
                dtype=torch.int8, observer_or_fake_quant_ctr=RoundToHalves
            )
            for n in gm.graph.nodes:
                if n.target == torch.ops.aten.relu.default:
                    n.meta["quantization_annotation"] = ref_quantizer.QuantizationAnnotation(
                        input_qspec_map={n.args[0]: spec}, _annotated=True
                    )
            return gm

        def validate(self, gm):
            pass

    x = torch.tensor([[0.3, -0.8, 1.26]])
    ref, ours = _convert_both(nn.ReLU(), [(x,)], Quantizer)
    assert torch.equal(ours(x), torch.tensor([[0.5, 0.0, 1.5]]))
    assert torch.equal(ours(x), ref(x))


class IndexPutQuantizer(ref_quantizer.Quantizer):
    """``buf.index_put_(idx, x)``: the destination's spec, shared by the values and the result."""

    def annotate(self, gm: GraphModule) -> GraphModule:
        spec = ref_quantizer.QuantizationSpec(
            dtype=torch.int8,
            quant_min=-128,
            quant_max=127,
            qscheme=torch.per_tensor_symmetric,
            observer_or_fake_quant_ctr=ref_observer.default_observer,
        )
        for n in gm.graph.nodes:
            if n.target == torch.ops.aten.index_put_.default:
                dst, value = n.args[0], n.args[2]
                shared = ref_quantizer.SharedQuantizationSpec((dst, n))
                n.meta["quantization_annotation"] = ref_quantizer.QuantizationAnnotation(
                    input_qspec_map={dst: spec, value: shared}, output_qspec=shared
                )
        return gm

    def validate(self, gm: GraphModule) -> None:
        pass


class Cache(nn.Module):
    def __init__(self, view: bool) -> None:
        super().__init__()
        self.view = view
        self.register_buffer("buf", torch.zeros(2, 4) if view else torch.zeros(4))

    def forward(self, x, idx):
        dst = self.buf.select(0, 0) if self.view else self.buf
        return dst.index_put_((idx,), x).clone()


@pytest.mark.parametrize("view", [False, True], ids=["buffer", "view-of-buffer"])
def test_a_buffer_written_in_place_stays_model_state(view):
    batches = [(torch.tensor([1.0, 2.0]), torch.tensor([1, 3]))]
    ref, ours = _convert_both(Cache(view), batches, IndexPutQuantizer)
    assert "buf" in dict(ours.named_buffers())  # not folded into a constant

    def buffers_to_mutate(gm: GraphModule) -> dict[str, str]:
        exported = torch.export.export(gm, batches[0], strict=True).run_decompositions({})
        return exported.graph_signature.buffers_to_mutate

    assert set(buffers_to_mutate(ours).values()) == {"buf"}
    assert buffers_to_mutate(ours) == buffers_to_mutate(ref)
    _assert_same(ref, ours, batches)


def test_the_plan_says_why_a_written_buffer_is_not_observed():
    example = (torch.tensor([1.0, 2.0]), torch.tensor([1, 3]))
    gm = torch.export.export(Cache(False).eval(), example, strict=True).module()
    plan = qviz.prepare_pt2e(gm, IndexPutQuantizer()).plan
    record = plan.record("buf -> index_put_")
    assert "written in place" in record.unobserved
    assert "not observed: buffer written in place" in str(plan)
    others = [r for r in plan if r.tensor != record.tensor]
    assert others and all(r.unobserved == "" and r.group == record.group for r in others)


class AffineQuantizer(ref_quantizer.Quantizer):
    """Transformer-style linear quantization with torchao's affine observers: per-token
    activations (static or dynamic), per-group (or per-channel) weights."""

    def __init__(self, weight_granularity: object, dynamic: bool) -> None:
        super().__init__()
        self.weight_granularity, self.dynamic = weight_granularity, dynamic

    def annotate(self, gm: GraphModule) -> GraphModule:
        from torchao.quantization.pt2e._affine_quantization import (
            AffineQuantizedMinMaxObserver,
            AffineQuantizedPlaceholderObserver,
        )
        from torchao.quantization.pt2e.observer import MappingType, PerToken

        def spec(observer, granularity, dynamic=False):
            return ref_quantizer.QuantizationSpec(
                dtype=torch.int8,
                quant_min=-128,
                quant_max=127,
                qscheme=None,
                is_dynamic=dynamic,
                observer_or_fake_quant_ctr=observer.with_args(
                    target_dtype=torch.int8,
                    mapping_type=MappingType.SYMMETRIC,
                    granularity=granularity,
                ),
            )

        if self.dynamic:
            act = spec(AffineQuantizedPlaceholderObserver, PerToken(), dynamic=True)
        else:
            act = spec(AffineQuantizedMinMaxObserver, PerToken())
        weight = spec(AffineQuantizedMinMaxObserver, self.weight_granularity)
        for n in gm.graph.nodes:
            if n.target == torch.ops.aten.linear.default:
                n.meta["quantization_annotation"] = ref_quantizer.QuantizationAnnotation(
                    input_qspec_map={n.args[0]: act, n.args[1]: weight}, _annotated=True
                )
        return gm

    def validate(self, gm: GraphModule) -> None:
        pass


@pytest.mark.parametrize(
    ("granularity", "dynamic"),
    [("group", False), ("group", True), ("channel", True)],
    ids=["static-per-token-per-group", "dynamic-per-token-per-group", "dynamic-per-channel"],
)
def test_affine_per_group_and_per_token_quantization(granularity, dynamic):
    from torchao.quantization.pt2e.observer import PerAxis, PerGroup

    weights = PerGroup(group_size=32) if granularity == "group" else PerAxis(axis=0)
    batches = [(torch.randn(5, 128),)]
    ref, ours = _convert_both(
        nn.Linear(128, 20), batches, lambda: AffineQuantizer(weights, dynamic)
    )
    ops = Counter(str(n.target) for n in ours.graph.nodes if is_qdq(n))
    assert ops["torchao.quantize_affine"] == 1  # the activation's; the weight's was folded
    assert ops["torchao.dequantize_affine"] == 2
    assert ops["torchao.choose_qparams_affine"] == (1 if dynamic else 0)
    frozen = [n for n in ours.graph.nodes if str(n.target).startswith("_frozen_param")]
    assert [getattr(ours, n.target).dtype for n in frozen] == [torch.int8]
    _assert_same(ref, ours, batches)


def test_a_stored_integer_weight_keeps_the_weights_metadata():
    x = torch.randn(2, 2)
    gm = torch.export.export(nn.Linear(2, 2).eval(), (x,), strict=True).module()
    weight = next(n for n in gm.graph.nodes if n.op == "get_attr" and "weight" in n.name)
    weight.meta["quantization_tag"] = "backend_linear_0"
    ref, ours = _convert_both_from(gm, [(x,)], _xnnpack)
    (frozen,) = [n for n in ours.graph.nodes if str(n.target).startswith("_frozen_param")]
    assert frozen.meta.get("quantization_tag") == "backend_linear_0"
    for key in frozen.meta:
        assert frozen.meta[key] == weight.meta[key], key
    assert not any(OBSERVER_KEY in n.meta for n in ours.graph.nodes)  # read, then removed
    _assert_same(ref, ours, [(x,)])
