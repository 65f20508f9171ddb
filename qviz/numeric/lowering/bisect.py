"""Bisect a lowered model: its first diverging operator, without comparing every tensor.

:func:`compare_lowered` compares every quantized tensor at once; on a big model that is one
session output (onnxruntime) per tensor, and XNNPACK cannot show its tensors at all (a delegate
runs as one call). :func:`bisect_lowering` probes one tensor at a time instead, and only as many
as a bisection needs:

1. The candidates are the reference's activation quantize operators, in graph order (each one's
   integers are the tensor compared, in steps of its own grid, as in :func:`compare_lowered`).
2. The tensors nearest the model's outputs are probed first. None more than ``tolerance`` steps
   away: the lowered model agrees, and nothing else is probed.
3. Otherwise the search keeps the candidates among the departing tensor's ancestors and probes
   the one that splits them best. It departs: the first departure is among its ancestors or is
   itself. It agrees: the first departure is neither it nor any of its ancestors.
4. The tensor left is verified: each tensor it is computed from is probed (if it was not
   already) and must agree.

Worked example: a chain ``q0 -> q1 -> ... -> q9`` whose ``q6`` departs. ``q9`` (the output)
departs; ``q4`` splits ``q0..q8`` best and agrees; ``q6`` splits ``q5..q8`` and departs; ``q5``
agrees: ``q6`` is named after 4 probes of 10 tensors, and its input ``q5`` already agreed.

The assumption: a tensor more than ``tolerance`` steps away makes the tensors computed from it
depart too (it propagates). A departure that does not (a ReLU that zeroes it, a saturation that
hides it) can make an agreeing probe clear a departing ancestor. Step 4 catches that: when a
tensor the found one is computed from departs as well, the search starts again from it, and the
result says the assumption failed (``propagation_held`` False, ``note`` names both tensors), so
what it names is a departing tensor whose inputs agree, though maybe not the first in graph
order; :func:`compare_lowered` compares every tensor.

Each probe is exact, per backend: ``"onnxruntime"``, a session over the lowered ``.onnx``
(:attr:`LoweredModel.artifact`) with that one QuantizeLinear's output added as a graph output;
``"xnnpack"``, the program the lowered model was lowered from (:attr:`LoweredModel.program`), cut
at that quantize operator and lowered to XNNPACK again, so whatever is in that program is in
each cut (a few seconds per probe on a small model: one lowering each); ``"inductor"``, the
converted model cut at that quantize operator and compiled by the same Inductor lowering, so a
fault of the compiler (a pass, a kernel) is in each cut as it is in the whole program. The
tensor the model's one output dequantizes is read from the lowered model itself.

Example:
    >>> r = BisectionResult(probes=({"tensor": "q", "op": "linear", "role": "output",
    ...     "departed": False, "max_steps": 0, "share": 0.0, "elements": 8, "differing": 0},),
    ...     first_departure=None, candidates=5, backend="onnxruntime", method="session")
    >>> r.agrees, len(r.probes)
    (True, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from qviz.engine.graph.inputs import measured_batches
from qviz.engine.lower.records import DEFAULT_MAX_BATCH
from qviz.errors import ConfigError
from qviz.numeric.lowering.lowered import (
    _activation_quantizes,
    _bound_batches,
    _session_with_quantize_outputs,
    _tally,
    check_lowered,
    check_tolerance,
)

#: How each backend's probe shows one tensor of the lowered program.
PROBE_METHODS = {
    "onnxruntime": "onnxruntime session over the lowered .onnx with that one QuantizeLinear's "
    "output added as a graph output",
    "xnnpack": "the lowered program cut at that quantize operator and lowered to XNNPACK again "
    "(the model's output tensor: read from the lowered model itself)",
    "inductor": "the converted model cut at that quantize operator and compiled by Inductor "
    "again (the model's output tensor: read from the lowered model itself)",
}

_COLUMNS = ("tensor", "op", "role", "departed", "max_steps", "share")


@dataclass(frozen=True, kw_only=True)
class BisectionResult:
    """What a bisection of a lowered model probed, and the first departing tensor it found.

    Attributes:
        probes: one dict per probe, in the order made: ``tensor`` (the reference's quantize
            node), ``op`` (the node it quantizes), ``role`` (``"output"``, ``"bisect"`` or
            ``"verify"``), ``departed``, ``max_steps``, ``share`` (fraction of elements that
            differ), ``elements``, ``differing``.
        first_departure: the probe row of the departing tensor whose inputs agree, or None when
            the lowered model agrees (only the output tensors were probed).
        candidates: how many quantized tensors the reference has (what
            :func:`compare_lowered` would compare).
        backend: the lowered model's backend.
        method: how a probe shows one tensor on that backend.
        tolerance: steps a tensor may differ by before it departs.
        propagation_held: False when verification found a departure that did not propagate.
        note: what happened then ("" otherwise).

    Example:
        >>> row = {"tensor": "q3", "op": "conv", "role": "bisect", "departed": True,
        ...        "max_steps": 9, "share": 0.5, "elements": 8, "differing": 4}
        >>> r = BisectionResult(probes=(row,), first_departure=row, candidates=12,
        ...     backend="xnnpack", method="cut and lowered again")
        >>> r.agrees, r.first_departure["op"]
        (False, 'conv')
    """

    probes: tuple[dict[str, Any], ...]
    first_departure: dict[str, Any] | None
    candidates: int
    backend: str
    method: str
    tolerance: int = 1
    propagation_held: bool = True
    note: str = ""

    @property
    def agrees(self) -> bool:
        """Whether no output tensor departs (then nothing past the outputs was probed)."""
        return self.first_departure is None

    @property
    def df(self) -> Any:
        """The probes as a pandas DataFrame, in the order made."""
        import pandas as pd

        return pd.DataFrame(list(self.probes))

    def summary(self) -> str:
        """One line: what was found, and how many probes of how many tensors it took."""
        first = self.first_departure
        found = (
            f"agrees with the reference within {self.tolerance} step(s) at its output tensors"
            if first is None
            else f"first departure at {first['tensor']} ({first['op']}), {first['max_steps']} steps"
        )
        return (
            f"BisectionResult({self.backend}: {found}; {len(self.probes)} probes of "
            f"{self.candidates} tensors)" + (f" {self.note}" if self.note else "")
        )

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        from qviz.numeric.lowering.view import bisection_html

        return bisection_html(self)


def _bits(mask: int) -> Iterator[int]:
    """The indices set in ``mask``, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _ancestry(gm: GraphModule, order: list[Node]) -> tuple[list[int], list[int], int]:
    """Per candidate (as bit masks over ``order``): its candidate ancestors, the candidates it
    is computed from directly (no other candidate between), and those nearest the output."""
    index = {n: i for i, n in enumerate(order)}
    below: dict[Node, int] = {}
    near: dict[Node, int] = {}
    for node in gm.graph.nodes:
        a = b = 0
        for m in node.all_input_nodes:
            j = index.get(m)
            a |= below[m] if j is None else below[m] | 1 << j
            b |= near[m] if j is None else 1 << j
        below[node], near[node] = a, b
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return [below[n] for n in order], [near[n] for n in order], near[output]


def _split(pool: int, below: list[int]) -> int:
    """The candidate of ``pool`` whose answer leaves the fewest candidates either way."""
    size, best, cost = pool.bit_count(), -1, pool.bit_count() + 1
    for i in _bits(pool):
        ancestors = (below[i] & pool).bit_count()
        worst = max(ancestors, size - ancestors - 1)
        if worst < cost:
            best, cost = i, worst
    return best


def _search(
    start: int, below: list[int], near: list[int], departs: Callable[[int, str], bool]
) -> tuple[int, list[int]]:
    """Bisect the ancestors of departing candidate ``start``; the departing candidate whose
    direct inputs agree, and each input that departed at verification (propagation failed).

    Example:
        >>> below = [0, 0b1, 0b11, 0b111]  # a chain 0 -> 1 -> 2 -> 3; 2 and 3 depart
        >>> near = [0, 0b1, 0b10, 0b100]
        >>> _search(3, below, near, lambda i, role: i >= 2)
        (2, [])
    """
    top, pool, refuted = start, below[start], []
    while True:
        while pool:
            mid = _split(pool, below)
            if departs(mid, "bisect"):
                top, pool = mid, pool & below[mid]
            else:
                pool &= ~(below[mid] | 1 << mid)
        bad = next((i for i in _bits(near[top]) if departs(i, "verify")), None)
        if bad is None:
            return top, refuted
        refuted.append(bad)
        top, pool = bad, below[bad]


def _measure(
    converted: GraphModule, node: Node, run: Callable[[tuple], torch.Tensor], batches: list
) -> list[int]:
    """``[elements, differing, max steps]`` of one tensor: the reference's integers (the
    reference cut at ``node``: only what it is computed from runs) against what ``run``
    returns for it, over every batch."""
    total = [0, 0, 0]
    reference = _cut(converted, node)
    for args in batches:
        with torch.no_grad():
            (ours,) = reference(*args)
            theirs = run(args)
        if theirs.shape != ours.shape:
            raise ConfigError(
                f"bisect_lowering: the lowered program's tensor for {node.format_node()} has "
                f"shape {tuple(theirs.shape)}, the reference's {tuple(ours.shape)}; they do not "
                f"pair up: use compare_lowered, which compares the model outputs"
            )
        # an int8 grid may be stated as uint8 with zero point + 128 (the same values)
        shift = 128 if theirs.dtype == torch.uint8 and ours.dtype == torch.int8 else 0
        _tally(total, (theirs.to(torch.int64) - shift - ours.to(torch.int64)).abs())
    return total


def _onnx_probe(lowered: Any, order: list[Node], example: tuple) -> Any:
    """Probe factory: candidate index -> a run returning that QuantizeLinear's integers."""

    def probe(i: int) -> Callable[[tuple], torch.Tensor]:
        session, names = _session_with_quantize_outputs(lowered.artifact, only={i})
        if len(names) != len(order):
            raise ConfigError(
                f"bisect_lowering: the ONNX program has {len(names)} QuantizeLinear operators, "
                f"the converted model {len(order)} activation quantize operators; they do not "
                f"pair up: use compare_lowered, which compares the model outputs"
            )
        inputs = [x.name for x in session.get_inputs()]

        def run(args: tuple) -> torch.Tensor:
            feed = {n: a.detach().cpu().numpy() for n, a in zip(inputs, args, strict=True)}
            return torch.from_numpy(session.run([names[i]], feed)[0])

        return run

    return probe


def _cut(module: GraphModule, end: Node) -> GraphModule:
    """``module`` up to ``end``: its inputs, ``end`` and what ``end`` is computed from; it
    returns ``(end,)``. The nodes are copied as they are (constants and arguments included)."""
    keep, todo = set(), [end]
    while todo:
        node = todo.pop()
        if node not in keep:
            keep.add(node)
            todo.extend(node.all_input_nodes)
    graph, env = Graph(), {}
    for node in module.graph.nodes:
        if node.op == "placeholder" or node in keep:
            env[node] = graph.node_copy(node, env.__getitem__)
    graph.output((env[end],))
    return GraphModule(module, graph)


def _whole(lowered: Any, node: Node) -> Callable[[tuple], torch.Tensor] | None:
    """When the model's one output is ``dequantize(node)`` (per tensor), the lowered model is
    itself the cut at ``node``: its integers are ``round(y / scale) + zero_point`` of its output
    ``y``, with the reference's dequantize parameters (exact for 8-bit grids); else None."""
    output = next(n for n in reversed(node.graph.nodes) if n.op == "output")
    outs = output.args[0] if isinstance(output.args[0], tuple | list) else (output.args[0],)
    dq = outs[0] if len(outs) == 1 else None
    if not (
        isinstance(dq, Node)
        and dq.target == torch.ops.quantized_decomposed.dequantize_per_tensor.default
        and dq.args[0] is node
        and isinstance(dq.args[1], float)
        and isinstance(dq.args[2], int)
    ):
        return None
    scale, zero_point = dq.args[1], dq.args[2]

    def run(args: tuple) -> torch.Tensor:
        return torch.round(lowered(*args) / scale).to(torch.int64) + zero_point

    return run


def _xnnpack_probe(lowered: Any, order: list[Node], example: tuple) -> Any:
    """Probe factory: candidate index -> a run of the lowered program cut at that quantize."""
    from qviz.engine.graph.capture import dynamic_batch_shapes
    from qviz.engine.lower.xnnpack import lower_exported

    program = getattr(lowered, "program", None)
    if program is None:
        raise ConfigError(
            "bisect_lowering(xnnpack) lowers cuts of the program the lowered model was lowered "
            "from, and this one keeps none (LoweredModel.program is None): lower the converted "
            "model again with qviz.lower(..., backend='xnnpack')"
        )
    module = program.module()
    theirs = _activation_quantizes(module)
    if len(theirs) != len(order):
        raise ConfigError(
            f"bisect_lowering: the lowered program has {len(theirs)} activation quantize "
            f"operators, the converted model {len(order)}; they do not pair up: use "
            f"compare_lowered, which compares the model outputs"
        )
    if getattr(program, "example_inputs", None):  # what qviz.lower exported it with
        example = tuple(program.example_inputs[0])
    bound = lowered.max_batch or DEFAULT_MAX_BATCH  # as qviz.lower bounds the batch
    shapes = dynamic_batch_shapes(example, bound) if lowered.dynamic_batch else None

    def probe(i: int) -> Callable[[tuple], torch.Tensor]:
        whole = _whole(lowered, order[i])
        if whole is not None:
            return whole
        exported = torch.export.export(_cut(module, theirs[i]), example, dynamic_shapes=shapes)
        run, _, _ = lower_exported(exported)
        return lambda args: run([a.detach().cpu().contiguous() for a in args])[0]

    return probe


def _inductor_probe(lowered: Any, order: list[Node], example: tuple) -> Any:
    """Probe factory: candidate index -> the converted model cut at that quantize, compiled by
    the same Inductor lowering (oneDNN int8 kernels where the cut keeps their pattern)."""
    from qviz.engine.lower.inductor import lower_inductor

    module = order[0].graph.owning_module

    def probe(i: int) -> Callable[[tuple], torch.Tensor]:
        whole = _whole(lowered, order[i])
        if whole is not None:
            return whole
        run = lower_inductor(_cut(module, order[i]), example, lowered.dynamic_batch, None)[0]
        return lambda args: run(list(args))[0]

    return probe


_PROBES = {"onnxruntime": _onnx_probe, "xnnpack": _xnnpack_probe, "inductor": _inductor_probe}


def _check(converted: Any, lowered: Any, tolerance: Any) -> None:
    check_lowered(converted, lowered, "bisect_lowering")
    if lowered.backend not in _PROBES:
        raise ConfigError(
            f"bisect_lowering has no exact probe of one tensor for backend "
            f"{lowered.backend!r} (it probes {', '.join(map(repr, _PROBES))}): use "
            f"compare_lowered(converted, lowered, data), which compares the model outputs"
        )
    check_tolerance(tolerance, "bisect_lowering")


def _refuted_note(
    order: list[Node], rows: dict[int, dict], below: list[int], refuted: list[int]
) -> str:
    """Name each tensor that departed though a probed tensor computed from it agreed."""
    parts = []
    for bad in refuted:
        hid = next(i for i, r in rows.items() if not r["departed"] and below[i] >> bad & 1)
        parts.append(
            f"{order[bad].name} departs by {rows[bad]['max_steps']} steps, yet "
            f"{order[hid].name}, computed from it, agrees"
        )
    return (
        f"Propagation failed: {'; '.join(parts)}. The search went on from the departing "
        f"tensor; compare_lowered compares every tensor."
    )


def bisect_lowering(
    converted: GraphModule,
    lowered: Any,
    data: Any,
    *,
    tolerance: int = 1,
    max_batches: int | None = None,
) -> BisectionResult:
    """The first tensor where ``lowered`` departs from ``converted``, found by bisection.

    Assumes a departure of more than ``tolerance`` steps propagates to the tensors computed
    from it; the tensor found is verified (those it is computed from agree), and a departure
    that did not propagate is reported (``propagation_held``, ``note``). The module docstring
    has the search and each backend's probe.

    Args:
        converted: the model :func:`qviz.convert_pt2e` returned (the reference; not changed).
        lowered: ``qviz.lower(converted, ...)`` on ``"onnxruntime"`` or ``"xnnpack"``.
        data: batches, as for :func:`compare_lowered` (kept in memory: each probe runs all).
        tolerance: steps a tensor may differ by before it departs.
        max_batches: use at most this many batches.

    Returns:
        A :class:`BisectionResult`: ``.first_departure``, ``.probes`` / ``.df``, ``.agrees``.

    Raises:
        ConfigError: ``lowered`` is not a lowered model of ``converted``, its backend has no
            exact probe of one tensor, or its tensors do not pair up with the reference's.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> x = torch.randn(16, 4)
        >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
        ...     ).eval(), (x,))
        >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
        ...     get_symmetric_quantization_config()))
        >>> _ = qviz.calibrate(p, x, progress=False)
        >>> c = qviz.convert_pt2e(p)
        >>> result = bisect_lowering(c, qviz.lower(c, (x,), backend="onnxruntime"), x)
        >>> result.agrees, len(result.probes), result.candidates
        (True, 1, 3)
    """
    _check(converted, lowered, tolerance)
    order = _activation_quantizes(converted)
    data = measured_batches(data, "bisect_lowering", max_batches=max_batches)  # finite, some
    batches = list(_bound_batches(converted, data))
    if not order:
        raise ConfigError("bisect_lowering: there are no activation quantize operators to compare")
    below, near, outputs = _ancestry(converted, order)
    probe = _PROBES[lowered.backend](lowered, order, batches[0])
    probes = _Probes(converted, order, probe, batches, tolerance)
    start = next((i for i in _bits(outputs) if probes.departs(i, "output")), None)
    found, refuted = (None, []) if start is None else _search(start, below, near, probes.departs)
    rows, backend = probes.rows, lowered.backend
    return BisectionResult(
        probes=tuple(rows.values()),
        first_departure=None if found is None else rows[found],
        candidates=len(order),
        backend=backend,
        method=PROBE_METHODS[backend],
        tolerance=tolerance,
        propagation_held=not refuted,
        note=_refuted_note(order, rows, below, refuted) if refuted else "",
    )


class _Probes:
    """The probes made, by candidate index, in the order made; each tensor is probed once."""

    def __init__(
        self, converted: GraphModule, order: list[Node], probe: Any, batches: list, tolerance: int
    ) -> None:
        self.converted, self.order, self.probe = converted, order, probe
        self.batches, self.tolerance = batches, tolerance
        self.rows: dict[int, dict[str, Any]] = {}

    def departs(self, i: int, role: str) -> bool:
        """Whether candidate ``i`` is more than ``tolerance`` steps away (probed on first ask)."""
        if i not in self.rows:
            node = self.order[i]
            elements, differing, steps = _measure(self.converted, node, self.probe(i), self.batches)
            self.rows[i] = {"tensor": node.name, "op": _op_of(node), "role": role,
                            "departed": steps > self.tolerance, "max_steps": steps,
                            "share": differing / elements if elements else 0.0,
                            "elements": elements, "differing": differing}  # fmt: skip
        return self.rows[i]["departed"]


def _op_of(node: Node) -> str:
    return node.args[0].name if isinstance(node.args[0], Node) else ""
