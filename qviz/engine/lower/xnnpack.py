"""Lower a converted model to ExecuTorch with the XNNPACK delegate, and run it.

The converted model is exported again (``torch.export``), ``to_edge_transform_and_lower`` with
``XnnpackPartitioner`` hands every pattern XNNPACK takes to a delegate (its dequantize -> op ->
quantize groups run as XNNPACK's int8 kernels), the rest stays on ExecuTorch's portable
kernels, and ``to_executorch`` serialises the program (``.pte``) that
``executorch.runtime.Runtime`` loads and runs. Each operator is recorded: inside a delegate, a
compute operator fed by a dequantize is an integer kernel; outside, it is a float fallback,
with the reason.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> x = torch.randn(8, 4)
    >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 3)).eval(), (x,))
    >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> _ = qviz.calibrate(p, x, progress=False)
    >>> lowered = qviz.lower(qviz.convert_pt2e(p), (x,), backend="xnnpack")
    >>> lowered.kernel_counts()["integer"], lowered(x).shape
    (1, torch.Size([8, 3]))
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule, Node

from qviz.engine.graph.capture import dynamic_batch_shapes
from qviz.engine.graph.inputs import rows_repeated
from qviz.engine.lower.machine import machine
from qviz.engine.lower.quiet import quiet
from qviz.engine.lower.records import DEFAULT_MAX_BATCH, IntegerFormat, KernelRecord
from qviz.errors import ConfigError, MissingDependencyError

_PORTABLE = "ExecuTorch portable kernels"
_BOUNDARY = ("quantize_per", "dequantize_per", "choose_qparams")
_DATA = (
    "view",
    "reshape",
    "permute",
    "squeeze",
    "unsqueeze",
    "clone",
    "expand",
    "slice",
    "cat",
    "getitem",
    "max_pool",
    "constant_pad",
    "_to_copy",
    "alias",
    "sym_size",
    "sym_numel",
)


def _import(name: str) -> Any:
    try:
        with quiet():
            return importlib.import_module(name)
    except ImportError as exc:
        raise MissingDependencyError(
            "qviz.lower(backend='xnnpack') needs ExecuTorch: pip install 'qviz[lower]' (executorch)"
        ) from exc


def _op_name(node: Node) -> str:
    target = node.target
    return getattr(target, "__name__", None) or str(target)


def _reaches(node: Node, boundary: str, upstream: bool) -> bool:
    """Whether a ``boundary`` op (``"dequantize"`` up, ``"quantize"`` down) is reached from
    ``node`` through compute operators only: the node sits inside a q/dq chain."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        for m in n.all_input_nodes if upstream else n.users:
            if m in seen or m.op != "call_function":
                continue
            seen.add(m)
            name = _op_name(m)
            found = "dequantize" if "dequantize_per" in name else None
            found = found or ("quantize" if "quantize_per" in name else None)
            if found == boundary:
                return True
            if not any(b in name for b in _BOUNDARY):
                todo.append(m)
    return False


def _kind(node: Node) -> str:
    """``"quantize"``, ``"data"``, or for a compute operator ``"integer"`` when it lies between
    a dequantize and a quantize (XNNPACK runs such a chain as int8 kernels), else ``"float"``."""
    name = _op_name(node)
    if any(b in name for b in _BOUNDARY):
        return "quantize"
    if any(d in name for d in _DATA) or "getitem" in str(node.target):
        return "data"
    inside = _reaches(node, "dequantize", upstream=True) and _reaches(
        node, "quantize", upstream=False
    )
    return "integer" if inside else "float"


def source_of(node: Node) -> str:
    """The name of the node ``node`` was made from in the program first exported (the
    converted model's node: ``conv2d`` for ``aten_convolution_default``), from the provenance
    each ExecuTorch pass keeps in ``meta["from_node"]``; "" without one.

    Example:
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> source_of(next(iter(gm.graph.nodes)))
        ''
    """
    chain = node.meta.get("from_node") or []
    name = ""
    while chain:
        name, chain = chain[-1].name, chain[-1].from_node
    return name


class _Refusals(logging.Handler):
    """Collects the reasons XNNPACK's partitioner gives for each node it does not take."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        node, reason = getattr(record.msg, "node", None), getattr(record.msg, "reason", None)
        if node is not None and reason:
            self.reasons.setdefault(str(getattr(node, "name", node)), str(reason))


@contextlib.contextmanager
def refusals() -> Iterator[dict[str, str]]:
    """``{node name: why XNNPACK's partitioner refused it}`` while partitioning: its own
    reasons, which it logs at debug level (the loggers' levels are restored after).

    Example:
        >>> with refusals() as why:
        ...     pass
        >>> why
        {}
    """
    handler = _Refusals()
    logger = logging.getLogger("executorch.backends.xnnpack")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # the debug records go to qviz only, not to the user's handlers
    try:
        yield handler.reasons
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def _without_kernel(graph_module: GraphModule, why: dict[str, str]) -> dict[str, str]:
    """``why``, plus "no XNNPACK kernel" for each operator left outside a delegate that no
    XNNPACK partitioner config handles (the partitioner gives no reason for those)."""
    configs = _import("executorch.backends.xnnpack.partition.config")
    handled = {c.target_name for c in configs.ALL_PARTITIONER_CONFIGS}
    why = dict(why)
    for node in graph_module.graph.nodes:
        name = _op_name(node).rsplit(".", 2)
        target = ".".join(name[-2:]) if len(name) >= 2 else ""
        if node.op == "call_function" and node.name not in why and target not in handled:
            why[node.name] = f"XNNPACK has no kernel for {_op_name(node)}"
    return why


def records_of(graph_module: GraphModule, why: dict[str, str] | None = None) -> list[KernelRecord]:
    """A :class:`KernelRecord` per operator of an ExecuTorch edge program's graph: the
    delegated ones (inside each ``lowered_module_<i>``) and those left to portable kernels,
    with the partitioner's reason (``why``: node name -> reason) where it gave one.

    Example:
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> [(r.op, r.kernel, r.where) for r in records_of(gm)]
        [('relu', 'float', 'ExecuTorch portable kernels')]
    """
    records = []
    for node in graph_module.graph.nodes:
        if node.op == "get_attr" and node.name.startswith("lowered_module_"):
            delegate = getattr(graph_module, node.name)
            where = f"XNNPACK delegate {node.name.removeprefix('lowered_module_')}"
            for inner in delegate.original_module.graph.nodes:
                if inner.op == "call_function":
                    kind = _kind(inner)
                    reason = (
                        "XNNPACK runs it on a float kernel: no dequantize / quantize around it "
                        "(the converted model left it in float)"
                        if kind == "float"
                        else ""
                    )
                    records.append(
                        KernelRecord(
                            node=inner.name,
                            op=_op_name(inner),
                            kernel=kind,
                            where=where,
                            reason=reason,
                            source=source_of(inner),
                        )
                    )
        elif node.op == "call_function" and "executorch_call_delegate" not in str(node.target):
            kind = _kind(node)
            reason = (
                "XNNPACK's partitioner did not take it: it runs on a float portable kernel"
                if kind in ("float", "integer")
                else ""
            )
            if reason and (why or {}).get(node.name):
                reason = f"XNNPACK's partitioner did not take it: {why[node.name]}"
            kind = "float" if kind == "integer" else kind
            records.append(
                KernelRecord(
                    node=node.name,
                    op=_op_name(node),
                    kernel=kind,
                    where=_PORTABLE,
                    reason=reason,
                    source=source_of(node),
                )
            )
    return records


def lower_exported(program: Any, path: Path | None = None) -> tuple[Any, list[KernelRecord], bytes]:
    """Partition, serialise and load an exported program; the run function (whose ``program``
    is ``program``, kept so a prefix of it can be lowered again), the records, the ``.pte``."""
    exir = _import("executorch.exir")
    partitioner = _import("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    runtime = _import("executorch.runtime")
    with refusals() as why, quiet():
        edge = exir.to_edge_transform_and_lower(
            program, partitioner=[partitioner.XnnpackPartitioner()]
        )
        graph_module = edge.exported_program().graph_module
        records = records_of(graph_module, _without_kernel(graph_module, why))
        buffer = edge.to_executorch().buffer
        # the loaded program reads the serialised buffer in place: both live as long as ``run``
        loaded = runtime.Runtime.get().load_program(buffer)
        method = loaded.load_method("forward")
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(buffer)

    def run(inputs: list[torch.Tensor], _keep: tuple = (buffer, loaded)) -> list[torch.Tensor]:
        return [o.clone() for o in method.execute(inputs)]

    run.program = program  # type: ignore[attr-defined]
    run.int_format = IntegerFormat(  # type: ignore[attr-defined]
        "QS8",
        f"XNNPACK's signed int8 kernels widen products to 16 bits and sum in 32 bits on every "
        f"CPU class, this {machine().isa} one included: no saturation",
    )
    meta = method.metadata
    run.input_sizes = (  # type: ignore[attr-defined]
        tuple(meta.input_tensor_meta(0).sizes()) if meta.num_inputs() else ()
    )
    return run, records, bytes(buffer)


def views_as_reshapes(graph_module: GraphModule) -> int:
    """Turn each ``aten.view`` of ``graph_module`` into ``aten.reshape`` (in place); how many.

    A reshape is a view where one works and a copy where it cannot: the decompositions below
    then build each view for the strides its input really has (a view written by the model
    after a transpose that ExecuTorch's passes lay out anew).

    Example:
        >>> gm = torch.fx.symbolic_trace(torch.nn.Flatten())
        >>> views_as_reshapes(gm)
        0
    """
    count = 0
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
            count += 1
    if count:
        graph_module.recompile()
    return count


def attention_decomposed(program: Any) -> Any:
    """``program`` with its scaled-dot-product attention decomposed into matmuls and a softmax
    (torch.export's own decompositions), or ``program`` itself where it has none.

    ExecuTorch first turns the reshapes after a fused attention into views, for the strides
    of the fused kernel's output, and decomposes the attention later, into a differently laid
    out output those views cannot read (GPT-2: "Cannot view a tensor with shape [2, 32, 64] and
    strides (64, 128, 1)"); decomposing it first keeps the strides the views are built for.

    Example:
        >>> ep = torch.export.export(torch.nn.ReLU(), (torch.randn(2),))
        >>> attention_decomposed(ep) is ep
        True
    """
    targets = {n.target for n in program.graph.nodes if n.op == "call_function"}
    table = {op: fn for op, fn in torch.export.default_decompositions().items()
             if "scaled_dot_product" in str(op)}  # fmt: skip
    return program.run_decompositions(table) if targets & set(table) else program


#: ExecuTorch plans a dynamic batch for 15 rows when the traced example has fewer than 16
#: (measured with executorch 1.5.1), and for ``max_batch`` from 16 rows on.
_PLANNED_FROM = 16


def _planning_example(example_inputs: tuple[Any, ...], max_batch: int) -> tuple[Any, ...]:
    """The example traced for a dynamic batch: its rows repeated to at least 16 (at most
    ``max_batch``), so that ExecuTorch plans memory for ``max_batch`` rather than 15."""
    batch = next(x.shape[0] for x in example_inputs if isinstance(x, torch.Tensor) and x.dim())
    rows = min(max_batch, max(batch, _PLANNED_FROM))
    return rows_repeated(example_inputs, rows)


def lower_xnnpack(
    converted: Any,
    example_inputs: tuple[Any, ...],
    dynamic_batch: bool,
    path: Path | None,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> tuple[Any, list[KernelRecord], bytes, Path | None]:
    """Export, partition, serialise and load; the run function, records, program and path.
    A dynamic batch goes up to ``max_batch``: ExecuTorch plans the memory of the operators
    outside a delegate for the largest batch, so an unbounded one cannot be allocated; the
    program's own bound (its input's planned size, sometimes below ``max_batch``) is kept."""
    _import("executorch.exir")
    shapes = None
    if dynamic_batch:
        example_inputs = _planning_example(example_inputs, max_batch)
        shapes = dynamic_batch_shapes(example_inputs, max_batch)
    program = torch.export.export(converted, example_inputs, dynamic_shapes=shapes)
    views_as_reshapes(program.graph_module)
    program = attention_decomposed(program)
    try:
        run, records, buffer = lower_exported(program, path)
    except MemoryError as exc:
        raise ConfigError(
            f"qviz.lower(backend='xnnpack'): ExecuTorch could not allocate the memory it planned "
            f"for batches up to {max_batch if dynamic_batch else 'the example'} ({exc}); lower "
            f"with a smaller max_batch=, or export with a fixed batch"
        ) from exc
    # the batch ExecuTorch planned for (its input's size bound), which may be below max_batch
    planned = run.input_sizes[0] if run.input_sizes else max_batch  # type: ignore[attr-defined]
    run.max_batch = min(planned, max_batch) if dynamic_batch else None  # type: ignore[attr-defined]
    return run, records, buffer, (Path(path) if path is not None else None)
