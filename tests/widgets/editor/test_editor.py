"""AnnotationEditor without a kernel: the Python equivalents, the controls, the graph clicks."""

import json

import pytest
import torch

import qviz
from qviz.data import digits_model
from qviz.widgets import AnnotationEditor


@pytest.fixture(scope="module")
def gm():
    return qviz.export(digits_model(), (torch.randn(4, 1, 8, 8),), dynamic_batch=True)


@pytest.fixture
def editor(gm):
    return AnnotationEditor(gm)


def test_select_shows_the_annotation_from_the_plan(editor):
    info = editor.select("add").describe()
    assert info["kind"] == "node" and info["module"] == "block"
    assert [r["tensor"] for r in info["rows"]] == ["relu -> add", "conv2d_2 -> add"]
    assert all(r["dtype"] == "int8" and r["range"] == "[-128, 127]" for r in info["rows"])
    assert "relu -&gt; add" in editor.view.panel.value
    assert editor.view.controls["target"].options[:3] == ("add", "relu -> add", "conv2d_2 -> add")
    assert editor.view.graph.selected == "add"  # the graph outlines what the panel shows


def test_sharing_edit_changes_the_groups_and_the_drawing(editor):
    svg_before, groups_before = editor.view.graph.svg, len(editor.plan.groups)
    editor.edit("conv2d_2 -> add", share_with="relu -> add")
    plan = editor.plan
    assert plan.group_of("conv2d_2", "add").group == plan.group_of("relu", "add").group
    assert len(plan.groups) == groups_before - 1
    assert editor.view.graph.svg != svg_before and editor.error is None
    assert editor.overrides == {"conv2d_2 -> add": {"share_with": "relu -> add"}}


def test_refused_edits_keep_everything_and_say_why(editor):
    editor.edit("relu", dtype="uint8")
    plan, svg = str(editor.plan), editor.view.graph.svg
    editor.edit("relu", quant_min=-5)
    assert "does not fit torch.uint8" in editor.error and "⚠" in editor.view.panel.value
    assert editor.overrides == {"relu": {"dtype": "uint8"}}
    assert str(editor.plan) == plan and editor.view.graph.svg == svg
    editor.edit("conv2d_9", dtype="uint8")
    assert "names no node" in editor.error and "closest" in editor.error
    editor.edit("relu -> add", share_with="relu -> add")  # a sharing cycle
    assert "relu -> add" in editor.error and editor.overrides == {"relu": {"dtype": "uint8"}}
    editor.select("no_such_node")
    assert "is not a node, edge" in editor.error


def test_undo_redo(editor):
    editor.edit("relu", dtype="uint8").edit("linear", quantize=False)
    assert editor.undo().overrides == {"relu": {"dtype": "uint8"}}
    assert "linear" not in [f.node for f in editor.plan.float_nodes]
    assert editor.redo().overrides["linear"] == {"quantize": False}
    assert [(f.node, f.reason.value) for f in editor.plan.float_nodes] == [
        ("linear", "user fallback")
    ]
    editor.undo().undo()
    assert editor.overrides == {} and editor.view.buttons["Undo"].disabled
    assert editor.undo().overrides == {}  # nothing more to undo


def test_the_quantizer_and_the_code_reproduce_the_edits(editor, gm):
    editor.edit("block", dtype="uint8").edit(
        "conv1_0_weight -> conv2d_3", qscheme="per_tensor_symmetric"
    )
    assert json.loads(json.dumps(editor.overrides)) == editor.overrides
    again = qviz.prepare_pt2e(gm, editor.quantizer)
    assert str(again.plan) == str(editor.plan) == str(editor.prepare().plan)
    namespace = {"exported": gm}
    exec(editor.to_code(), namespace)  # the code the user copies into a notebook
    assert str(namespace["prepared"].plan) == str(editor.plan)
    assert "get_symmetric_quantization_config(is_per_channel=True)" in editor.to_code()


def test_controls_and_graph_clicks_drive_the_editor(editor):
    editor.view.graph.selected = "relu_3"  # a click in the graph
    assert editor.selection == "relu_3"
    c = editor.view.controls
    c["dtype"].value = "int4 (int8 storage, -8..7)"
    c["method"].value = "entropy"
    editor.view.buttons["Apply"].click()
    assert editor.overrides == {
        "relu_3": {"dtype": "int8", "quant_min": -8, "quant_max": 7, "method": "entropy"}
    }
    spec = editor.plan.group_of("relu_3").spec
    assert (spec.quant_min, spec.quant_max) == (-8, 7)
    assert c["dtype"].value == "(keep)"  # the controls reset after a successful apply
    editor.view.graph.module_click = {"path": "block", "n": 1}  # a click on a module cluster
    assert editor.collapsed == ["block"] and "module/block" in editor.view.graph.svg
    editor.view.graph.module_click = {"path": "block", "n": 2}
    assert editor.collapsed == [] and "module/block" not in editor.view.graph.svg


def test_the_float_model_is_never_changed(editor, gm):
    before = str(gm.graph)
    editor.edit("relu", dtype="uint8").edit("relu_1", quantize=False)
    assert str(gm.graph) == before
    assert not any("quantization_annotation" in n.meta for n in gm.graph.nodes)


def test_big_models_open_collapsed():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    big = qviz.export(model, (torch.randn(1, 3, 32, 32),))
    editor = AnnotationEditor(big)
    assert {"layer1", "layer2", "layer3", "layer4"} <= set(editor.collapsed)
    assert "module/layer1" in editor.view.graph.svg
    editor.toggle_module("layer1")
    assert "layer1" not in editor.collapsed and "layer1.0" in editor.collapsed


def test_to_code_keeps_the_dynamic_batch(gm):
    editor = AnnotationEditor(gm, example_inputs=(torch.randn(4, 1, 8, 8),), graph=False)
    assert "qviz.export(model.eval(), example_inputs, dynamic_batch=True)" in editor.to_code()


def test_a_backend_config_quantizer_as_base_refuses_what_the_backend_cannot_run():
    from qviz.engine import backend_config as api
    from tests.helpers.backend_config import MyModel, constrained_qconfig, tutorial_backend

    torch.manual_seed(0)
    model = qviz.export(MyModel(False).eval(), (torch.rand(1, 3, 10, 10),))
    mapping = api.QConfigMapping().set_global(constrained_qconfig(api.QConfig))
    editor = AnnotationEditor(
        model, quantizer=api.BackendConfigQuantizer(tutorial_backend(api), mapping)
    )
    plan, svg = str(editor.plan), editor.view.graph.svg
    editor.edit("linear", dtype="int16")  # the backend runs Linear with quint8 only
    assert "backend 'my_backend' cannot run Linear as annotated" in editor.error
    assert "the output's activation dtype is int16, the backend's is quint8" in editor.error
    assert "⚠" in editor.view.panel.value
    assert editor.overrides == {} and str(editor.plan) == plan and editor.view.graph.svg == svg
    editor.edit("linear", quantize=False)  # leaving it float is always possible
    assert editor.error is None and "linear" in {f.node for f in editor.plan.float_nodes}


def test_a_click_on_a_drawn_edge_selects_the_plan_edge(editor):
    """Issue 25: the browser sends the drawn edge's plan tensor (``_edge_refs``), never a
    marker's name; the editor selects it without an error."""
    refs = editor.view.graph._edge_refs
    editor.view.graph.selected = refs["conv2d_2->obs/conv2d_2"]  # what the click sends
    assert (editor.selection, editor.error) == ("conv2d_2 -> add", None)
    editor.view.graph.selected = refs["obs/relu->add"]
    assert (editor.selection, editor.error) == ("relu -> add", None)
    assert editor.describe()["name"] == "relu -> add"


def test_a_prepared_or_converted_model_is_refused_naming_the_float_one(editor, gm):
    """Issue 25: a converted model blamed the quantizer's input_qspec_map keys."""
    from qviz.errors import ConfigError

    converted = qviz.convert_pt2e(qviz.calibrate(editor.prepare(), [torch.randn(4, 1, 8, 8)]))
    for model, stage in ((converted, "converted"), (editor.prepare(), "prepared")):
        with pytest.raises(ConfigError, match=rf"exported_model.*{stage}.*qviz.export returned"):
            AnnotationEditor(model, graph=False)


@pytest.mark.parametrize("quantizer", ["xnnpack", 8])
def test_a_quantizer_that_is_no_quantizer_is_refused_showing_how_to_build_one(quantizer):
    """AnnotationEditor(gm, quantizer='xnnpack') said "base must be a quantizer": the message
    names the argument and shows the call that builds one; a class is refused as a class."""
    from qviz.engine.quantizers import XNNPACKQuantizer
    from qviz.errors import ConfigError

    small = qviz.export(torch.nn.Sequential(torch.nn.Linear(2, 2)).eval(), (torch.ones(1, 2),))
    build = r"XNNPACKQuantizer\(\)\.set_global\(get_symmetric_quantization_config\(\)\)"
    with pytest.raises(ConfigError, match=rf"AnnotationEditor\(quantizer={quantizer!r}\).*{build}"):
        AnnotationEditor(small, quantizer, graph=False)
    with pytest.raises(ConfigError, match=r"a class: build an instance"):
        AnnotationEditor(small, XNNPACKQuantizer, graph=False)
