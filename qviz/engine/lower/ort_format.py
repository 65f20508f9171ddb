"""Which integer format onnxruntime computes exactly on this machine, found by measuring it.

onnxruntime fuses a QDQ graph into integer kernels whose format is the dtypes of the
activations and weights: ``"U8S8"`` (uint8 activations, int8 weights: fastest) or ``"U8U8"``
(both uint8). onnxruntime documents that its U8S8 kernels on x86 without VNNI (SSE4.1, AVX2,
AVX-512 without VNNI) add neighbouring products in a saturating 16-bit sum, so large weights
meeting large activations come out wrong, and names U8U8 as the format without that overflow.
The lowering does not guess from CPU flags alone: :func:`exact` runs a probe (a QLinearConv
and a QGemm whose every pair of products, 255 x 127 twice, exceeds 32767) in a real session
and compares it with the exact integer result, once per process. :func:`choose` takes U8S8
where its probe is exact and U8U8 otherwise; U8U8 is the same values (each int8 weight + 128
with zero point + 128), so the lowered program computes what the reference does.

This module imports neither torch nor qviz's engine, so it runs wherever onnxruntime does.

Example:
    >>> fmt = choose()
    >>> fmt.name in ("U8S8", "U8U8"), fmt.exact
    (True, True)
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

#: onnxruntime's session option that makes its x86 U8S8 kernels compute as U8U8 (documented in
#: its session options' config keys; effective only on the CPUs that overflow).
PRECISION_MODE = "session.x64quantprecision"
_K = 64  # products summed per output: 32 pairs, each 255 * 127 * 2 = 64770 > 32767
_OUT = 250  # the exact result's output code; a saturated sum gives about half of it


@dataclass(frozen=True)
class OrtFormat:
    """The integer format a lowering gives onnxruntime, and why.

    Attributes:
        name: ``"U8S8"`` or ``"U8U8"``.
        precision_mode: run with onnxruntime's ``session.x64quantprecision`` (a given
            ``.onnx`` with int8 weights on a machine whose U8S8 kernels overflow).
        exact: whether the probe found this format's kernels exact on this machine.
        why: the reason, in words.
    """

    name: str
    precision_mode: bool
    exact: bool
    why: str


def _helpers() -> tuple[Any, Any, Any]:
    onnx = importlib.import_module("onnx")
    numpy = importlib.import_module("numpy")
    return onnx, onnx.helper, numpy


def probe_model(weights: str = "int8") -> Any:
    """A QDQ model of one 1x1 Conv and one Gemm over 64 inputs, every activation 255 and every
    weight 127 (``weights="uint8"``: 255 with zero point 128, the same values); the exact
    output code of both is 250.

    Example:
        >>> [n.op_type for n in probe_model().graph.node][:3]
        ['QuantizeLinear', 'DequantizeLinear', 'DequantizeLinear']
    """
    onnx, helper, np = _helpers()
    from onnx import numpy_helper

    wtype, wvalue, wzero = (np.uint8, 255, 128) if weights == "uint8" else (np.int8, 127, 0)
    out_scale = _K * 255 * 127 / _OUT
    inits = [
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0, np.uint8), "zero"),
        numpy_helper.from_array(np.array(out_scale, np.float32), "out_scale"),
        numpy_helper.from_array(np.array(wzero, wtype), "wc_zero"),
        numpy_helper.from_array(np.array(wzero, wtype), "wg_zero"),
        numpy_helper.from_array(np.array(1.0, np.float32), "wc_scale"),
        numpy_helper.from_array(np.array(1.0, np.float32), "wg_scale"),
        numpy_helper.from_array(np.full((16, _K, 1, 1), wvalue, wtype), "w_conv"),
        numpy_helper.from_array(np.full((_K, 16), wvalue, wtype), "w_gemm"),
    ]
    node = helper.make_node
    nodes = [
        node("QuantizeLinear", ["x", "one", "zero"], ["xq"]),
        node("DequantizeLinear", ["xq", "one", "zero"], ["xd"]),
        node("DequantizeLinear", ["w_conv", "wc_scale", "wc_zero"], ["wc"]),
        node("DequantizeLinear", ["w_gemm", "wg_scale", "wg_zero"], ["wg"]),
        node("Conv", ["xd", "wc"], ["c"]),
        node("QuantizeLinear", ["c", "out_scale", "zero"], ["cq"]),
        node("DequantizeLinear", ["cq", "out_scale", "zero"], ["conv"]),
        node("Flatten", ["xd"], ["xf"]),
        node("Reshape", ["xf", "shape"], ["xr"]),
        node("Gemm", ["xr", "wg"], ["g"]),
        node("QuantizeLinear", ["g", "out_scale", "zero"], ["gq"]),
        node("DequantizeLinear", ["gq", "out_scale", "zero"], ["gemm"]),
    ]
    inits.append(numpy_helper.from_array(np.array([-1, _K], np.int64), "shape"))
    floats = onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "qviz_saturation_probe",
        [helper.make_tensor_value_info("x", floats, [4, _K, 2, 2])],
        [
            helper.make_tensor_value_info("conv", floats, None),
            helper.make_tensor_value_info("gemm", floats, None),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@functools.cache
def exact(weights: str = "int8", precision_mode: bool = False) -> bool:
    """Whether onnxruntime's optimised CPU session computes :func:`probe_model` exactly here:
    every output code 250, none saturated (measured once per process).

    Example:
        >>> exact("uint8")
        True
    """
    ort = importlib.import_module("onnxruntime")
    _, _, np = _helpers()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if precision_mode:
        options.add_session_config_entry(PRECISION_MODE, "1")
    model = probe_model(weights).SerializeToString()
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    x = np.full((4, _K, 2, 2), 255.0, np.float32)
    scale = _K * 255 * 127 / _OUT
    return all(bool(np.all(np.rint(o / scale) == _OUT)) for o in session.run(None, {"x": x}))


def choose(machine_class: str = "", given_int8: bool = False) -> OrtFormat:
    """The format to lower to: U8S8 where its kernels are exact here, else U8U8 (exported
    with uint8 weights, or, for a given file with int8 weights, onnxruntime's precision mode);
    ``machine_class`` only words the reason.

    Example:
        >>> choose("AVX2").exact
        True
    """
    where = f" on this {machine_class} machine" if machine_class else " on this machine"
    if exact("int8"):
        return OrtFormat("U8S8", False, True, f"uint8 x int8 kernels sum in 32 bits{where}")
    overflow = (f"onnxruntime's U8S8 kernels saturate 16-bit sums{where} (x86 without VNNI; the "
                f"probe measured it)")  # fmt: skip
    if given_int8:
        ok = exact("int8", precision_mode=True)
        why = f"{overflow}: the given file runs in onnxruntime's precision mode ({PRECISION_MODE})"
        return OrtFormat("U8U8", True, ok, why)
    ok = exact("uint8")
    return OrtFormat("U8U8", False, ok, f"{overflow}: weights stated as uint8 (+128), U8U8")


def exact_session(model: Any, *, optimize: bool = True, threads: int | None = None) -> Any:
    """An onnxruntime session of a QDQ model (what :func:`qviz.export_onnx` writes) that
    computes it exactly on this machine.

    With graph optimisations on, onnxruntime fuses the QDQ pairs into its integer kernels; where
    their U8S8 format saturates (x86 without VNNI, measured by :func:`exact`), the session runs
    a copy whose int8 weights are restated as uint8 (:func:`uint8_weights`: the same values, the
    U8U8 format onnxruntime documents as free of that overflow); the file is left as it is. With
    ``optimize=False`` every QuantizeLinear / DequantizeLinear runs as written: exact everywhere,
    slower.

    Args:
        model: an ``onnx.ModelProto`` or the path of an ``.onnx`` file.
        optimize: onnxruntime's full graph optimisations (its integer kernels).
        threads: intra-op threads (None: onnxruntime's default).

    Example:
        >>> session = exact_session(probe_model())
        >>> import numpy as np
        >>> out = session.run(None, {"x": np.full((4, 64, 2, 2), 255.0, np.float32)})
        >>> [int(np.rint(o / (64 * 255 * 127 / 250)).max()) for o in out]  # never saturated
        [250, 250]
    """
    ort = importlib.import_module("onnxruntime")
    onnx, _, _ = _helpers()
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    if optimize and not exact("int8"):
        proto = onnx.ModelProto.FromString(proto.SerializeToString())  # a copy to restate
        uint8_weights(proto)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    level = ort.GraphOptimizationLevel
    options.graph_optimization_level = level.ORT_ENABLE_ALL if optimize else level.ORT_DISABLE_ALL
    if threads is not None:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(proto.SerializeToString(), options, ["CPUExecutionProvider"])


def uint8_weights(model: Any) -> int:
    """Restate every int8 weight of ``model`` (an ``onnx.ModelProto``, edited in place) as
    uint8: each value and its zero point + 128, the same real values; how many were restated.
    The int8 originals that nothing else reads are removed, so the file holds each weight once.

    A weight is a DequantizeLinear whose input is an int8 initializer.

    Example:
        >>> import numpy as np
        >>> from onnx import helper, numpy_helper
        >>> w = numpy_helper.from_array(np.array([-128, 0, 127], np.int8), "w")
        >>> z = numpy_helper.from_array(np.array(0, np.int8), "z")
        >>> s = numpy_helper.from_array(np.array(0.5, np.float32), "s")
        >>> g = helper.make_graph([helper.make_node("DequantizeLinear", ["w", "s", "z"], ["y"])],
        ...     "g", [], [helper.make_tensor_value_info("y", 1, [3])], [w, s, z])
        >>> m = helper.make_model(g)
        >>> uint8_weights(m), [i.name for i in m.graph.initializer]
        (1, ['s', 'w_u8w', 'z_u8w'])
        >>> numpy_helper.to_array(m.graph.initializer[1]).tolist()
        [0, 128, 255]
    """
    from onnx import TensorProto

    _, _, np = _helpers()
    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    restated: dict[str, str] = {}
    count = 0
    for node in graph.node:
        tensor = initializers.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if tensor is None or tensor.data_type != TensorProto.INT8:
            continue
        for slot in (0, 2):
            if slot == 2 and len(node.input) < 3:  # no zero point: int8's default is 0
                node.input.append(_zero_point(graph, restated, np))
                continue
            node.input[slot] = _restated(node.input[slot], graph, initializers, restated, np)
        count += 1
    count += _quantized_float_weights(graph, initializers, restated, np)
    used = {name for node in graph.node for name in node.input}
    for name in restated:  # the int8 originals no node reads any more: not stored twice
        if name and name not in used and name in initializers:
            graph.initializer.remove(initializers[name])
    return count


def _quantized_float_weights(
    graph: Any, initializers: dict[str, Any], restated: dict[str, str], np: Any
) -> int:
    """Float weights quantized in the graph (a QuantizeLinear of a float initializer with an
    int8 zero point, as the tensor-level toolkit exports them; onnxruntime folds it into an
    int8 constant): its zero point, and that of the DequantizeLinear reading it, restated as
    uint8 (+128), so the folded weight is uint8 with the same values. How many were restated."""
    from onnx import TensorProto

    count = 0
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    for node in graph.node:
        source = initializers.get(node.input[0]) if node.op_type == "QuantizeLinear" else None
        if source is None or source.data_type != TensorProto.FLOAT or len(node.input) < 3:
            continue
        zero = initializers.get(node.input[2])
        if zero is None or zero.data_type != TensorProto.INT8:
            continue
        dequantizers = readers.get(node.output[0], [])
        if not dequantizers or any(r.op_type != "DequantizeLinear" for r in dequantizers):
            continue
        users = (node, *dequantizers)
        if any(len(u.input) < 3 or u.input[2] not in initializers for u in users):
            continue  # a DequantizeLinear without an explicit zero point: left as is
        for user in users:
            user.input[2] = _restated(user.input[2], graph, initializers, restated, np)
        count += 1
    return count


def _restated(
    name: str, graph: Any, initializers: dict[str, Any], restated: dict[str, str], np: Any
) -> str:
    """The name of int8 initializer ``name`` restated as uint8 (each value + 128), added to
    ``graph`` the first time it is asked for."""
    from onnx import numpy_helper

    if name not in restated:
        values = numpy_helper.to_array(initializers[name]).astype(np.int16) + 128
        graph.initializer.append(numpy_helper.from_array(values.astype(np.uint8), f"{name}_u8w"))
        restated[name] = f"{name}_u8w"
    return restated[name]


def _zero_point(graph: Any, restated: dict[str, str], np: Any) -> str:
    """The name of a uint8 zero point 128 (int8's implicit 0, restated)."""
    from onnx import numpy_helper

    if "" not in restated:
        graph.initializer.append(numpy_helper.from_array(np.array(128, np.uint8), "qviz_u8_128"))
        restated[""] = "qviz_u8_128"
    return restated[""]
