"""uint8_weights restates a QDQ file's int8 weights as uint8 (the same values) in both forms
qviz writes them: int8 initializers read by a DequantizeLinear (PT2E exports), and float
initializers quantized in the graph with an int8 zero point (the tensor-level toolkit's
exports, which onnxruntime folds into int8 constants). On any CPU the restated file computes
what the original does, with onnxruntime's optimisations off (no fused kernel involved)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from qviz.engine.lower.ort_format import uint8_weights  # noqa: E402


def _run(model, x):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _in_graph_quantized_weight():
    """x (float) @ dequantize(quantize(w, per-column scales, int8 zero points))."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 4)).astype(np.float32)
    scale = (np.abs(w).max(0) / 127).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(scale, "w_scale"),
        numpy_helper.from_array(np.array([0, 3, -5, 0], np.int8), "w_zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["w", "w_scale", "w_zero"], ["w_q"], axis=1),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w_dq"], axis=1),
        helper.make_node("MatMul", ["x", "w_dq"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_a_weight_quantized_in_the_graph_is_restated_with_the_same_values():
    model = _in_graph_quantized_weight()
    x = np.random.default_rng(1).normal(size=(2, 8)).astype(np.float32)
    before = _run(model, x)
    restated = onnx.ModelProto.FromString(model.SerializeToString())
    assert uint8_weights(restated) == 1
    zeros = {i.name: i for i in restated.graph.initializer}
    quantize, dequantize = restated.graph.node[:2]
    assert quantize.input[2] == dequantize.input[2] == "w_zero_u8w"
    assert zeros["w_zero_u8w"].data_type == TensorProto.UINT8
    assert numpy_helper.to_array(zeros["w_zero_u8w"]).tolist() == [128, 131, 123, 128]
    assert "w_zero" not in zeros  # the int8 original is not stored twice
    onnx.checker.check_model(restated, full_check=True)
    assert np.array_equal(_run(restated, x), before)


def test_an_activation_sharing_the_zero_point_keeps_its_int8_grid():
    """Only weights are restated: an activation QuantizeLinear reading the same int8 zero point
    initializer keeps it."""
    model = _in_graph_quantized_weight()
    graph = model.graph
    graph.node.insert(0, helper.make_node("QuantizeLinear", ["x", "x_scale", "w_zero"], ["x_q"],
                                          axis=1))  # fmt: skip
    graph.initializer.append(numpy_helper.from_array(np.full(8, 0.05, np.float32), "x_scale"))
    graph.node.insert(1, helper.make_node("DequantizeLinear", ["x_q", "x_scale", "w_zero"],
                                          ["x_dq"], axis=1))  # fmt: skip
    graph.node[-1].input[0] = "x_dq"
    graph.initializer[2].CopyFrom(numpy_helper.from_array(np.zeros(8, np.int8), "w_zero"))
    graph.initializer[1].CopyFrom(numpy_helper.from_array(np.full(8, 0.01, np.float32), "w_scale"))
    for node in graph.node:
        if node.input[0] in ("w", "w_q"):
            node.attribute[0].i = 0  # per-row, 8 of them, like the activation's
    x = np.random.default_rng(1).normal(size=(2, 8)).astype(np.float32)
    before = _run(model, x)
    restated = onnx.ModelProto.FromString(model.SerializeToString())
    assert uint8_weights(restated) == 1
    act_q, act_dq = restated.graph.node[:2]
    assert act_q.input[2] == act_dq.input[2] == "w_zero"  # the activation's, still int8
    assert np.array_equal(_run(restated, x), before)
