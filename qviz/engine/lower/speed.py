"""int8 against the same backend's float program, on this machine: what lowering buys.

Comparing an int8 program with eager PyTorch mostly measures Python's overhead. A user choosing a
backend needs int8 against that backend's own float program: :func:`float_twin` rebuilds the
converted model without its quantize / dequantize pairs (each weight dequantized once, so it
computes in float with the converted model's architecture), :func:`lower_float` puts it on the
backend's float kernels (XNNPACK fp32 ``.pte``, an onnxruntime float session, ``torch.compile``
with freezing), and :func:`compare_speed` times both, interleaved, at each batch.

Example:
    >>> row = SpeedRow(batch=1, int8_seconds=0.001, float_seconds=0.002)
    >>> round(row.speedup, 2)
    2.0
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

from qviz.errors import ConfigError

#: What each backend's float program is, in words.
FLOAT_PROGRAM = {
    "xnnpack": "XNNPACK fp32 .pte",
    "onnxruntime": "onnxruntime float session",
    "inductor": "torch.compile float with freezing",
}
#: Below this int8 / float speedup the summary says int8 does not pay on this machine.
PAYS = 1.1


@dataclass(frozen=True)
class SpeedRow:
    """One batch: the median seconds of a call of the int8 and of the float program."""

    batch: int
    int8_seconds: float
    float_seconds: float

    @property
    def speedup(self) -> float:
        """How many times faster int8 is than float (below 1: slower)."""
        return self.float_seconds / self.int8_seconds


@dataclass(frozen=True)
class SpeedComparison:
    """int8 against the same backend's float program on one machine.

    Attributes:
        backend: the backend both programs run on.
        float_program: what the float side is (``"XNNPACK fp32 .pte"``, ...).
        machine: the machine, in words (:meth:`Machine.describe`).
        rows: one :class:`SpeedRow` per batch.
    """

    backend: str
    float_program: str
    machine: str
    rows: tuple[SpeedRow, ...]

    def lines(self, machine: bool = True) -> list[str]:
        """The comparison as lines of text (naming the machine unless ``machine=False``), a
        verdict where int8 does not pay."""
        on = f" on {self.machine}" if machine else ""
        out = [f"speed{on}, int8 against the {self.float_program}:"]
        out += [
            f"  batch {r.batch}: int8 {r.int8_seconds * 1e3:.3f} ms, float "
            f"{r.float_seconds * 1e3:.3f} ms: {r.speedup:.2f}x"
            for r in self.rows
        ]
        slow = [r.batch for r in self.rows if r.speedup < PAYS]
        if slow:
            batches = ", ".join(map(str, slow))
            out.append(
                f"  int8 does not pay on this machine at batch {batches} (under {PAYS}x the "
                f"{self.backend} float program)"
            )
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        import html

        return "<pre>" + html.escape(str(self)) + "</pre>"


def _is(node: Any, name: str) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and name in str(node.target)


def _value(gm: GraphModule, arg: Any) -> Any:
    return getattr(gm, arg.target) if isinstance(arg, Node) and arg.op == "get_attr" else arg


def float_twin(converted: GraphModule) -> GraphModule:
    """A copy of ``converted`` without its quantize / dequantize pairs: activations flow in
    float, each constant weight is dequantized once into a float constant.

    Example:
        >>> import qviz
        >>> from qviz.engine.quantizers import (XNNPACKQuantizer,
        ...     get_symmetric_quantization_config)
        >>> x = torch.randn(4, 3)
        >>> gm = qviz.export(torch.nn.Linear(3, 2).eval(), (x,))
        >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
        ...     get_symmetric_quantization_config()))
        >>> _ = qviz.calibrate(p, x, progress=False)
        >>> twin = float_twin(qviz.convert_pt2e(p))
        >>> any("quantize" in str(n.target) for n in twin.graph.nodes)
        False
    """
    gm = copy.deepcopy(converted)
    graph = gm.graph
    for i, node in enumerate(list(graph.nodes)):
        if not _is(node, "dequantize_per"):
            continue
        source = node.args[0]
        if _is(source, "quantize_per"):
            node.replace_all_uses_with(source.args[0])
        elif isinstance(source, Node) and source.op == "get_attr":
            args = [_value(gm, a) for a in node.args]
            kwargs = {k: _value(gm, v) for k, v in node.kwargs.items()}
            name = f"_qviz_float_twin_{i}"
            gm.register_buffer(name, node.target(*args, **kwargs))
            with graph.inserting_before(node):
                constant = graph.get_attr(name)
            constant.meta = dict(node.meta)
            node.replace_all_uses_with(constant)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return gm


def lower_float(backend: str, twin: GraphModule, example: tuple, dynamic: bool) -> Any:
    """``twin`` on ``backend``'s float kernels; a function of a list of tensors."""
    if backend == "xnnpack":
        from qviz.engine.lower.xnnpack import lower_xnnpack

        return lower_xnnpack(twin, example, dynamic, None)[0]
    if backend == "inductor":
        compiled = torch.compile(twin, dynamic=False)

        def run(inputs: list[torch.Tensor]) -> Any:
            with torch.no_grad(), torch._inductor.config.patch(freezing=True):
                return compiled(*inputs)

        return run
    return _onnxruntime_float(twin, example, dynamic)


def _onnxruntime_float(twin: GraphModule, example: tuple, dynamic: bool) -> Any:
    import onnxruntime as ort

    from qviz.engine.graph.capture import dynamic_batch_shapes

    shapes = dynamic_batch_shapes(example) if dynamic else None
    program = torch.export.export(twin, example, dynamic_shapes=shapes)
    data = torch.onnx.export(program, example, dynamo=True, verbose=False).model_proto
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        data.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]

    def run(inputs: list[torch.Tensor]) -> Any:
        return session.run(None, {n: x.numpy() for n, x in zip(names, inputs, strict=True)})

    return run


def _median_interleaved(fns: list, inputs: list, repeats: int) -> list[float]:
    """Each function's median seconds over ``repeats`` rounds, one call of each per round (so
    load from other work hits them alike), after one warm-up call each."""
    for fn in fns:
        fn(inputs)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for slot, fn in zip(times, fns, strict=True):
            start = time.perf_counter()
            fn(inputs)
            slot.append(time.perf_counter() - start)
    return [sorted(t)[len(t) // 2] for t in times]


def compare_speed(lowered: Any, converted: GraphModule, batches: tuple[int, ...],
                  repeats: int) -> SpeedComparison:  # fmt: skip
    """Time ``lowered`` against ``converted``'s float twin on the same backend."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"compare_speed(repeats={repeats!r}): give an int >= 1")
    from qviz.engine.graph.fingerprint import check_same_model

    check_same_model(
        lowered.fingerprint, converted, "compare_speed(converted=...)", what="the lowered program"
    )
    from qviz.engine.graph.inputs import traced_example

    twin_example = traced_example(lowered._inputs_at(None), lowered.dynamic_batch)
    float_run = lower_float(lowered.backend, float_twin(converted), twin_example,
                            lowered.dynamic_batch)  # fmt: skip
    rows = []
    for batch in batches:
        inputs = list(lowered._inputs_at(batch))
        int8_s, float_s = _median_interleaved([lambda xs: lowered(*xs), float_run], inputs, repeats)
        rows.append(SpeedRow(batch, int8_s, float_s))
    return SpeedComparison(
        lowered.backend, FLOAT_PROGRAM[lowered.backend], lowered.machine.describe(), tuple(rows)
    )
