"""Lower a converted model to onnxruntime: its QDQ export, run by an optimised CPU session.

onnxruntime's graph optimiser fuses each dequantize -> op -> quantize group it has an integer
kernel for into one operator (``QLinearConv``, ``QLinearMatMul``, ``QGemm``, ``QLinearAdd``,
``QLinearGlobalAveragePool``, ...). The optimised graph it actually runs is saved and read back,
and each of its nodes is classified: an integer kernel, a float kernel (a compute operator that
stayed between a dequantize and a quantize: onnxruntime has no integer kernel for that pattern,
or the converted model left it in float), a quantize / dequantize boundary, or data movement
(reshape, pooling, padding, in the dtype of what it is given).

onnxruntime's x86 integer kernels take uint8 activations with int8 weights: its optimiser turns an
int8 activation into uint8 only where one quantize feeds one dequantize, so a tensor read by two
operators (a residual connection) would leave its producer and both readers on float kernels. The
lowered program therefore states every int8 activation grid as the uint8 grid with zero point
+128, which holds exactly the same values. Weights stay int8 where onnxruntime's uint8 x int8
kernels sum in 32 bits (VNNI, AMX, ARM); on x86 without VNNI those kernels saturate 16-bit sums,
so weights are stated as uint8 too (U8U8, the format onnxruntime documents as free of that
overflow). Which one this machine needs is measured, not guessed
(:mod:`qviz.engine.lower.ort_format`), and recorded on the lowered model.

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

import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule

from qviz.engine.lower.ort_format import PRECISION_MODE, OrtFormat, choose, uint8_weights
from qviz.engine.lower.records import IntegerFormat, KernelRecord
from qviz.errors import LoweringError

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
    "NhwcMaxPool",
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


_ACTIVATION_SHIFT = 128  # int8 grid -> uint8 grid: the same values, zero point + 128


def uint8_activations(model: Any) -> int:
    """Restate every int8 activation grid of ``model`` (an ``onnx.ModelProto``, edited in
    place) as uint8 with zero point + 128; the number of quantize operators restated.

    An activation is a QuantizeLinear's output and the DequantizeLinear operators that read it;
    a weight's DequantizeLinear (it reads an initializer) keeps int8. A zero point shared with a
    weight gets its own uint8 copy.

    Example:
        >>> import onnx, numpy as np
        >>> from onnx import helper, numpy_helper
        >>> zp = numpy_helper.from_array(np.array(-3, np.int8), "zp")
        >>> s = numpy_helper.from_array(np.array(0.5, np.float32), "s")
        >>> g = helper.make_graph(
        ...     [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
        ...      helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"])], "g",
        ...     [helper.make_tensor_value_info("x", 1, [2])],
        ...     [helper.make_tensor_value_info("y", 1, [2])], [s, zp])
        >>> m = helper.make_model(g)
        >>> uint8_activations(m), numpy_helper.to_array(m.graph.initializer[-1]).tolist()
        (1, 125)
    """
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    quantized = {n.output[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    restated: dict[str, str] = {}
    count = 0
    for node in graph.node:
        activation = node.op_type == "QuantizeLinear" or (
            node.op_type == "DequantizeLinear" and node.input[0] in quantized
        )
        zero = initializers.get(node.input[2]) if activation and len(node.input) > 2 else None
        if zero is None or zero.data_type != TensorProto.INT8:
            continue
        if zero.name not in restated:
            values = numpy_helper.to_array(zero).astype("int16") + _ACTIVATION_SHIFT
            name = f"{zero.name}_uint8"
            graph.initializer.append(numpy_helper.from_array(values.astype("uint8"), name))
            restated[zero.name] = name
        node.input[2] = restated[zero.name]
        count += node.op_type == "QuantizeLinear"
    _retype(graph, quantized)
    return count


def global_pools(model: Any) -> int:
    """Replace each mean over the two spatial axes of a 4-d tensor that keeps its dims
    (``ReduceMean`` over ``[2, 3]``, how a converted ``adaptive_avg_pool2d(x, 1)`` exports)
    with ``GlobalAveragePool``, the same arithmetic, for which onnxruntime has an integer
    kernel; ``model`` is edited in place; how many were replaced.

    Example:
        >>> import onnx, numpy as np
        >>> from onnx import helper, numpy_helper
        >>> axes = numpy_helper.from_array(np.array([-1, -2]), "axes")
        >>> g = helper.make_graph([helper.make_node("ReduceMean", ["x", "axes"], ["y"])], "g",
        ...     [helper.make_tensor_value_info("x", 1, [1, 2, 3, 3])],
        ...     [helper.make_tensor_value_info("y", 1, [1, 2, 1, 1])], [axes])
        >>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
        >>> global_pools(m), m.graph.node[0].op_type
        (1, 'GlobalAveragePool')
    """
    import onnx
    from onnx import numpy_helper

    inferred = onnx.shape_inference.infer_shapes(model).graph
    ranks = {
        v.name: len(v.type.tensor_type.shape.dim)
        for v in [*inferred.value_info, *inferred.input]
        if v.type.tensor_type.HasField("shape")
    }
    initializers = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    count = 0
    for node in model.graph.node:
        keep = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
        if node.op_type != "ReduceMean" or len(node.input) < 2 or not keep:
            continue
        axes = initializers.get(node.input[1])
        rank = ranks.get(node.input[0])
        if axes is None or rank != 4 or {int(a) % 4 for a in axes.ravel()} != {2, 3}:
            continue
        node.op_type = "GlobalAveragePool"
        del node.input[1:]
        del node.attribute[:]
        count += 1
    return count


def _retype(graph: Any, quantized: set[str]) -> None:
    """Drop the stale int8 types recorded for the restated tensors (onnxruntime infers them)."""
    from onnx import TensorProto

    keep = [v for v in graph.value_info if v.name not in quantized]
    del graph.value_info[:]
    graph.value_info.extend(keep)
    for output in graph.output:
        if output.name in quantized:
            output.type.tensor_type.elem_type = TensorProto.UINT8


def fx_names(model: Any, converted: GraphModule | None = None) -> dict[str, str]:
    """``{onnx node name: the torch node it computes}``, from the exporter's metadata.

    The exporter names the node of the program it exported (``pkg.torch.onnx.fx_node``), which
    re-traced and decomposed the converted model: ``add_70`` for the converted ``add``, ``mean``
    for ``adaptive_avg_pool2d``. With ``converted`` given, a name it lacks is resolved to the
    converted model's one compute node in the same module (``pkg.torch.onnx.name_scopes``) with
    the same operator, or else to its only compute node there; otherwise it is left out.

    Example:
        >>> from onnx import helper
        >>> node = helper.make_node("Relu", ["x"], ["y"], name="node_relu")
        >>> helper.set_metadata_props(node, {"pkg.torch.onnx.fx_node": "%relu : [...]"})
        >>> g = helper.make_graph([node], "g", [], [])
        >>> fx_names(helper.make_model(g))
        {'node_relu': 'relu'}
    """
    known = _compute_nodes(converted) if converted is not None else None
    names = {}
    for node in model.graph.node:
        props = {p.key: p.value for p in node.metadata_props}
        fx = props.get("pkg.torch.onnx.fx_node", "")
        if not fx.startswith("%"):
            continue
        name = fx[1:].split(" ", 1)[0]
        if known is not None and name not in {n for n, _, _ in known}:
            scopes = props.get("pkg.torch.onnx.name_scopes", "[]").strip("[]").split(", ")
            scope = scopes[-2].strip("'") if len(scopes) > 1 else ""
            target = re.search(r"target=torch\.ops\.aten\.(\w+)", fx)
            name = _in_scope(known, scope, target.group(1) if target else "")
        if name:
            names[node.name] = name
    return names


def _compute_nodes(converted: GraphModule) -> list[tuple[str, str, str]]:
    """``(name, innermost module path, aten op)`` of each compute node of ``converted``."""
    from qviz.engine.graph.module_stack import module_names

    out = []
    for node in converted.graph.nodes:
        op = getattr(node.target, "__name__", "").split(".")[0]
        if node.op == "call_function" and "quantize" not in op and op != "getitem":
            out.append((node.name, (module_names(node) or [""])[-1], op))
    return out


def _in_scope(known: list[tuple[str, str, str]], scope: str, op: str) -> str:
    here = [(n, o) for n, path, o in known if path == scope]
    same = [n for n, o in here if o == op]
    if len(same) == 1:
        return same[0]
    return here[0][0] if len(here) == 1 else ""


def _source(name: str, sources: dict[str, str]) -> str:
    """The torch node an optimised node computes: onnxruntime names a fused node after the
    node it replaced, with a ``_token_<n>`` suffix."""
    return sources.get(re.sub(r"_token_\d+$", "", name), "")


def classify(
    nodes: list[Any], inputs_from: dict[str, str], sources: dict[str, str] | None = None
) -> list[KernelRecord]:
    """A :class:`KernelRecord` per node of onnxruntime's optimised graph.

    ``inputs_from`` maps a value name to the op type that produced it (graph inputs and
    initialisers are absent), so a float compute node is told apart by what feeds it and
    whether a QuantizeLinear reads it: between a dequantize and a quantize it is a float kernel
    onnxruntime did not fuse; otherwise the converted model left it in float. ``sources``
    maps a node name to the converted model's node (:func:`fx_names`).

    Example:
        >>> class N:
        ...     def __init__(self, name, op, inputs=(), outputs=()):
        ...         self.name, self.op_type = name, op
        ...         self.input, self.output = list(inputs), list(outputs)
        >>> recs = classify([N("c", "QLinearConv"), N("g", "Gemm", ["dq"], ["y"]),
        ...                  N("q", "QuantizeLinear", ["y"])], {"dq": "DequantizeLinear"})
        >>> [(r.node, r.kernel) for r in recs]
        [('c', 'integer'), ('g', 'float'), ('q', 'quantize')]
        >>> "onnxruntime has no integer kernel" in recs[1].reason
        False
    """
    records = []
    sources = sources or {}
    quantized = {n.input[0] for n in nodes if n.op_type == "QuantizeLinear"}
    for node in nodes:
        op = node.op_type
        source = _source(node.name, sources)
        if op.startswith("QLinear") or op in _INTEGER_OPS:
            records.append(
                KernelRecord(
                    node=node.name, op=op, kernel="integer", where=_WHERE, reason="", source=source
                )
            )
        elif op in _BOUNDARY_OPS:
            records.append(
                KernelRecord(
                    node=node.name, op=op, kernel="quantize", where=_WHERE, reason="", source=source
                )
            )
        elif op in _DATA_OPS:
            records.append(
                KernelRecord(
                    node=node.name, op=op, kernel="data", where=_WHERE, reason="", source=source
                )
            )
        else:
            fed = {inputs_from.get(i) for i in node.input}
            inside = "DequantizeLinear" in fed and any(o in quantized for o in node.output)
            reason = (
                _unfused(op)
                if inside
                else "the converted model left it in float (no dequantize -> it -> quantize)"
            )
            records.append(
                KernelRecord(
                    node=node.name,
                    op=op,
                    kernel="float",
                    where=_WHERE,
                    reason=reason,
                    source=source,
                )
            )

    return records


#: Operators onnxruntime's CPU kernels have an integer (QLinear) form of.
_HAS_INTEGER_FORM = {
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Mul", "AveragePool", "GlobalAveragePool",
    "Sigmoid", "LeakyRelu", "Concat", "Softmax", "Where",
}  # fmt: skip


def _unfused(op: str) -> str:
    if op in _HAS_INTEGER_FORM:
        return (
            "between a dequantize and a quantize, but onnxruntime's optimiser fused no integer "
            f"kernel for this {op} (its quantize/dequantize pattern did not match)"
        )
    return (
        f"between a dequantize and a quantize: onnxruntime has no integer kernel for {op}, so it "
        f"runs in float on the dequantized values"
    )


def lower_onnxruntime(
    converted: Any,
    example_inputs: tuple[Any, ...],
    dynamic_batch: bool,
    path: Path | None,
    given: bytes | None = None,
) -> tuple[Any, list[KernelRecord], bytes, Path | None]:
    """Export (or take ``given``, an .onnx's bytes, as it is) in the integer format this
    machine computes exactly (:func:`~qviz.engine.lower.ort_format.choose`), optimise and load;
    the run function (carrying ``int_format``), the records, the file's bytes and path.

    Raises:
        LoweringError: no format onnxruntime computes exactly here, or onnxruntime refused it.
    """
    from qviz.engine.lower.machine import machine
    from qviz.engine.onnx.export import _import

    ort = _import("onnxruntime")
    onnx = _import("onnx")
    folder = None
    if path is None:
        folder = tempfile.TemporaryDirectory(prefix="qviz-lower-")
        target = Path(folder.name) / "model.onnx"
    else:
        target = Path(path)
    if given is None:
        fmt = choose(machine().isa)
        _export(converted, example_inputs, target, dynamic_batch, fmt.name == "U8U8")
    else:
        target.write_bytes(given)
        fmt = choose(machine().isa, given_int8=True)
    if not fmt.exact:
        raise LoweringError(
            f"qviz.lower(backend='onnxruntime'): onnxruntime computes no integer format exactly "
            f"on this machine ({machine()}): {fmt.why}; lower with backend='xnnpack'"
        )
    model = onnx.load(str(target))
    session, graph, fmt = _loaded(ort, onnx, target, fmt)
    produced = {out: node.op_type for node in graph.node for out in node.output}
    records = classify(list(graph.node), produced, fx_names(model, converted))
    artifact = target.read_bytes()
    names = [i.name for i in session.get_inputs()]
    if folder is not None:  # the session holds the model: the temporary file can go
        folder.cleanup()

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        feed = {n: x.numpy() for n, x in zip(names, inputs, strict=True)}
        return [torch.from_numpy(o) for o in session.run(None, feed)]

    mode = " (onnxruntime's precision mode)" if fmt.precision_mode else ""
    run.int_format = IntegerFormat(f"{fmt.name}{mode}", fmt.why)  # type: ignore[attr-defined]
    return run, records, artifact, (None if folder is not None else target)


def _loaded(ort: Any, onnx: Any, target: Path, fmt: OrtFormat) -> tuple[Any, Any, OrtFormat]:
    """The session, its optimised graph and the format it runs: a given file in onnxruntime's
    precision mode or, where that mode cannot load it (onnxruntime 1.32 fails on weights
    sharing a zero point, as qviz's own exports do: measured on an emulated AVX2 CPU), the same
    file with its weights restated as uint8 in a copy, run as U8U8; the file is left as it was.
    """
    if not fmt.precision_mode:
        return (*_session(ort, onnx, target, False), fmt)
    try:
        return (*_session(ort, onnx, target, True), fmt)
    except LoweringError:
        restated = onnx.load(str(target))
        uint8_weights(restated)
        copy = target.with_name(target.stem + ".u8u8.onnx")
        onnx.save(restated, str(copy))
        try:
            session, graph = _session(ort, onnx, copy, False)
        finally:
            copy.unlink(missing_ok=True)
        why = f"{fmt.why.split(': the given file')[0]}: the given file's weights restated as uint8"
        return session, graph, OrtFormat("U8U8", False, True, why)


def _session(ort: Any, onnx: Any, target: Path, precision_mode: bool) -> tuple[Any, Any]:
    """An optimised CPU session of ``target`` and the graph it runs (saved and read back)."""
    options = ort.SessionOptions()
    # errors only, not the optimiser's notes; in the precision mode not even those: its failure
    # to load a file (onnxruntime 1.32, weights sharing a zero point) is handled by the caller
    options.log_severity_level = 4 if precision_mode else 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if precision_mode:
        options.add_session_config_entry(PRECISION_MODE, "1")
    optimised = target.with_name(target.stem + ".optimized.onnx")
    options.optimized_model_filepath = str(optimised)
    try:
        session = ort.InferenceSession(str(target), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own error types: name them as a lowering failure
        mode = f" in its precision mode ({PRECISION_MODE})" if precision_mode else ""
        raise LoweringError(
            f"qviz.lower(backend='onnxruntime'): onnxruntime could not load the program{mode}: "
            f"{str(exc).strip()[:400]}"
        ) from exc
    graph = onnx.load(str(optimised)).graph
    optimised.unlink(missing_ok=True)
    return session, graph


def _export(
    converted: Any, example_inputs: tuple, target: Path, dynamic_batch: bool, u8u8: bool
) -> None:
    """The QDQ export, stated for onnxruntime's x86 integer kernels (uint8 activations, global
    average pools; uint8 weights too where its uint8 x int8 kernels are not exact)."""
    import onnx

    from qviz.engine.onnx.export import export_onnx

    export_onnx(converted, example_inputs, target, dynamic_batch=dynamic_batch)
    model = onnx.load(str(target))
    uint8_activations(model)
    if u8u8:
        uint8_weights(model)
    global_pools(model)
    onnx.save(model, str(target))
