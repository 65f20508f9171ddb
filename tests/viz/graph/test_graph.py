"""qviz.viz.graph: structure of the drawn records and DOT text, not pixels."""

import re
import shutil
import warnings

import pytest
import torch
from torch import nn

import qviz
from qviz.data import digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.specs import QuantizationAnnotation, SharedQuantizationSpec
from qviz.errors import ConfigError
from qviz.viz import QGraph, graph
from tests.helpers.tutorial_quantizers import ACT, WEIGHT, Annotate, TwoConvCat

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
    assert not any(n.name.startswith("activation_post_process_") for n in g.view.nodes)


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
    # a module path that names nothing used to draw the graph uncollapsed without a word
    with pytest.raises(ConfigError, match=r"no module 'blok'.*closest: \['block'"):
        graph(gm, collapse=["blok"])
    assert graph(gm, collapse=["block.conv1"]).view.nodes  # inner paths are modules too


def test_params_hidden_unless_asked(digits):
    gm, _, _ = digits
    assert not any(n.kind == "param" for n in graph(gm).view.nodes)
    assert any(n.kind == "param" for n in graph(gm, show_params=True).view.nodes)


def test_highlight_thickens_the_outline(digits):
    _, prepared, _ = digits
    g = graph(prepared, highlight="block")
    assert g.dot.count('border="3"') == 5  # conv, relu, conv, add, relu
    assert graph(prepared, highlight=["linear"]).dot.count('border="3"') == 1


def test_a_highlight_that_names_nothing_is_refused_with_the_closest_names():
    """highlight='nonexistent' was silently ignored: each unknown name is named, with the
    closest node names or module paths; a known node name or module path still draws."""
    gm = qviz.export(nn.Sequential(nn.Linear(2, 2), nn.ReLU()).eval(), (torch.ones(1, 2),))
    with pytest.raises(ConfigError, match=r"'nonexistent' \(no close match\)"):
        graph(gm, highlight="nonexistent")
    with pytest.raises(ConfigError, match=r"2 name\(s\).*'linaer' \(closest: \['linear'\]\)"):
        graph(gm, highlight=["linaer", "relu", "relux"])
    with pytest.raises(ConfigError, match=r"highlight=3\): give a node name or module path"):
        graph(gm, highlight=3)
    assert graph(gm, highlight=["linear", "1"]).dot.count('border="3"') == 2  # node, module


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


# --- the annotated stage -------------------------------------------------------------------


@pytest.fixture(scope="module")
def annotated():
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    gm = qviz.export(digits_model().eval(), (x,))
    config = get_symmetric_quantization_config(is_per_channel=True)
    XNNPACKQuantizer().set_global(config).annotate(gm)
    return gm


def _edge(g, src, dst):
    return next(e for e in g.view.edges if (e.src, e.dst) == (src, dst))


def test_annotated_stage_is_detected(annotated, digits):
    assert graph(annotated).stage == "annotated"
    gm, prepared, converted = digits
    assert [graph(m).stage for m in (gm, prepared, converted)] == [
        "float",
        "observed",
        "converted",
    ]


def test_annotated_conv_weight_edge_carries_the_per_channel_spec(annotated):
    g = graph(annotated)
    conv = next(n for n in annotated.graph.nodes if n.name == "conv2d")
    weight = conv.args[1].name
    edge = _edge(g, weight, "conv2d")
    assert edge.label == "int8 [-127,127] sym/ch0"
    assert "ch_axis=0" in edge.tooltip and "PerChannelMinMaxObserver" in edge.tooltip
    assert _edge(g, "x", "conv2d").label == "int8 [-128,127] aff"
    assert 'label="int8 [-127,127] sym/ch0"' in g.dot
    # the weight is drawn although show_params is off: its edge carries a spec
    assert next(n for n in g.view.nodes if n.name == weight).kind == "param"


def test_annotated_outputs_shared_specs_and_float_inputs(annotated):
    g = graph(annotated)
    nodes = {n.name: n for n in g.view.nodes}
    assert "out int8 [-128,127] aff" in nodes["relu"].detail
    assert _edge(g, "relu_2", "max_pool2d").label == "shares (relu_2)"
    assert "out shares (relu_4 -&gt; adaptive_avg_pool2d)" in g.dot
    bias = _edge(g, "fc_bias", "linear")  # annotated None: grey, dashed, "float"
    assert (bias.label, bias.style) == ("float", "float")
    assert re.search(r"fc_bias -> linear \[.*style=dashed", g.dot)
    # BatchNorm is quantizable but not annotated (prepare_pt2e folds it first): grey
    assert nodes["batch_norm"].kind == "float"
    assert "not annotated" in nodes["batch_norm"].tooltip


def test_annotated_sigmoid_shows_its_fixed_qparams():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return torch.sigmoid(self.fc(x))

    gm = qviz.export(Net().eval(), (torch.randn(2, 4),))
    XNNPACKQuantizer().set_global(get_symmetric_quantization_config()).annotate(gm)
    g = graph(gm)
    sigmoid = next(n for n in g.view.nodes if n.name == "sigmoid")
    assert sigmoid.detail == "out fixed s=0.0039 zp=-128"
    assert "scale=0.00390625 zero_point=-128" in sigmoid.tooltip
    assert "fixed s=0.0039 zp=-128" in g.dot


def test_annotated_shared_input_edge():
    gm = qviz.export(TwoConvCat().eval(), (torch.randn(1, 3, 4, 4),))
    Annotate(_cat_annotation).annotate(gm)
    g = graph(gm)
    assert g.stage == "annotated"
    assert _edge(g, "conv2d_1", "cat").label == "shares (conv2d -> cat)"
    assert 'label="shares (conv2d -> cat)"' in g.dot


def test_annotated_dot_is_deterministic(annotated):
    assert graph(annotated).dot == graph(annotated).dot
    assert graph(annotated, collapse=1).dot == graph(annotated, collapse=1).dot
    assert "0x" not in graph(annotated).dot


# --- metrics heatmap -----------------------------------------------------------------------

SQNR = {"conv2d": 38.2, "conv2d_1": 31.0, "conv2d_2": 12.5, "conv2d_3": 31.0, "linear": 20.0}


def _fill(dot, name):
    return re.search(rf'^\s*{name} \[label=<<table [^>]*bgcolor="(#\w+)"', dot, re.M).group(1)


def test_metrics_colour_the_nodes_and_print_the_value(digits):
    _, prepared, _ = digits
    g = graph(prepared, metrics=SQNR, metric_column="SQNR dB")
    low, high = _fill(g.dot, "conv2d_2"), _fill(g.dot, "conv2d")
    assert low != high and low != "#ffffff"
    assert _fill(g.dot, "conv2d_1") == _fill(g.dot, "conv2d_3")  # equal values, equal colours
    assert _fill(g.dot, "relu") == "#ffffff"  # not in the metrics: normal style
    assert "SQNR dB 12.5" in g.dot and "SQNR dB 38.2" in g.dot
    # the legend's colour bar names the metric and shows min / max
    legend = re.search(r"^\s*legend \[label=(.*)$", g.dot, re.M).group(1)
    assert "SQNR dB: low (red) to high (green)" in legend
    assert ">12.5</td>" in legend and ">38.2</td>" in legend
    assert legend.count('width="12"') == 9
    assert 'width="12"' not in graph(prepared).dot  # no colour bar without metrics
    # under a heatmap the observers' group colours are muted: only the metric stands out
    markers = re.findall(r'fillcolor="(#\w+)"', g.dot)
    assert markers and set(markers) == {"#f4f4f4"}
    assert len(set(re.findall(r'fillcolor="(#\w+)"', graph(prepared).dot))) > 1


def test_metrics_from_a_dataframe_or_a_report(digits):
    pd = pytest.importorskip("pandas")
    _, prepared, converted = digits
    df = pd.DataFrame(
        {"node": list(SQNR), "layer": ["x"] * 5, "sqnr": list(SQNR.values()), "mse": [0.1] * 5}
    )
    by_first = graph(prepared, metrics=df)
    assert "sqnr 12.5" in by_first.dot
    by_name = graph(prepared, metrics=df, metric_column="mse")
    assert "mse 0.1" in by_name.dot
    report = type("Report", (), {"df": df.set_index("node")[["sqnr"]]})()
    indexed = graph(converted, metrics=report)
    assert "sqnr 12.5" in indexed.dot
    with pytest.raises(ConfigError, match="numeric columns"):
        graph(prepared, metrics=df, metric_column="nope")


def test_metrics_unknown_names_warn(digits):
    _, prepared, _ = digits
    with pytest.warns(UserWarning, match=r"not in the graph.*'ghost'"):
        g = graph(prepared, metrics={**SQNR, "ghost": 1.0})
    assert "ghost" not in g.dot
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        graph(prepared, metrics=SQNR)
    with pytest.raises(ConfigError, match="not a number"):
        graph(prepared, metrics={"conv2d": "high"})
    with pytest.raises(ConfigError, match="mapping"):
        graph(prepared, metrics=[1.0, 2.0])


def test_metrics_on_collapsed_modules_show_the_worst_member(digits):
    _, prepared, _ = digits
    g = graph(prepared, metrics=SQNR, collapse=1)
    block = next(n for n in g.view.nodes if n.label == "block")
    assert block.value == 12.5  # min of conv2d_1 (31.0) and conv2d_2 (12.5)
    assert graph(prepared, metrics=SQNR, collapse=1).dot == g.dot


def test_metrics_work_on_every_stage(annotated, digits):
    gm, _, converted = digits
    for model in (gm, annotated, converted):
        g = graph(model, metrics={"linear": 20.0, "conv2d": 30.0})
        assert {n.name: n.value for n in g.view.nodes if n.value is not None} == {
            "linear": 20.0,
            "conv2d": 30.0,
        }


def test_a_collapsed_box_says_how_many_of_its_ops_stay_in_float():
    from qviz.numeric import fallback

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    gm = qviz.export(model.eval(), (torch.randn(2, 4),))
    base = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = qviz.prepare_pt2e(gm, fallback(base, ["2"]))
    dot = graph(prepared, collapse=1).dot
    assert "1 left in float" in dot and 'tooltip="left in float: linear_1"' in dot
    assert dot.count("left in float</font>") == 1  # only the box holding linear_1


def test_metric_range_fixes_the_scale_and_errors_can_be_green_when_low(digits):
    _, prepared, _ = digits
    values = {"conv2d": 30.0, "conv2d_2": 35.0}
    assert _fill(graph(prepared, metrics=values).dot, "conv2d") == "#f46d43"  # the min: red
    fixed = graph(prepared, metrics=values, metric_range=(0, 60))
    assert _fill(fixed.dot, "conv2d") == "#fee08b"  # mid-scale on a fixed scale: yellow
    legend = re.search(r"^\s*legend \[label=(.*)$", fixed.dot, re.M).group(1)
    assert ">0</td>" in legend and ">60</td>" in legend
    errors = graph(prepared, metrics={"conv2d": 0.1, "conv2d_2": 0.9}, higher_is_better=False)
    assert _fill(errors.dot, "conv2d") == "#66bd63" and _fill(errors.dot, "conv2d_2") == "#f46d43"
    assert "low (green) to high (red)" in errors.dot
    with pytest.raises(qviz.ConfigError, match="metric_range"):
        graph(prepared, metrics={"conv2d": 1.0}, metric_range=(5, 1))


def test_each_consumers_dequantize_is_drawn_with_the_group_it_executes():
    """One quantize, a dequantize per quantized consumer: every box names the same group,
    found through the plan's record of the converted nodes."""

    class FanOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 3, 3), nn.Conv2d(3, 3, 1)

        def forward(self, x):
            x = self.conv1(x)
            return self.conv2(x) + x

    x = torch.randn(1, 3, 5, 5)
    gm = qviz.export(FanOut().eval(), (x,))
    prepared = qviz.prepare_pt2e(
        gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    )
    qviz.calibrate(prepared, [x], progress=False)
    converted = qviz.convert_pt2e(prepared)
    conv1_out = converted.plan.group_of("conv2d")
    drawn = [n for n in graph(converted).view.nodes if n.group == conv1_out.group]
    assert sorted(n.kind for n in drawn) == ["dequantize", "dequantize", "quantize"]
    assert {n.name for n in drawn} == set(conv1_out.nodes)
    scale = f"scale={conv1_out.qparams.scale:.4g}"
    assert all(scale in n.detail for n in drawn)


def test_int16_activations_of_a_bfloat16_model_are_labelled_with_both_dtypes():
    from torch.ao.quantization.observer import MinMaxObserver

    from qviz.engine.specs import QuantizationSpec

    act = QuantizationSpec(
        dtype=torch.int16,
        observer_or_fake_quant_ctr=MinMaxObserver.with_args(dtype=torch.int16),
        quant_min=-32768,
        quant_max=32767,
        qscheme=torch.per_tensor_affine,
    )

    def annotate(node):
        if node.target == aten.conv2d.default:
            node.meta["quantization_annotation"] = QuantizationAnnotation(
                {node.args[0]: act, node.args[1]: WEIGHT}, act, _annotated=True
            )

    x = torch.randn(1, 3, 5, 5, dtype=torch.bfloat16)
    gm = qviz.export(nn.Conv2d(3, 3, 3, dtype=torch.bfloat16).eval(), (x,))
    prepared = qviz.prepare_pt2e(gm, Annotate(annotate))
    qviz.calibrate(prepared, [x], progress=False)
    g = graph(qviz.convert_pt2e(prepared))
    acts = [
        n for n in g.view.nodes if n.kind in ("quantize", "dequantize") and "weight" not in n.detail
    ]
    assert len(acts) == 4
    assert all(n.detail.startswith("int16 scale=") for n in acts)
    assert sum("→ bfloat16" in n.detail for n in acts) == 2  # the dequantizes give bf16 back
    assert "int16 scale=" in g.dot


def test_metrics_from_the_report_of_another_model_are_refused():
    """A report knows its model (rule 14): not drawn on another model, even where every row's
    name is a node of this graph; its own model's stages and copies are accepted."""
    import copy

    from tests.helpers.two_models import two_models

    models = two_models()
    large = models.large
    for other, model in [(models.small, large.quantized), (large, models.small.quantized)]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # refused, not drawn with a warning
            with pytest.raises(ConfigError, match=r"graph\(metrics=...\).*another model.*"
                               r"qviz.numeric.compare on this model"):  # fmt: skip
                graph(model, metrics=other.report)
    for model in (large.quantized, copy.deepcopy(large.quantized), large.prepared, large.float):
        g = graph(model, metrics=copy.deepcopy(large.report), metric_column="local_sqnr")
        assert {n.name for n in g.view.nodes if n.value is not None} == {"linear", "relu"}
