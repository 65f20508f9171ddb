"""Lower a converted model with ``torch.compile`` (Inductor, x86 CPU): oneDNN int8 kernels.

The converted model is compiled with Inductor's freezing on (weights become constants) and the
x86 int8 fusion passes registered: each dequantize -> conv / linear (-> relu / add) -> quantize
group becomes one oneDNN int8 kernel (``onednn.qconv_pointwise``, ``qconv2d_pointwise.binary``,
``qlinear_pointwise``), max-pooling and reshapes stay in uint8; whatever no pattern matches is
compiled to Inductor's own C++ loops in float arithmetic (dequantize -> op -> quantize). The
fusion passes ship with torchao (``pip install 'qviz[lower]'``); registering them adds patterns
to Inductor's freezing passes, once per process (idempotent), active only when freezing is on.
Inductor's configuration (freezing on) is patched around each call of the lowered model only
(a call may compile again), never changed globally.

What ran where is read from what Inductor produced, not guessed: the graph Inductor lowers
(captured after its freezing and post-grad passes) names each kernel and, through each node's
provenance, the converted model's nodes it computes; the generated wrapper code is then checked
to call every oneDNN int8 kernel the graph names. The artifact is that wrapper code (Python
calling the kernels, with the C++ of Inductor's own loops inside); ``size_bytes`` counts it plus
the frozen constants it runs with (packed int8 weights, their scales, biases).

A model exported with ``dynamic_batch=True`` is compiled with a symbolic batch (every other size
fixed), once. One exception: with a symbolic batch, Inductor expects a contiguous output from a
quantized conv whose input has one channel, where oneDNN writes channels-last; such a model is
compiled for the example's batch and again for each new batch size (up to dynamo's recompile
limit, then an error rather than a silent eager run).

Example:
    >>> import torch
    >>> kernel_of_target(torch.ops.onednn.qlinear_pointwise.default)
    ('integer', 'onednn.qlinear_pointwise')
"""

from __future__ import annotations

import copy
import functools
import importlib
import re
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.fx import Graph, GraphModule, Node

from qviz.engine.lower.machine import machine
from qviz.engine.lower.quiet import quiet
from qviz.engine.lower.records import IntegerFormat, KernelRecord
from qviz.errors import ConfigError, LoweringError, MissingDependencyError

_ONEDNN = "oneDNN int8 kernel"
_LOOP = "Inductor C++ loop"
_FLOAT_LIB = "oneDNN / MKL float kernel"
_QDQ = ("quantize_per_tensor", "quantize_per_channel", "dequantize_per_tensor",
        "dequantize_per_channel", "choose_qparams")  # fmt: skip
_DATA = ("view", "reshape", "permute", "squeeze", "unsqueeze", "clone", "expand", "slice",
         "cat", "getitem", "max_pool", "constant_pad", "_to_copy", "alias", "flatten",
         "contiguous", "transpose", "sym_size", "force_stride_order", "split")  # fmt: skip
_FLOAT_MM = ("aten.mm", "aten.addmm", "aten.bmm", "aten.convolution")
_RANK = {"integer": 0, "float": 1, "data": 2, "quantize": 3}
#: Inductor's uint8 lowerings of data movement (a max-pool, a reshape, a concatenation).
_INT8_DATA = {"qmaxpool2d": "quantized.max_pool2d", "qreshape": "reshape (uint8)",
              "qcat": "cat (uint8)"}  # fmt: skip


def _passes() -> None:
    """Register the x86 int8 fusion passes (torchao's; idempotent) or name what to install."""
    try:
        with quiet():
            x86 = importlib.import_module("torchao.quantization.pt2e.inductor_passes.x86")
    except ImportError as exc:
        raise MissingDependencyError(
            "qviz.lower(backend='inductor') needs torchao's x86 int8 fusion passes: "
            "pip install 'qviz[lower]' (torchao)"
        ) from exc
    x86._register_quantization_weight_pack_pass()


def kernel_of_target(target: Any) -> tuple[str, str] | None:
    """``(kernel, op)`` for a node target of Inductor's final graph, None for plain aten ops
    (whose kind depends on their dtype).

    Example:
        >>> kernel_of_target(torch.ops.aten.addmm.default), kernel_of_target(torch.ops.aten.relu)
        (('float', 'aten.addmm'), None)
    """
    if isinstance(target, functools.partial):  # a lowering pattern: what it replaced
        name = getattr(target.func, "__name__", "")
        match = target.args[0] if target.args else None
        for inner in getattr(match, "nodes", ()):
            found = kernel_of_target(inner.target)
            if found and found[0] == "integer":
                return found
        return ("data", _INT8_DATA[name]) if name in _INT8_DATA else None
    op = str(getattr(target, "_overloadpacket", target))
    if op.startswith("onednn."):
        return ("integer", op) if ".q" in op else ("float", op)
    if any(q in op for q in _QDQ):
        return "quantize", op
    if op.startswith("mkldnn.") or op in _FLOAT_MM:
        return "float", op
    return None


def _roots(node: Node) -> list[str]:
    """The names of the traced (converted) graph's nodes ``node`` came from."""
    names, todo = [], list(node.meta.get("from_node") or [])
    while todo:
        source = todo.pop(0)
        if source.from_node:
            todo.extend(source.from_node)
        else:
            names.append(source.name)
    return names


def _where(kernel: str, op: str) -> str:
    if kernel == "integer":
        return _ONEDNN
    if op in _INT8_DATA.values():
        return "Inductor uint8 kernel"
    if kernel == "float" and (op.startswith(("mkldnn.", "onednn.")) or op in _FLOAT_MM):
        return _FLOAT_LIB
    return _LOOP


def final_kernels(graph: Graph) -> dict[str, tuple[str, str, str]]:
    """Converted-graph node name -> ``(kernel, op, where)``, read from Inductor's final graph
    (a name several kernels came from keeps the integer one, then float, data, quantize).

    Example:
        >>> final_kernels(torch.fx.symbolic_trace(torch.nn.ReLU()).graph)
        {}
    """
    found: dict[str, tuple[str, str, str]] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        kernel = kernel_of_target(node.target)
        if kernel is None:
            val = node.meta.get("val")
            op = str(getattr(node.target, "_overloadpacket", node.target))
            floating = isinstance(val, torch.Tensor) and val.dtype.is_floating_point
            data = any(d in op for d in _DATA) or not floating
            kernel = ("data" if data else "float", op)
        match = node.target.args[0] if isinstance(node.target, functools.partial) else None
        sources = _roots(node) + [r for n in getattr(match, "nodes", ()) for r in _roots(n)]
        for name in sources:
            if name not in found or _RANK[kernel[0]] < _RANK[found[name][0]]:
                found[name] = (kernel[0], kernel[1], _where(*kernel))
    return found


def _covering(node: Node, found: dict[str, tuple[str, str, str]]) -> tuple[str, str, str] | None:
    """The kernel that computes ``node``: its own, else the first integer or float kernel
    downstream up to the next quantize (a fused kernel carries its output quantize's name)."""
    todo, seen, first = [node], {node}, None
    while todo:
        current = todo.pop(0)
        hit = found.get(current.name)
        if hit is not None and hit[0] in ("integer", "float"):
            return hit
        first = first or hit
        if current is not node and any(q in str(current.target) for q in _QDQ):
            continue
        for user in current.users:
            if user not in seen and user.op == "call_function":
                seen.add(user)
                todo.append(user)
    return first


def _float_reason(node: Node, op: str, where: str) -> str:
    fed = any("dequantize" in str(n.target) for n in node.all_input_nodes)
    if not fed:
        return f"its inputs are float (the converted model left it in float): {where} ({op})"
    if where == _FLOAT_LIB:
        return (f"{where} ({op}): the int8 fusion passes matched no dequantize -> op -> "
                f"quantize pattern around it")  # fmt: skip
    return (f"Inductor computes it in float arithmetic in its own C++ loop between a dequantize "
            f"and a quantize ({op}): no oneDNN int8 kernel for this op")  # fmt: skip


def records_of(
    converted: GraphModule, found: dict[str, tuple[str, str, str]], code: str
) -> list[KernelRecord]:
    """A :class:`KernelRecord` per operator of ``converted``: the kernel Inductor's final graph
    runs it on (:func:`final_kernels`), an integer one only if ``code`` calls it.

    Example:
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> found = {"relu": ("float", "aten.relu", "Inductor C++ loop")}
        >>> [(r.node, r.kernel) for r in records_of(gm, found, "")]
        [('relu', 'float')]
    """
    records = []
    for node in converted.graph.nodes:
        if node.op != "call_function":
            continue
        op = str(getattr(node.target, "_overloadpacket", node.target))
        add = functools.partial(_add, records, node.name, op)
        hit = _covering(node, found)
        if any(q in op for q in _QDQ):
            if found.get(node.name, ("",))[0] == "quantize":  # a standalone (de)quantize loop
                add("quantize", _LOOP)
        elif any(d in op for d in _DATA) or "getitem" in str(node.target):
            add("data", hit[2] if hit else _LOOP)
        elif hit is None:
            add("float", _LOOP, "no kernel of Inductor's final graph traces back to it")
        elif hit[0] == "integer" and hit[1].rsplit(".", 1)[-1] in code:
            add("integer", f"{_ONEDNN} {hit[1]}")
        elif hit[0] == "integer":
            add("float", _LOOP, f"the passes chose {hit[1]}; the generated code does not call it")
        else:
            where = hit[2] if hit[0] == "float" else _LOOP
            add("float", where, _float_reason(node, hit[1], where))
    return records


def _add(records: list, node: str, op: str, kernel: str, where: str, reason: str = "") -> None:
    records.append(
        KernelRecord(node=node, op=op, kernel=kernel, where=where, reason=reason, source=node)
    )


def _constant_bytes(graph: Graph) -> int:
    """Bytes of the frozen constants the final graph reads (packed weights, scales, biases)."""
    owner, total = graph.owning_module, 0
    for node in graph.nodes:
        value = getattr(owner, str(node.target), None) if node.op == "get_attr" else None
        if isinstance(value, torch.Tensor):
            try:
                total += value.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError):  # an opaque (mkldnn) tensor
                total += value.numel() * value.element_size()
    return total


class _Capture:
    """Inductor's post-grad pass hook: keeps the first final graph while ``active``."""

    def __init__(self) -> None:
        self.active, self.graphs = True, []

    def __call__(self, graph: Graph) -> None:
        if self.active and not self.graphs:
            self.graphs.append(graph)


def _config(capture: _Capture) -> Any:
    """Inductor's configuration for this model only: a patch context around each call (a
    call may compile again: a batch of 1, or a new batch size where the batch is fixed)."""
    return torch._inductor.config.patch(
        freezing=True, fx_graph_cache=False, post_grad_custom_post_pass=capture
    )


def _compile(model: GraphModule, example_inputs: tuple[Any, ...], dynamic: bool) -> Any:
    """``torch.compile`` with freezing, run once on the example; the compiled model, the
    capture hook, Inductor's final graph and its wrapper code."""
    from torch._inductor.graph import GraphLowering

    capture, codes = _Capture(), []
    compiled = torch.compile(model, dynamic=False)
    inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in example_inputs]
    for x in inputs if dynamic else ():
        if isinstance(x, torch.Tensor) and x.dim():
            torch._dynamo.mark_dynamic(x, 0)  # the batch only; every other size stays fixed
    with torch.no_grad(), _config(capture):
        with mock.patch.object(GraphLowering, "save_output_code", codes.append):
            compiled(*inputs)
    capture.active = False
    if not capture.graphs or not codes:
        raise LoweringError(
            "qviz.lower(backend='inductor'): torch.compile produced no Inductor graph (it fell "
            "back to eager: a graph break or a disabled compiler); run with TORCH_LOGS=graph_breaks"
        )
    return compiled, capture, capture.graphs.pop(), codes[-1]


def compile_error(exc: BaseException) -> LoweringError:
    """The qviz error for a failure inside Inductor: the operator that failed and the fix.

    Example:
        >>> compile_error(RuntimeError("quantized::conv2d_relu: Input tensor should have uint8 "
        ...     "(unsigned char) or fp8 data type")).args[0][:60]
        "qviz.lower(backend='inductor'): Inductor failed at quantized"
        >>> wrapped = RuntimeError("backend='inductor' raised:" + chr(10) + "TypeError: bad")
        >>> compile_error(wrapped).args[0][:81]
        "qviz.lower(backend='inductor'): Inductor failed at an operator (TypeError: bad); "
    """
    text = f"{exc}\n{exc.__cause__ or ''}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"^\w+(Error|Exception)\b", line)]
    first = next(
        (line for line in lines if "::" in line),
        raised[0] if raised else (lines[0] if lines else type(exc).__name__),
    )  # the cause's own line, not the "backend='inductor' raised:" wrapper
    op = re.search(r"\b(?:aten|quantized|onednn|mkldnn|quantized_decomposed)::\w+", text)
    name = op.group(0) if op else "an operator"
    if ("uint8" in text and "data type" in text) or "quantized_max_pool2d" in text:
        fix = ("oneDNN's int8 kernels take uint8 activations (zero point in 0..255), this model's "
               "are int8 (e.g. XNNPACKQuantizer's symmetric configuration): quantize the float "
               "model with X86InductorQuantizer for backend='inductor', or lower this one with "
               "backend='xnnpack' or 'onnxruntime'")  # fmt: skip
    else:
        fix = ("quantize with X86InductorQuantizer, whose patterns the x86 int8 passes match, or "
               "lower with backend='xnnpack' or 'onnxruntime'")  # fmt: skip
    return LoweringError(
        f"qviz.lower(backend='inductor'): Inductor failed at {name} ({first[:300]}); {fix}"
    )


_MATMULS = ("conv", "linear", "matmul", "addmm", "mm", "bmm")
#: The widest unsigned activation grid whose products with int8 weights, added in pairs, stay
#: within a 16-bit sum: 127 x 128 x 2 = 32512 <= 32767 (7-bit activations, ``reduce_range``).
_PAIR_SAFE_CODES = 128


def saturating_nodes(converted: GraphModule) -> list[str]:
    """The conv / linear nodes of ``converted`` whose uint8 input grid spans more than 128
    codes: where the uint8 x int8 kernels of a CPU without VNNI add neighbouring products in
    16-bit sums, those can saturate (255 x 127 x 2 = 64770 > 32767). Int8 activations are not
    counted: oneDNN takes none, and the compile's own error names the quantizer to use.

    Example:
        >>> saturating_nodes(torch.fx.symbolic_trace(torch.nn.ReLU()))
        []
    """
    found = []
    for node in converted.graph.nodes:
        op = getattr(node.target, "__name__", "").split(".")[0]
        if node.op != "call_function" or not any(op.startswith(m) for m in _MATMULS):
            continue
        source = node.args[0] if node.args else None
        if not isinstance(source, Node) or "dequantize" not in str(source.target):
            continue
        low, high = source.args[3:5] if len(source.args) >= 5 else (0, 255)
        if len(source.args) >= 6 and source.args[5] != torch.uint8:
            continue
        if isinstance(low, int) and isinstance(high, int) and high - low + 1 > _PAIR_SAFE_CODES:
            found.append(node.name)
    return found


_FULL_RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127)}


def clamp_to_grid(gm: GraphModule) -> int:
    """Clamp, in float, the input of every per-tensor quantize whose grid is narrower than its
    dtype (``reduce_range``'s 0..127 in uint8) to that grid's range; the count clamped.

    The reference clamps the codes to ``quant_min..quant_max``; oneDNN's fused int8 kernels
    take only a scale and a zero point and saturate to the whole dtype, so a value beyond the
    calibrated range became code 157 where the reference has 127 (measured: 30 steps at the
    digits model's first conv), and on a CPU without VNNI the next layer's 16-bit sums met the
    full 0..255 grid again. A float clamp to ``[(quant_min - zp) * scale, (quant_max - zp) *
    scale]`` before the quantize gives the reference's codes exactly (a value within the range
    is untouched; one beyond it rounds to the bound), and Inductor fuses it into the kernel as
    a ``hardtanh`` post-op: a ReLU that only feeds the quantize becomes that hardtanh. Edits
    ``gm`` (the lowering's own copy) in place.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import X86InductorQuantizer
        >>> from qviz.engine.quantizers import get_default_x86_inductor_quantization_config as cfg
        >>> x = torch.randn(4, 8)
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        >>> quantizer = X86InductorQuantizer().set_global(cfg(reduce_range=True))
        >>> prepared = qviz.prepare_pt2e(qviz.export(model, (x,)), quantizer)
        >>> converted = qviz.convert_pt2e(qviz.calibrate(prepared, [x], progress=False))
        >>> clamp_to_grid(converted)  # the input's quantize (the model's output stays float)
        1
        >>> torch.ops.aten.hardtanh.default in {n.target for n in converted.graph.nodes}
        True
    """
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    graph, count = gm.graph, 0
    for node in list(graph.nodes):
        if node.target != quantize or len(node.args) < 6:
            continue
        source, scale, zero_point, low, high, dtype = node.args[:6]
        full = _FULL_RANGE.get(dtype)
        if full is None or (low, high) == full or not isinstance(source, Node):
            continue
        if not all(isinstance(v, (int, float)) for v in (scale, zero_point, low, high)):
            continue  # qparams held in tensors: not a constant clamp
        lo, hi = (low - zero_point) * scale, (high - zero_point) * scale
        if source.target == torch.ops.aten.relu.default and len(source.users) == 1:
            source.target = torch.ops.aten.hardtanh.default
            source.args = (source.args[0], max(0.0, lo), hi)
        else:
            with graph.inserting_before(node):
                clamp = graph.call_function(torch.ops.aten.hardtanh.default, (source, lo, hi))
            clamp.meta = dict(source.meta)
            node.replace_input_with(source, clamp)
        count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count


def _compile_copy(converted: GraphModule) -> GraphModule:
    """What Inductor compiles: a copy (its freezing never touches the caller's weights) with
    every narrow grid clamped (:func:`clamp_to_grid`)."""
    model = copy.deepcopy(converted)
    clamp_to_grid(model)
    return model


def _int_format(converted: GraphModule) -> IntegerFormat:
    """The format oneDNN computes here, or a LoweringError where it would saturate."""
    here = machine()
    if here.exact_u8s8:
        return IntegerFormat(
            "U8S8", f"oneDNN's uint8 x int8 kernels sum in 32 bits on this {here.isa} machine"
        )
    nodes = saturating_nodes(converted)
    if nodes:
        shown = ", ".join(nodes[:6]) + (f" and {len(nodes) - 6} more" if len(nodes) > 6 else "")
        raise LoweringError(
            f"qviz.lower(backend='inductor'): on this {here.isa} machine ({here}) oneDNN's int8 "
            f"kernels add pairs of uint8 x int8 products in saturating 16-bit sums (no VNNI), "
            f"and {shown} read activations on a full 0..255 grid, which can overflow them: "
            f"quantize with get_default_x86_inductor_quantization_config(reduce_range=True) "
            f"(7-bit activations: no pair overflows here), or lower with backend='onnxruntime' "
            f"or 'xnnpack'"
        )
    return IntegerFormat(
        "U8S8 (7-bit activations)",
        f"this {here.isa} machine's oneDNN kernels add products in 16-bit pairs (no VNNI); the "
        f"model's activations span at most 128 codes (reduce_range), so no pair overflows",
    )


def lower_inductor(
    converted: GraphModule, example_inputs: tuple[Any, ...], dynamic_batch: bool, path: Path | None
) -> tuple[Any, list[KernelRecord], bytes, Path | None, int]:
    """Compile (on a copy), read the kernels; the run function, records, wrapper code, the
    path it was written to, and the size: code plus frozen constants."""
    int_format = _int_format(converted)
    _passes()
    model = _compile_copy(converted)
    dynamic = dynamic_batch
    try:
        try:
            compiled, capture, graph, code = _compile(model, example_inputs, dynamic)
        except Exception:
            if not dynamic:
                raise
            # Inductor's dynamic-shape lowering fails on some int8 patterns (a one-channel
            # quantized conv's layout; the x86 passes' 3-d linear reshapes build torch.Size from
            # a symbolic size): each new batch size compiles its own static program, on a fresh
            dynamic = False
            model = _compile_copy(converted)  # a new copy: dynamo caches on the forward's code
            compiled, capture, graph, code = _compile(model, example_inputs, False)
    except (ConfigError, LoweringError):
        raise
    except Exception as exc:
        raise compile_error(exc) from exc
    records = records_of(converted, final_kernels(graph), code)
    artifact = code.encode()
    size = len(artifact) + _constant_bytes(graph)
    del graph  # it holds a second copy of the constants
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(artifact)
    recompiles = dynamic_batch and not dynamic

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        with (
            torch.no_grad(),
            _config(capture),
            torch._dynamo.config.patch(fail_on_recompile_limit_hit=recompiles),
        ):
            out = compiled(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    run.int_format = int_format  # type: ignore[attr-defined]
    return run, records, artifact, (Path(path) if path is not None else None), size
