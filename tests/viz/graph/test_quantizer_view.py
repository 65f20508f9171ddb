"""qviz.viz.graph on a graph exported from a quant_nn model: one marker per TensorQuantizer."""

import re
import shutil

import pytest
import torch
from torch import nn

import qviz
from qviz.engine import quant_nn
from qviz.engine.tensor.records import quantizer_records
from qviz.engine.tensor.tensor_quantizer import fb_fake_quant
from qviz.viz import graph

pytest.importorskip("graphviz")
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs graphviz's dot")
X = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(0))
ARITHMETIC = {"div", "clamp_min", "reshape", "reciprocal", "round", "clamp", "mul", "zeros"}


@pytest.fixture(scope="module")
def model(calibrated_quant_nn_digits):
    """The digits twin: inputs calibrated with entropy, weights with max (per channel),
    block.conv2's input quantizer disabled."""
    return calibrated_quant_nn_digits("block.conv2._input_quantizer")


@pytest.fixture(scope="module")
def exported(model):
    return qviz.export(model, (X,))


def _dot_node_names(dot: str) -> set[str]:
    return set(re.findall(r'^\s*"?([\w/.@]+)"? \[', dot, flags=re.M)) - {"graph", "node", "edge"}


def test_one_marker_per_enabled_quantizer_labelled_with_amax_scale_and_method(exported):
    g = graph(exported)
    assert g.stage == "quant_nn"
    records = quantizer_records(exported)
    markers = {n.name: n for n in g.view.nodes if n.kind == "marker"}
    assert set(markers) == {f"tq/{r.name}" for r in records} and len(markers) == 13
    for r in records:
        node = markers[f"tq/{r.name}"]
        if r.role == "input":  # per tensor: one line, as the brief's example
            label = f"int8 amax={r.amax[0]:.3g} scale={r.scale[0]:.3g} entropy"
            assert (node.label, node.detail, node.group) == (label, "", 0)
            assert f'"tq/{r.name}" [label="{label}"' in g.dot
        else:  # per channel: the ranges
            amax = f"amax={min(r.amax):.3g}..{max(r.amax):.3g} ({len(r.amax)} ch)"
            scale = f"scale={min(r.scale):.3g}..{max(r.scale):.3g}"
            assert (node.label, node.detail, node.group) == ("int8/ch0 max", f"{amax}\\n{scale}", 1)
            assert f'label="int8/ch0 max\\n{amax}\\n{scale}"' in g.dot
    assert "conv1.0._input_quantizer: input quantizer of QuantConv2d conv1.0" in g.dot  # tooltip


def test_the_quantizers_arithmetic_and_amax_buffers_are_not_drawn(exported):
    for show_params in (False, True):
        g = graph(exported, show_params=show_params)
        drawn = _dot_node_names(g.dot)
        hidden = {n for r in quantizer_records(exported) for n in r.nodes}
        assert not drawn & hidden
        assert not {n.label for n in g.view.nodes if n.kind == "op"} & ARITHMETIC
        assert "_amax" not in g.dot
    assert "fc_weight" in _dot_node_names(g.dot)  # show_params draws the weights themselves


def test_markers_sit_on_the_edges_they_quantize(exported):
    dot = graph(exported).dot
    assert 'relu_2 -> "tq/pool._input_quantizer"' in dot
    assert '"tq/pool._input_quantizer" -> max_pool2d' in dot
    assert '"tq/fc._weight_quantizer" -> linear' in dot
    assert not re.search(r"^\s*relu_2 -> max_pool2d$", dot, re.M)  # it goes through the marker
    with_weights = graph(exported, show_params=True).dot
    assert 'fc_weight -> "tq/fc._weight_quantizer"' in with_weights
    # the op's tooltip names its inputs past the hidden arithmetic
    assert "max_pool2d = max_pool2d.default(pool._input_quantizer(relu_2)" in dot


def test_a_disabled_quantizer_is_not_drawn(exported):
    g = graph(exported)
    assert "tq/block.conv2._input_quantizer" not in g.dot
    assert re.search(r"^\s*relu_1 -> conv2d_2$", g.dot, re.M)  # unquantized: a plain arrow


def test_dynamic_quantizers_and_repeated_calls():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.pool = quant_nn.QuantMaxPool2d(2)

        def forward(self, x):
            return self.pool(self.pool(x).relu())

    g = graph(qviz.export(Twice(), (torch.randn(1, 1, 8, 8),)))
    markers = [n for n in g.view.nodes if n.kind == "marker"]
    assert [(n.name, n.label) for n in markers] == [
        ("tq/pool._input_quantizer", "int8 dynamic"),
        ("tq/pool._input_quantizer@1", "int8 dynamic"),
    ]
    assert '"tq/pool._input_quantizer@1" -> max_pool2d_1' in g.dot


def test_a_hand_set_amax_shows_no_method():
    layer = quant_nn.QuantLinear(4, 2)
    layer.input_quantizer.amax = 4.52
    g = graph(qviz.export(layer, (torch.randn(1, 4),)))
    marker = next(n for n in g.view.nodes if n.name == "tq/_input_quantizer")
    assert marker.label == "int8 amax=4.52 scale=0.0356"
    assert "amax set by hand or loaded from a state_dict" in marker.tooltip


def test_fb_fake_quant_export_draws_the_same_markers(model, exported):
    with fb_fake_quant(model):
        fb = qviz.export(model, (X,))

    def markers(gm):
        return {n.name: (n.label, n.detail) for n in graph(gm).view.nodes if n.kind == "marker"}

    assert markers(fb) == markers(exported)
    assert not any("fake_quantize" in name for name in _dot_node_names(graph(fb).dot))


def test_collapse_legend_and_determinism(exported):
    g = graph(exported, collapse=1)
    markers = [n for n in g.view.nodes if n.kind == "marker"]
    assert markers and all(n.group == 0 for n in markers)  # weights vanish into their boxes
    assert "quant_nn graph" in g.dot and "input TensorQuantizer" in g.dot
    assert graph(exported).dot == graph(exported).dot


@needs_dot
def test_renders(exported, tmp_path):
    assert graph(exported).save(tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
