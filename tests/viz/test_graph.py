"""qviz.viz.graph: structure of the drawn records and DOT text, not pixels."""

import re
import shutil

import pytest
import torch
from torch import nn

import qviz
from qviz.data import digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.specs import QuantizationAnnotation, SharedQuantizationSpec
from qviz.errors import ConfigError
from qviz.viz import QGraph, graph
from tests.engine.test_tutorial_quantizers import ACT, WEIGHT, Annotate, TwoConvCat

pytest.importorskip("graphviz")
aten = torch.ops.aten
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs graphviz's dot")


def _cat_annotation(node):
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


@pytest.fixture(scope="module")
def cat_prepared():
    gm = qviz.export(TwoConvCat().eval(), (torch.randn(1, 3, 4, 4),))
    return qviz.prepare_pt2e(gm, Annotate(_cat_annotation))


@pytest.fixture(scope="module")
def digits():
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    gm = qviz.export(digits_model().eval(), (x,), dynamic_batch=True)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = qviz.prepare_pt2e(gm, quantizer)
    qviz.calibrate(prepared, [x], progress=False)
    return gm, prepared, qviz.convert_pt2e(prepared)


def _dot_nodes(dot: str) -> set[str]:
    return set(re.findall(r'^\s*"?([\w/.]+)"? \[', dot, flags=re.M)) - {"graph", "node", "edge"}


def test_cat_transitivity_is_one_group_on_both_conv_outputs_and_cat_inputs(cat_prepared):
    g = graph(cat_prepared)
    assert g.stage == "observed"
    group = cat_prepared.plan.group_of("conv2d", "cat").group
    markers = [n for n in g.view.nodes if n.kind == "marker" and n.group == group]
    refs = {r for m in markers for r in m.refs}
    assert refs == {"conv2d", "conv2d_1", "conv2d -> cat", "conv2d_1 -> cat", "cat"}
    # the two conv outputs each carry a marker labelled with the one group, in one colour
    assert {m.name for m in markers} >= {"obs/conv2d", "obs/conv2d_1"}
    labels = re.findall(rf'"obs/conv2d(?:_1)?" \[label=g{group} .*?fillcolor="(#\w+)"', g.dot)
    assert len(labels) == 2 and len(set(labels)) == 1
    # the marker's tooltip says how the second input joined
    assert "conv2d_1 -> cat [transitive via conv2d -> cat]" in g.dot


def test_observer_markers_come_from_the_plan(digits):
    _, prepared, _ = digits
    g = graph(prepared)
    shown = {r for n in g.view.nodes if n.kind == "marker" for r in n.refs}
    assert shown == {str(rec.tensor) for rec in prepared.plan.tensors}
    assert not any(n.name.startswith("observer_") for n in g.view.nodes)


def test_float_nodes_are_grey_with_the_reason_in_the_tooltip():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    gm = qviz.export(Net().eval(), (torch.randn(2, 4),))
    config = get_symmetric_quantization_config()
    quantizer = XNNPACKQuantizer().set_global(config).set_module_name("b", None)
    prepared = qviz.prepare_pt2e(gm, quantizer)
    floats = prepared.plan.float_nodes
    assert floats
    g = graph(prepared)
    for record in floats:
        node = next(n for n in g.view.nodes if n.name == record.node)
        assert node.kind == "float"
        assert f"left in float: {record.reason}" in node.tooltip
        assert f"left in float: {record.reason}" in g.dot


def test_converted_labels_carry_the_plan_scales_and_mark_int8_weights(digits):
    _, _, converted = digits
    g = graph(converted)
    assert g.stage == "converted"
    qdq = [n for n in g.view.nodes if n.kind in ("quantize", "dequantize")]
    assert qdq and all(n.group is not None for n in qdq)
    for node in qdq:
        scale = converted.plan.group(node.group).qparams.scale
        assert f"scale={scale:.4g}" in node.detail
        assert f"scale={scale:.4g}" in g.dot
    weights = [n for n in qdq if "int8 weight" in n.detail]
    assert len(weights) == 6  # five convs and the linear


def test_per_channel_scales_show_their_range():
    gm = qviz.export(nn.Sequential(nn.Conv2d(2, 3, 1)).eval(), (torch.randn(1, 2, 4, 4),))
    config = get_symmetric_quantization_config(is_per_channel=True)
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    qviz.calibrate(prepared, [torch.randn(1, 2, 4, 4)], progress=False)
    g = graph(qviz.convert_pt2e(prepared))
    assert any(re.search(r"scale=[\d.e-]+\.\.[\d.e-]+ \(3 ch\)", n.detail) for n in g.view.nodes)


def test_collapsing_reduces_the_node_count(digits):
    _, prepared, _ = digits
    full, depth, named = (
        graph(prepared),
        graph(prepared, collapse=1),
        graph(prepared, collapse=["block"]),
    )
    assert len(depth) < len(named) < len(full)
    assert len(_dot_nodes(depth.dot)) < len(_dot_nodes(full.dot))
    block = next(n for n in named.view.nodes if n.kind == "collapsed")
    assert (block.label, block.count) == ("block", 5)
    assert "block (5 ops)" in named.dot


def test_bad_collapse_and_model_are_config_errors(digits):
    gm, _, _ = digits
    with pytest.raises(ConfigError, match="depth"):
        graph(gm, collapse=0)
    with pytest.raises(ConfigError, match=r"qviz\.export"):
        graph(nn.Linear(2, 2))


def test_params_hidden_unless_asked(digits):
    gm, _, _ = digits
    assert not any(n.kind == "param" for n in graph(gm).view.nodes)
    assert any(n.kind == "param" for n in graph(gm, show_params=True).view.nodes)


def test_highlight_thickens_the_outline(digits):
    _, prepared, _ = digits
    g = graph(prepared, highlight="block")
    assert g.dot.count('border="3"') == 5  # conv, relu, conv, add, relu
    assert graph(prepared, highlight=["linear"]).dot.count('border="3"') == 1


def test_same_model_gives_identical_dot(digits):
    _, prepared, converted = digits
    assert graph(prepared).dot == graph(prepared).dot
    assert graph(converted, collapse=1).dot == graph(converted, collapse=1).dot
    assert "0x" not in graph(prepared).dot


@needs_dot
def test_svg_and_save(digits, tmp_path):
    _, prepared, _ = digits
    g = graph(prepared)
    assert isinstance(g, QGraph)
    assert "<svg" in g.svg()
    assert g._repr_mimebundle_()["image/svg+xml"].count("<svg") == 1
    assert g.save(tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ConfigError, match=r"\.svg"):
        g.save(tmp_path / "g.jpg")


def test_missing_dot_names_the_package(digits, monkeypatch):
    import graphviz

    _, prepared, _ = digits
    g = graph(prepared)

    def missing(*args, **kwargs):
        raise graphviz.ExecutableNotFound(("dot",))

    monkeypatch.setattr(g.digraph, "pipe", missing)
    with pytest.raises(qviz.errors.MissingDependencyError, match="apt install graphviz"):
        g.svg()
