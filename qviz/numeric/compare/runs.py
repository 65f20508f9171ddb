"""The two runs a comparison makes over one batch (:func:`qviz.numeric.compare.compare`):
the float model with a copy of each wanted operator's output kept (:class:`FloatRun`), and the
quantized model measured row by row as its operators execute (:class:`QuantRun`: cumulative
error at each probe, local error by replaying each operator on the float inputs). A per-tensor
quantize / dequantize pair runs as one exact
:func:`~qviz.engine.pt2e.simulation.fake_quantize` in both the run and the replays.

Example:
    >>> import torch, qviz
    >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 4)).eval(), (torch.randn(2, 4),))
    >>> changes_values(gm), sorted(len(ops) > 0 for ops in qdq_ops())
    (False, [True, True])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node
from torch.fx.node import map_arg

from qviz.engine.compat import OpOverload
from qviz.engine.graph.debug_handles import float_handle
from qviz.engine.graph.qdq_ops import dequantize_ops, quantize_ops
from qviz.engine.pt2e.simulation import fake_quantize, fusable
from qviz.numeric.measure.slices import SliceStats
from qviz.numeric.measure.streaming import GridStats, PairStats


def qdq_ops() -> tuple[set[Any], set[Any]]:
    """The quantize ops and the dequantize ops of converted graphs
    (:mod:`qviz.engine.graph.qdq_ops`)."""
    return set(quantize_ops()), set(dequantize_ops())


@dataclass(kw_only=True)
class Row:
    """What is measured for one operator of the quantized model."""

    node: Node
    ref: int  # the float handle compared with
    probe: Node  # the node whose value the next operator sees
    grid_q: Node | None  # the output's quantize op (per tensor), if any
    cumulative: PairStats = field(default_factory=PairStats)
    local: PairStats | None = field(default_factory=PairStats)
    grid: GridStats | None = None
    weight_sqnr: float = math.nan
    slices: SliceStats = field(default_factory=SliceStats)  # of the local comparison


class FloatRun(Interpreter):
    """Runs the float model, keeping a copy of each wanted operator's output."""

    def __init__(
        self, gm: GraphModule, handles: dict[Node, int], wanted: set[int], copy: bool = True
    ) -> None:
        super().__init__(gm)
        self.handles, self.wanted, self.copy = handles, wanted, copy
        self.outputs: dict[int, torch.Tensor] = {}

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        h = self.handles.get(n)
        if h in self.wanted and isinstance(result, torch.Tensor):
            self.outputs[h] = result.detach().clone() if self.copy else result.detach()
        return result


def changes_values(gm: GraphModule) -> bool:
    """Whether running ``gm`` may change a value after it was made: an operator that writes
    into an input (``relu_``, ``add_``: its schema is mutable), a module or method call, or
    a Python function other than ``operator``'s (unknown: assumed to). An exported functional
    graph has none, so the outputs compare keeps need no copy.

    Example:
        >>> import torch, qviz
        >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval(),
        ...                  (torch.randn(2, 4),))
        >>> changes_values(gm)
        False
    """
    for n in gm.graph.nodes:
        if n.op == "call_module" and n.target == "_guards_fn":  # export's input-shape guards
            continue
        if n.op in ("call_module", "call_method"):
            return True
        if n.op != "call_function":
            continue
        schema = getattr(n.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            return True
        if schema is None and not _operator_function(n.target):
            return True
    return False


def _operator_function(target: Any) -> bool:
    """A function of Python's ``operator`` module that makes a new value (``getitem``, ``mul``
    on sizes), not an in-place one (``iadd``)."""
    name = getattr(target, "__name__", "")
    return getattr(target, "__module__", None) == "_operator" and not name.startswith("i")


class QuantRun(Interpreter):
    """Runs the quantized model and measures every row as its operator and probe execute."""

    def __init__(
        self, gm: GraphModule, rows: list[Row], floats: dict[int, torch.Tensor],
        fused: set[Node] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(gm)
        self.floats = floats
        self.by_node = {r.node: r for r in rows}
        self.by_probe: dict[Node, list[Row]] = {}
        for r in rows:
            self.by_probe.setdefault(r.probe, []).append(r)
        self.quantize_ops, self.dequantize_ops = qdq_ops()
        #: quantize nodes computed with their dequantizes as one exact fake_quantize
        self.fused = fusable_quantizes(gm) if fused is None else fused

    def run_node(self, n: Node) -> Any:
        row = self.by_node.get(n)
        if row is not None and row.local is not None:
            self._local(row)
        if n in self.fused:  # its value: the dequantized one, which its dequantizes return
            result = fake_quantize(self.env[n.args[0]], *n.args[1:])
        elif n.op == "call_function" and n.args and n.args[0] in self.fused:
            value = self.env[n.args[0]]  # a dequantize of a fused quantize
            result = value if len(n.args[0].users) == 1 else value.clone()
        else:
            result = super().run_node(n)
        for r in self.by_probe.get(n, ()):
            ref = self.floats.get(r.ref)
            if ref is not None and isinstance(result, torch.Tensor):
                r.cumulative.update(ref, result)
                if r.grid is not None:
                    r.grid.update(ref)
        return result

    # -- local error ----------------------------------------------------------------------
    def _value(self, arg: Node) -> Any:
        if arg.op == "get_attr":
            return self.fetch_attr(str(arg.target))
        if arg in self.env:
            return self.env[arg]
        raise LookupError(arg.name)

    def _replay(self, chain: list[Node], value: torch.Tensor) -> torch.Tensor:
        """``chain`` (nearest last) applied to ``value``; a fused quantize and its dequantize
        as one exact fake_quantize."""
        steps = list(reversed(chain))
        for i, q in enumerate(steps):
            if i and steps[i - 1] in self.fused:
                continue  # the dequantize of the step before, computed with it
            if q in self.fused and i + 1 < len(steps):
                value = fake_quantize(value, *q.args[1:])
                continue
            rest = map_arg(q.args[1:], self._value)
            value = q.target(value, *rest, **map_arg(q.kwargs, self._value))
        return value

    def _local_input(self, arg: Node, mutable: bool) -> Any:
        chain, src = [], arg
        while src.op == "call_function" and src.target in self.quantize_ops | self.dequantize_ops:
            chain.append(src)
            src = src.args[0]
        ref = float_handle(src) if src.op == "call_function" else None
        base = self.floats.get(ref) if ref is not None else None
        if base is None:  # a weight, a model input, or an operator without a float twin
            value = self.env[arg]
            return value.clone() if mutable and isinstance(value, torch.Tensor) else value
        return self._replay(chain, base.clone() if mutable or not chain else base)

    def _local(self, row: Row) -> None:
        n = row.node
        ref = self.floats.get(row.ref)
        if ref is None:
            return
        mutable = isinstance(n.target, OpOverload) and n.target._schema.is_mutable
        try:
            args = map_arg(n.args, lambda a: self._local_input(a, mutable))
            kwargs = map_arg(n.kwargs, lambda a: self._local_input(a, mutable))
            out = n.target(*args, **kwargs)
            if row.probe is not n:
                out = self._replay(_chain_to(row.probe, n), out)
        except LookupError:  # a value this operator needs is gone: no local figure
            row.local = None
            return
        row.local.update(ref, out)
        if isinstance(out, torch.Tensor):
            row.slices.update(ref, out)


def fusable_quantizes(gm: GraphModule) -> set[Node]:
    """The quantize nodes of ``gm`` that compare computes together with their dequantizes as
    one :func:`~qviz.engine.pt2e.simulation.fake_quantize` (the same values, bit for bit)."""
    return {n for n in gm.graph.nodes if fusable(n)}


def _chain_to(probe: Node, start: Node) -> list[Node]:
    """The q/dq nodes from ``start`` (excluded) to ``probe`` (included), nearest last."""
    chain, node = [], probe
    while node is not start:
        chain.append(node)
        node = node.args[0]
    return chain


def output_probe(
    n: Node, quantize_ops: set[Any] | None = None, dequantize_ops: set[Any] | None = None
) -> tuple[Node, Node | None]:
    """The node after ``n``'s output quantize/dequantize (``n`` itself if none), and the q op:
    the value the next operator sees, where the cumulative error is measured."""
    if quantize_ops is None or dequantize_ops is None:
        quantize_ops, dequantize_ops = qdq_ops()
    q = next((u for u in n.users if u.target in quantize_ops), None)
    if q is None:
        return n, None
    dq = next((u for u in q.users if u.target in dequantize_ops), None)
    return (dq, q) if dq is not None else (n, None)
