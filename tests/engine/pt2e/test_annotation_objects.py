"""A quantizer's annotation objects reach the prepared and converted graphs as it wrote them.

prepare reads each annotation through a normalised view and leaves the object in
``node.meta["quantization_annotation"]``: a subclass keeps its class and its own fields (torchao's
X86 annotation's ``_is_output_of_quantized_pattern``, which torchao's X86 and Arm quantizers read).
"""

import copy
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import (
    QuantizationAnnotation,
    Quantizer,
    SharedQuantizationSpec,
    XNNPACKQuantizer,
    get_symmetric_quantization_config,
)
from qviz.engine.specs import Q_ANNOTATION_KEY

ref_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ref_x86 = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")


@dataclass
class TaggedAnnotation(QuantizationAnnotation):
    tag: str = ""


class Tagging(Quantizer):
    """XNNPACK's annotations, each re-written as a TaggedAnnotation naming its node."""

    def __init__(self) -> None:
        self.inner = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())

    def annotate(self, model):
        self.inner.annotate(model)
        for node in model.graph.nodes:
            ann = node.meta.get(Q_ANNOTATION_KEY)
            if ann is not None:
                node.meta[Q_ANNOTATION_KEY] = TaggedAnnotation(
                    ann.input_qspec_map, ann.output_qspec, ann.allow_implicit_sharing,
                    ann._annotated, tag=f"mine:{node.name}",
                )  # fmt: skip
        return model

    def validate(self, model):
        pass


class LinearAddRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.a(x) + self.b(x)), torch.relu(self.a(x) + x)


def _tags(gm):
    return {
        n.name: (type(n.meta[Q_ANNOTATION_KEY]), getattr(n.meta[Q_ANNOTATION_KEY], "tag", None))
        for n in gm.graph.nodes
        if Q_ANNOTATION_KEY in n.meta
    }


def _keys_in_graph(gm):
    """Every node an annotation names is ``gm``'s own (not the graph it was copied from)."""
    for n in gm.graph.nodes:
        ann = n.meta.get(Q_ANNOTATION_KEY)
        if ann is None:
            continue
        keys = list(ann.input_qspec_map)
        spec = ann.output_qspec
        if hasattr(spec, "edge_or_node"):
            key = spec.edge_or_node
            keys += list(key) if isinstance(key, tuple) else [key]
        assert all(k.graph is gm.graph for k in keys)


def test_a_subclass_annotation_keeps_its_class_and_fields_through_prepare_and_convert():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2)).eval()
    x = torch.randn(2, 3, 6, 6)
    gm = qviz.export(model, (x,))
    prepared = qviz.prepare_pt2e(gm, Tagging())
    tags = _tags(prepared)
    assert tags and all(cls is TaggedAnnotation for cls, _ in tags.values())
    assert all(tag == f"mine:{name}" for name, (_, tag) in tags.items())
    qviz.calibrate(prepared, [x], progress=False)
    converted = qviz.convert_pt2e(prepared)
    after = _tags(converted)  # weights are folded into int8 constants: their nodes are gone
    assert {"conv2d", "relu", "linear"} <= set(after)
    assert all(after[name] == tags[name] for name in after if name in tags)
    _keys_in_graph(converted)
    # and the numbers are XNNPACKQuantizer's own
    xnnpack = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    plain = qviz.prepare_pt2e(gm, xnnpack)
    qviz.calibrate(plain, [x], progress=False)
    assert torch.equal(qviz.convert_pt2e(plain)(x), converted(x))


def test_a_subclass_annotation_survives_qat_prepare_with_conv_bn():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    x = torch.randn(2, 3, 6, 6)
    gm = qviz.export(model, (x,))

    class TaggingQat(Tagging):
        def __init__(self) -> None:
            config = get_symmetric_quantization_config(is_qat=True)
            self.inner = XNNPACKQuantizer().set_global(config)

    prepared = qviz.prepare_qat_pt2e(gm, TaggingQat())
    tags = _tags(prepared)
    assert tags and all(cls is TaggedAnnotation for cls, _ in tags.values())
    conv = next(n for n in prepared.graph.nodes if n.target == torch.ops.aten.conv2d.default)
    assert conv.meta[Q_ANNOTATION_KEY].tag == f"mine:{conv.name}"
    _keys_in_graph(prepared)
    prepared(x)


def _x86():
    quantizer = ref_x86.X86InductorQuantizer()
    return quantizer.set_global(ref_x86.get_default_x86_inductor_quantization_config())


def test_torchaos_x86_annotations_keep_their_class_and_match_torchaos_convert():
    x = torch.randn(4, 8)
    gm = qviz.export(LinearAddRelu().eval(), (x,))
    ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), _x86())
    ref(x)
    ref = ref_pt2e.convert_pt2e(ref)
    ours = qviz.prepare_pt2e(gm, _x86())
    annotated = [n for n in ours.graph.nodes if Q_ANNOTATION_KEY in n.meta]
    x86_class = ref_x86._X86InductorQuantizationAnnotation
    assert annotated and all(type(n.meta[Q_ANNOTATION_KEY]) is x86_class for n in annotated)
    fused = {n.name for n in annotated if n.meta[Q_ANNOTATION_KEY]._is_output_of_quantized_pattern}
    assert fused  # the field torchao's own propagation reads
    qviz.calibrate(ours, [x], progress=False)
    ours = qviz.convert_pt2e(ours)
    for n in ours.graph.nodes:
        if n.name in fused:
            assert type(n.meta[Q_ANNOTATION_KEY]) is x86_class
            assert n.meta[Q_ANNOTATION_KEY]._is_output_of_quantized_pattern
    _keys_in_graph(ours)
    for a, b in zip(ref(x), ours(x), strict=True):
        assert torch.equal(a, b)
    targets = [str(n.target) for n in ref.graph.nodes if "quantize" in str(n.target)]
    assert sorted(targets) == sorted(
        str(n.target) for n in ours.graph.nodes if "quantize" in str(n.target)
    )


def test_torchaos_shared_spec_keeps_its_class_after_convert():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.MaxPool2d(2)).eval()
    x = torch.randn(1, 3, 8, 8)
    gm = qviz.export(model, (x,))
    prepared = qviz.prepare_pt2e(gm, _x86())
    qviz.calibrate(prepared, [x], progress=False)
    converted = qviz.convert_pt2e(prepared)
    pool = next(n for n in converted.graph.nodes if "max_pool2d" in str(n.target))
    spec = pool.meta[Q_ANNOTATION_KEY].output_qspec
    assert not isinstance(spec, SharedQuantizationSpec) and hasattr(spec, "edge_or_node")
    assert spec.edge_or_node[1] is pool
