"""Quantizer base class and ComposableQuantizer (qviz.engine.quantizers.base)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.fx import GraphModule

from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.quantizers.base import FLOAT_REASON_KEY, ComposableQuantizer, Quantizer
from qviz.engine.specs import QuantizationAnnotation, SharedQuantizationSpec
from qviz.errors import AnnotationError, ConfigError

KEY = "quantization_annotation"
STATIC = get_symmetric_quantization_config()
DYNAMIC = get_symmetric_quantization_config(is_dynamic=True)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(36 * 4, 2)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))


@pytest.fixture(scope="module")
def exported() -> GraphModule:
    return torch.export.export(Model().eval(), (torch.randn(1, 3, 8, 8),)).module()


class Convs(Quantizer):
    """Annotates every conv with a fresh annotation, claimed or not (a careless quantizer)."""

    def __init__(self, mode: str = "replace", claim: bool = False) -> None:
        self.mode, self.claim = mode, claim

    def annotate(self, model: GraphModule) -> GraphModule:
        for node in model.graph.nodes:
            if node.target != torch.ops.aten.conv2d.default:
                continue
            if self.mode == "replace":
                spec = STATIC.input_activation
                node.meta[KEY] = QuantizationAnnotation({node.args[0]: spec}, _annotated=self.claim)
            elif self.mode == "mutate" and KEY in node.meta:
                node.meta[KEY].input_qspec_map[node.args[0]] = None
            elif self.mode == "remove":
                node.meta.pop(KEY, None)
        return model

    def validate(self, model: GraphModule) -> None:
        pass


class Recorder(Quantizer):
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def transform_for_annotation(self, model):
        self.log.append(f"transform {self.name}")
        return model

    def annotate(self, model):
        self.log.append(f"annotate {self.name}")
        return model

    def validate(self, model):
        self.log.append(f"validate {self.name}")

    def prepare_obs_or_fq_callback(self, model, edge_or_node_to_obs_or_fq):
        self.log.append(f"callback {self.name}")


def _plain(annotation):
    """An annotation as values that compare across graphs (shared specs by node name)."""
    if annotation is None:
        return None

    def spec(s):
        return ("shared", s.edge_or_node.name) if isinstance(s, SharedQuantizationSpec) else s

    inputs = {node.name: spec(s) for node, s in annotation.input_qspec_map.items()}
    return inputs, spec(annotation.output_qspec), annotation._annotated


def test_quantizer_is_abstract_with_default_hooks() -> None:
    with pytest.raises(TypeError):
        Quantizer()  # type: ignore[abstract]
    q = Convs()
    gm = torch.fx.symbolic_trace(nn.ReLU())
    assert q.transform_for_annotation(gm) is gm
    assert q.prepare_obs_or_fq_callback(gm, {}) is None


def test_composable_runs_every_hook_in_order() -> None:
    log: list[str] = []
    q = ComposableQuantizer([Recorder(log, "a"), Recorder(log, "b")])
    gm = torch.fx.symbolic_trace(nn.ReLU())
    q.transform_for_annotation(gm)
    q.annotate(gm)
    q.validate(gm)
    q.prepare_obs_or_fq_callback(gm, {})
    assert log == [
        f"{step} {name}"
        for step in ("transform", "annotate", "validate", "callback")
        for name in "ab"
    ]


def test_composable_rejects_non_quantizers() -> None:
    with pytest.raises(ConfigError, match=r"item #1 \(str\) has no annotate\(\) method"):
        ComposableQuantizer([Convs(), "xnnpack"])


def test_dynamic_linear_then_static_equals_one_quantizer(exported: GraphModule) -> None:
    """Each quantizer claims its own nodes; together they equal one quantizer's settings."""
    composed, single = copy.deepcopy(exported), copy.deepcopy(exported)
    linear_only = XNNPACKQuantizer().set_module_type(nn.Linear, DYNAMIC)
    ComposableQuantizer([linear_only, XNNPACKQuantizer().set_global(STATIC)]).annotate(composed)
    XNNPACKQuantizer().set_global(STATIC).set_module_type(nn.Linear, DYNAMIC).annotate(single)
    for a, b in zip(composed.graph.nodes, single.graph.nodes, strict=True):
        assert _plain(a.meta.get(KEY)) == _plain(b.meta.get(KEY)), a.name
        assert a.meta.get(FLOAT_REASON_KEY) == b.meta.get(FLOAT_REASON_KEY), a.name
    conv = next(n for n in composed.graph.nodes if n.name == "conv2d")
    assert conv.meta[KEY]._annotated and FLOAT_REASON_KEY not in conv.meta


@pytest.mark.parametrize(
    ("mode", "verb"),
    [("replace", "re-annotated"), ("mutate", "re-annotated"), ("remove", "removed")],
)
def test_composable_refuses_a_second_annotation(
    exported: GraphModule, mode: str, verb: str
) -> None:
    gm = copy.deepcopy(exported)
    q = ComposableQuantizer([XNNPACKQuantizer().set_global(STATIC), Convs(mode)])
    with pytest.raises(AnnotationError) as info:
        q.annotate(gm)
    message = str(info.value)
    assert message.startswith("%conv2d : ")
    assert (
        f"was annotated by quantizer #0 (XNNPACKQuantizer) and then {verb} by quantizer #1 (Convs)"
        in message
    )
    assert "set_module_name / set_module_type / set_operator_type with None" in message
    assert "_annotated=True" in message


def test_a_claimed_node_is_left_alone_an_unclaimed_one_is_taken(exported: GraphModule) -> None:
    """Quantizers skip nodes claimed with _annotated=True; replacing an unclaimed one still
    changes an earlier quantizer's annotation, which ComposableQuantizer reports."""
    gm = copy.deepcopy(exported)
    ComposableQuantizer([Convs(claim=True), XNNPACKQuantizer().set_global(STATIC)]).annotate(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert nodes["conv2d"].meta[KEY].output_qspec is None  # Convs' annotation, untouched
    assert nodes["linear"].meta[KEY]._annotated
    with pytest.raises(AnnotationError, match=r"then re-annotated by quantizer #1 \(XNNPACK"):
        gm = copy.deepcopy(exported)
        ComposableQuantizer([Convs(), XNNPACKQuantizer().set_global(STATIC)]).annotate(gm)


def test_a_weight_only_config_observes_only_weights():
    """No activation spec: nothing shares an activation edge, and prepare succeeds."""
    import qviz
    from qviz.data import digits_model
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    from qviz.engine.specs import QuantizationConfig

    weight = get_symmetric_quantization_config(is_per_channel=True).weight
    config = QuantizationConfig(None, None, weight, None, False)
    gm = qviz.export(digits_model(), (torch.randn(2, 1, 8, 8),))
    plan = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config)).plan
    assert plan.groups and all(g.owner.producer.endswith("weight") for g in plan.groups)
