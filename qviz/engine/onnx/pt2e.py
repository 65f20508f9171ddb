"""A converted PT2E graph made ready for ``torch.onnx.export``: checked, and narrow ranges
clamped, on a copy.

``torch.onnx`` translates ``quantized_decomposed`` quantize / dequantize ops to
QuantizeLinear / DequantizeLinear (onnxscript's torchlib), but its per-tensor quantize drops
``quant_min`` / ``quant_max``: QuantizeLinear saturates to the whole int8 / uint8 range, so a
narrow range (``-127..127``) or a 4-bit range held in int8 (``-8..7``) would be written wrong
without a word. :func:`onnx_ready_copy` therefore rewrites, on a copy of the graph,

    ``quantize(x, s, zp, qmin, qmax, int8)`` into
    ``quantize(clamp(x, (qmin - zp) * s, (qmax - zp) * s), s, zp, -128, 127, int8)``,

which gives the same integers (see :mod:`qviz.engine.onnx.ranges`), and refuses what ONNX
cannot express with the node's name and the fix. Per-channel quantize keeps its range: torchlib
clips its integers to ``[quant_min, quant_max]`` itself. Stored weights (int8 constants in
``-127..127`` followed by a dequantize) need nothing: DequantizeLinear reads any value of its
type.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
    >>> config = get_symmetric_quantization_config(act_qmin=-127)   # narrow activations
    >>> prepared = qviz.prepare_pt2e(qviz.export(model, (torch.randn(2, 4),)),
    ...                              XNNPACKQuantizer().set_global(config))
    >>> _ = qviz.calibrate(prepared, torch.randn(2, 4), progress=False)
    >>> converted = qviz.convert_pt2e(prepared)
    >>> copy, ranges = onnx_ready_copy(converted, opset=20)
    >>> [(r.quant_min, r.quant_max, r.onnx_type, r.clamped) for r in ranges]  # input, output
    [(-127, 127, 'int8', True), (-127, 127, 'int8', True)]
    >>> x = torch.randn(2, 4) * 9
    >>> torch.equal(copy(x), converted(x))
    True
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch.fx import GraphModule, Node

from qviz.engine.compat import quantized_decomposed
from qviz.engine.graph.qdq_ops import choose_qparams_ops, dequantize_ops, quantize_ops
from qviz.engine.onnx.ranges import OnnxRange, OnnxType, onnx_type_of_dtype
from qviz.errors import OnnxExportError


def has_qdq(gm: GraphModule) -> bool:
    """``gm`` holds quantize or dequantize operators (a converted model).

    Example:
        >>> has_qdq(torch.fx.symbolic_trace(torch.nn.ReLU()))
        False
    """
    ops = quantize_ops() | dequantize_ops() | choose_qparams_ops()
    return any(n.op == "call_function" and n.target in ops for n in gm.graph.nodes)


def _arguments(gm: GraphModule, node: Node) -> dict:
    pair = node.normalized_arguments(gm, normalize_to_only_use_kwargs=True)
    if pair is None:  # the ops have one schema each: only a malformed call gets here
        raise OnnxExportError(f"{node.format_node()}: arguments do not match {node.target}")
    return dict(pair.kwargs)


def _refuse_dynamic_and_affine(node: Node) -> None:
    if node.target in choose_qparams_ops():
        raise OnnxExportError(
            f"{node.format_node()}: dynamic quantization (qparams chosen at run time) has no "
            f"QuantizeLinear / DequantizeLinear form; quantize statically (is_dynamic=False), or "
            f"export the float model and quantize it with onnxruntime's dynamic quantization"
        )
    qd = quantized_decomposed()
    known = {
        qd.quantize_per_tensor.default,
        qd.quantize_per_tensor.tensor,
        qd.quantize_per_tensor.tensor2,
        qd.quantize_per_channel.default,
        qd.dequantize_per_tensor.default,
        qd.dequantize_per_tensor.tensor,
        qd.dequantize_per_tensor.tensor2,
        qd.dequantize_per_channel.default,
    }
    if node.target not in known:
        raise OnnxExportError(
            f"{node.format_node()}: {node.target} (affine / per-group quantization) has no "
            f"QuantizeLinear / DequantizeLinear translation; quantize per tensor or per channel"
        )


def _check_quantize(gm: GraphModule, node: Node, opset: int) -> tuple[OnnxRange, OnnxType]:
    args = _arguments(gm, node)
    where = node.format_node()
    kind = onnx_type_of_dtype(args["dtype"], opset=opset, where=where)
    qmin, qmax = int(args["quant_min"]), int(args["quant_max"])
    narrow = kind.clamps(qmin, qmax)
    qd = quantized_decomposed()
    constant = (qd.quantize_per_tensor.default, qd.quantize_per_channel.default)
    if narrow and node.target not in constant:
        raise OnnxExportError(
            f"{where}: the range {qmin}..{qmax} is narrower than {kind.name} and the qparams are "
            f"tensors, so export_onnx cannot clamp it to the range's end levels; convert with "
            f"constant qparams (static quantization), or quantize to the full {kind.name} range"
        )
    return OnnxRange(node.name, qmin, qmax, kind.name, narrow), kind


def check_graph(gm: GraphModule, opset: int) -> list[tuple[Node, OnnxRange, OnnxType]]:
    """Every quantize node of ``gm`` with how it is written at ``opset``; dequantize nodes are
    checked too. Raises OnnxExportError for what ONNX cannot express."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        ops = quantize_ops() | dequantize_ops() | choose_qparams_ops()
        if node.target not in ops:
            continue
        _refuse_dynamic_and_affine(node)
        if node.target in quantize_ops():
            found.append((node, *_check_quantize(gm, node, opset)))
        else:
            dtype = _arguments(gm, node)["dtype"]
            onnx_type_of_dtype(dtype, opset=opset, where=node.format_node(), dequantize_only=True)
    return found


def _end_levels(args: dict) -> tuple[float, float]:
    """``(quant_min - zp) * scale`` and ``(quant_max - zp) * scale`` in float32, as the clamp
    applies them to a float32 tensor."""
    scale, zero_point = float(args["scale"]), int(args["zero_point"])
    low = np.float32((int(args["quant_min"]) - zero_point) * scale)
    high = np.float32((int(args["quant_max"]) - zero_point) * scale)
    return float(low), float(high)


def _clamp_into(gm: GraphModule, node: Node, kind: OnnxType) -> None:
    args = _arguments(gm, node)
    low, high = _end_levels(args)
    with gm.graph.inserting_before(node):
        clamped = gm.graph.call_function(torch.ops.aten.clamp.default, (args["input"], low, high))
    node.args = (clamped, args["scale"], args["zero_point"], kind.quant_min, kind.quant_max)
    node.args += (args["dtype"],)
    node.kwargs = {}


def onnx_ready_copy(gm: GraphModule, opset: int) -> tuple[GraphModule, tuple[OnnxRange, ...]]:
    """A copy of the converted ``gm`` that ``torch.onnx.export`` translates exactly, and how
    each quantize node is written. ``gm`` itself is not changed.

    Args:
        gm: a model converted by ``qviz.convert_pt2e`` (or torchao's ``convert_pt2e``).
        opset: the ONNX opset to write.

    Returns:
        ``(copy, ranges)``: the copy, whose narrow-range per-tensor quantize nodes read a
        clamped input and quantize to their type's full range, and one :class:`OnnxRange` per
        quantize node, in graph order.

    Raises:
        OnnxExportError: a node ONNX cannot express (int16 before opset 21, int32 or float8
            quantize, dynamic or affine quantization), named with the fix.
    """
    found = check_graph(gm, opset)
    ranges = tuple(r for _, r, _ in found)
    result = copy.deepcopy(gm)
    nodes = {n.name: n for n in result.graph.nodes}
    per_tensor = quantized_decomposed().quantize_per_tensor.default
    for node, record, kind in found:
        if record.clamped and node.target == per_tensor:
            _clamp_into(result, nodes[node.name], kind)
    result.graph.lint()
    result.recompile()
    return result, ranges
