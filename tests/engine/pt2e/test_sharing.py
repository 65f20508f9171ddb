"""Sharing groups on the tutorial's cases, and the errors the reference crashes on."""

import pytest
import torch
from torch import nn

from qviz.engine.pt2e.sharing import Link, describe, resolve_sharing
from qviz.engine.specs import QuantizationSpec, SharedQuantizationSpec
from qviz.errors import AnnotationError
from tests.helpers.tutorial_quantizers import TwoConvCat


def _spec(quant_min: int = -128, quant_max: int = 127) -> QuantizationSpec:
    return QuantizationSpec(
        dtype=torch.int8,
        observer_or_fake_quant_ctr=object,
        quant_min=quant_min,
        quant_max=quant_max,
        qscheme=torch.per_tensor_affine,
    )


A, B = _spec(), _spec(-127, 127)


def _nodes(module: nn.Module) -> dict[str, torch.fx.Node]:
    return {n.name: n for n in torch.fx.symbolic_trace(module).graph.nodes}


def test_cat_transitivity_gives_one_group():
    n = _nodes(TwoConvCat())
    conv1, conv2, cat = n["conv1"], n["conv2"], n["cat"]
    specs = {
        conv1: A,
        conv2: A,
        (conv1, cat): A,
        (conv2, cat): SharedQuantizationSpec((conv1, cat)),
        cat: SharedQuantizationSpec((conv1, cat)),
    }
    sharing = resolve_sharing(specs)
    assert len(sharing.groups) == 1
    (members,) = sharing.groups.values()
    assert set(members) == set(specs)
    how = {describe(k): (m.how, m.via and describe(m.via)) for k, m in sharing.members.items()}
    assert how["conv1"] == (Link.OWN_SPEC, None)  # the first concrete spec owns the observer
    assert how["conv1 -> cat"] == (Link.IMPLICIT, "conv1")
    assert how["conv2 -> cat"] == (Link.TRANSITIVE, "conv1 -> cat")
    assert how["cat"] == (Link.TRANSITIVE, "conv1 -> cat")
    assert how["conv2"][0] is Link.TRANSITIVE
    assert sharing.spec[0] is A


def test_separate_specs_on_add_inputs_do_not_share():
    class Add(nn.Module):
        def forward(self, x, y):
            return x + y

    n = _nodes(Add())
    x, y, add = n["x"], n["y"], n["add"]
    sharing = resolve_sharing({(x, add): A, (y, add): B, add: A})
    assert len(sharing.groups) == 3
    assert all(m.how is Link.OWN_SPEC for m in sharing.members.values())


def test_shared_inputs_on_add():
    class Add(nn.Module):
        def forward(self, x, y):
            return x + y

    n = _nodes(Add())
    x, y, add = n["x"], n["y"], n["add"]
    sharing = resolve_sharing({(x, add): A, (y, add): SharedQuantizationSpec((x, add)), add: A})
    assert [len(m) for m in sharing.groups.values()] == [2, 1]
    assert sharing.members[(y, add)].how is Link.EXPLICIT


def test_implicit_sharing_can_be_turned_off():
    n = _nodes(nn.Sequential(nn.ReLU(), nn.ReLU()))
    r0, r1 = n["_0"], n["_1"]
    specs = {r0: A, (r0, r1): A}
    assert len(resolve_sharing(specs).groups) == 1
    assert len(resolve_sharing(specs, implicit=lambda node: node is not r1).groups) == 2
    # equal-looking specs of different ranges never share implicitly
    assert len(resolve_sharing({r0: A, (r0, r1): B}).groups) == 2


def test_sibling_edges_of_one_producer_share():
    class Fork(nn.Module):
        def forward(self, x):
            return torch.relu(x), torch.sigmoid(x)

    n = _nodes(Fork())
    x, relu, sig = n["x"], n["relu"], n["sigmoid"]
    sharing = resolve_sharing({(x, relu): A, (x, sig): A})
    assert len(sharing.groups) == 1


def test_sharing_with_an_unannotated_edge_names_it():
    n = _nodes(TwoConvCat())
    conv1, conv2, cat = n["conv1"], n["conv2"], n["cat"]
    with pytest.raises(AnnotationError, match=r"conv2 -> cat: .*points at conv1 -> cat.*no quant"):
        resolve_sharing({(conv2, cat): SharedQuantizationSpec((conv1, cat))})


def test_a_cycle_without_a_concrete_spec_names_the_chain():
    n = _nodes(TwoConvCat())
    conv1, conv2, cat = n["conv1"], n["conv2"], n["cat"]
    specs = {
        (conv1, cat): SharedQuantizationSpec((conv2, cat)),
        (conv2, cat): SharedQuantizationSpec((conv1, cat)),
    }
    with pytest.raises(AnnotationError, match=r"sharing cycle .*conv1 -> cat.*conv2 -> cat"):
        resolve_sharing(specs)
    with pytest.raises(AnnotationError, match="sharing cycle"):
        resolve_sharing(
            {conv1: SharedQuantizationSpec(conv2), conv2: SharedQuantizationSpec(conv1)}
        )


def test_an_input_edge_shared_by_clone_and_eq_is_one_group_as_in_the_reference():
    """``x -> clone -> eq(clone, x)``: clone's output shares (x, clone); eq's second input
    shares its first. Implicit sharing then joins (x, clone) and (x, eq): one observer for
    all four, as torchao 0.18 decides (and without the cycle its older versions recursed on).
    torchao's prepare changes the model it is given; qviz's returns a prepared copy."""
    import copy

    import qviz

    ref_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
    ref_quantizer = pytest.importorskip("torchao.quantization.pt2e.quantizer")
    ref_observer = pytest.importorskip("torchao.quantization.pt2e.observer")

    class Quantizer(ref_quantizer.Quantizer):
        def annotate(self, gm):
            spec = ref_quantizer.QuantizationSpec(
                dtype=torch.uint8,
                quant_min=0,
                quant_max=255,
                qscheme=torch.per_tensor_affine,
                observer_or_fake_quant_ctr=ref_observer.default_observer,
            )
            for n in gm.graph.nodes:
                shared = ref_quantizer.SharedQuantizationSpec((n.args[0], n)) if n.args else None
                if n.target == torch.ops.aten.clone.default:
                    inputs, output = {n.args[0]: spec}, shared
                elif n.target == torch.ops.aten.eq.Tensor:
                    inputs, output = {n.args[0]: spec, n.args[1]: shared}, None
                else:
                    continue
                n.meta["quantization_annotation"] = ref_quantizer.QuantizationAnnotation(
                    input_qspec_map=inputs, output_qspec=output, _annotated=True
                )
            return gm

        def validate(self, gm):
            pass

    class M(nn.Module):
        def forward(self, x):
            return torch.eq(x.clone(), x)

    x = torch.randn(1, 5)
    gm = torch.export.export(M().eval(), (x,), strict=True).module()
    ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), Quantizer())
    ours = qviz.prepare_pt2e(gm, Quantizer())
    ref_observers = {type(m).__name__ for n, m in ref.named_modules() if "activation_post" in n}
    assert len([n for n, _ in ref.named_modules() if "activation_post" in n]) == 1
    assert ref_observers == {"MinMaxObserver"}
    (group,) = ours.plan.groups
    assert {str(m) for m in group.members} == {"x -> clone", "clone", "clone -> eq", "x -> eq"}
    calls = {
        n.args[0].name
        for n in ours.graph.nodes
        if n.op == "call_module" and "activation" in n.target
    }
    assert calls == {"x", "clone"}  # one observer, called once per tensor
    assert torch.equal(ours(x), ref(x))
