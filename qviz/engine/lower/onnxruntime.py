"""Lower a converted model to onnxruntime: its QDQ export, run by an optimised CPU session.

onnxruntime's graph optimiser fuses each dequantize -> op -> quantize group it has an integer
kernel for into one operator (``QLinearConv``, ``QLinearMatMul``, ``QGemm``, ``QLinearAdd``,
``QLinearGlobalAveragePool``, ...). The optimised graph it actually runs is saved and read back,
and each of its nodes is classified: an integer kernel, a float kernel (a compute operator that
stayed between a dequantize and a quantize: onnxruntime has no integer kernel for that pattern,
or the converted model left it in float), a quantize / dequantize boundary, or data movement
(reshape, pooling, padding, in the dtype of what it is given).

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> x = torch.randn(8, 4)
    >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 3)).eval(), (x,))
    >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> _ = qviz.calibrate(p, x, progress=False)
    >>> lowered = qviz.lower(qviz.convert_pt2e(p), (x,), backend="onnxruntime")
    >>> lowered.kernel_counts()["integer"], lowered(x).shape
    (1, torch.Size([8, 3]))
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from qviz.engine.lower.lowered import KernelRecord

_WHERE = "onnxruntime CPU"
_INTEGER_OPS = {
    "QGemm",
    "ConvInteger",
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
    "QAttention",
    "QEmbedLayerNormalization",
}
_BOUNDARY_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
#: Operators that move, reshape or select data (in whatever dtype they are given); any other
#: operator computes, and is a float kernel unless it is one of the integer ones above.
_DATA_OPS = {
    "Reshape",
    "Flatten",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Slice",
    "Gather",
    "MaxPool",
    "Pad",
    "Identity",
    "Shape",
    "Expand",
    "Split",
    "Cast",
    "Constant",
    "ReorderInput",
    "ReorderOutput",
}


def classify(nodes: list[Any], inputs_from: dict[str, str]) -> list[KernelRecord]:
    """A :class:`KernelRecord` per node of onnxruntime's optimised graph.

    ``inputs_from`` maps a value name to the op type that produced it (graph inputs and
    initialisers are absent), so a float compute node is told apart by what feeds it.

    Example:
        >>> class N:
        ...     def __init__(self, name, op, inputs=()):
        ...         self.name, self.op_type, self.input = name, op, list(inputs)
        >>> recs = classify([N("c", "QLinearConv"), N("g", "Gemm", ["dq"])],
        ...                 {"dq": "DequantizeLinear"})
        >>> [(r.node, r.kernel) for r in recs]
        [('c', 'integer'), ('g', 'float')]
    """
    records = []
    for node in nodes:
        op = node.op_type
        if op.startswith("QLinear") or op in _INTEGER_OPS:
            records.append(KernelRecord(node.name, op, "integer", _WHERE))
        elif op in _BOUNDARY_OPS:
            records.append(KernelRecord(node.name, op, "quantize", _WHERE))
        elif op in _DATA_OPS:
            records.append(KernelRecord(node.name, op, "data", _WHERE))
        else:
            fed = {inputs_from.get(i) for i in node.input}
            reason = (
                "between a dequantize and a quantize, but onnxruntime fused no integer kernel "
                "for this pattern"
                if "DequantizeLinear" in fed
                else "its inputs are float: the converted model left it in float"
            )
            records.append(KernelRecord(node.name, op, "float", _WHERE, reason))

    return records


def lower_onnxruntime(
    converted: Any, example_inputs: tuple[Any, ...], dynamic_batch: bool, path: Path | None
) -> tuple[Any, list[KernelRecord], bytes, Path | None]:
    """Export, optimise and load; the run function, the records, the file's bytes and path."""
    from qviz.engine.onnx.export import _import, export_onnx

    ort = _import("onnxruntime")
    onnx = _import("onnx")
    folder = None
    if path is None:
        folder = tempfile.TemporaryDirectory(prefix="qviz-lower-")
        target = Path(folder.name) / "model.onnx"
    else:
        target = Path(path)
    export_onnx(converted, example_inputs, target, dynamic_batch=dynamic_batch)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    optimised = target.with_name(target.stem + ".optimized.onnx")
    options.optimized_model_filepath = str(optimised)
    session = ort.InferenceSession(str(target), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(optimised)).graph
    produced = {out: node.op_type for node in graph.node for out in node.output}
    records = classify(list(graph.node), produced)
    artifact = target.read_bytes()
    names = [i.name for i in session.get_inputs()]
    optimised.unlink(missing_ok=True)
    if folder is not None:  # the session holds the model: the temporary file can go
        folder.cleanup()

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        feed = {n: x.numpy() for n, x in zip(names, inputs, strict=True)}
        return [torch.from_numpy(o) for o in session.run(None, feed)]

    return run, records, artifact, (None if folder is not None else target)
