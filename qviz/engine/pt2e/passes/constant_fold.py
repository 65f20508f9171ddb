"""Quantized constants stored as integers: every quantize op on a constant is computed once.

A weight reaches its quantize op from a ``get_attr``, sometimes through ops that only depend on
constants (``weight.t()``, a ``permute``, a ``view``). Convert evaluates that whole chain and the
quantize op once and stores the integer result as a buffer ``_frozen_paramN``; the graph keeps
only the ``dequantize`` of it. The new ``get_attr`` takes the quantize node's metadata (which
carries the weight's, see :mod:`qviz.engine.pt2e.passes.port_metadata`). Ops that are not on the
way to a quantize op are left alone, and nothing random or in-place is ever evaluated.

Example:
    ``get_attr(weight) -> t -> quantize -> dequantize -> linear`` becomes
    ``get_attr(_frozen_param0) -> dequantize -> linear``.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from qviz.engine.compat import OpOverload, OpOverloadPacket
from qviz.engine.graph.get_attr import get_attr_value, register_new_buffer
from qviz.engine.graph.mutation import written_attrs
from qviz.engine.graph.qdq_ops import quantize_ops


def _pure(node: Node) -> bool:
    """``node`` computes a value from its arguments alone: no mutation, no randomness."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    target = node.target
    if isinstance(target, OpOverloadPacket):  # torchao's affine ops appear as packets
        target = getattr(target, "default", None)
    if not isinstance(target, OpOverload):
        return False
    return not target._schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags


def _constant_nodes(gm: GraphModule) -> set[Node]:
    """The nodes computed from constants only, in one pass in graph (topological) order.

    A ``get_attr`` is constant unless an in-place op writes its storage (model state, which
    ``torch.export`` records in ``buffers_to_mutate``); a pure op is constant when all its
    inputs are.
    """
    written = written_attrs(gm)
    constant: set[Node] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            if node not in written:
                constant.add(node)
        elif _pure(node) and all(n in constant for n in node.all_input_nodes):
            constant.add(node)
    return constant


def _evaluate(gm: GraphModule, node: Node, values: dict[Node, Any]) -> Any:
    """The value of constant ``node``, its constant ancestors evaluated first, each once across
    calls (``values`` keeps them)."""
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:  # depth first; a node is evaluated after its inputs (post-order)
        current, inputs_done = stack.pop()
        if current in values:
            continue
        if not inputs_done:
            stack.append((current, True))
            stack.extend((n, False) for n in current.all_input_nodes if n not in values)
        elif current.op == "get_attr":
            values[current] = get_attr_value(gm, current)
        else:
            args = map_arg(current.args, values.__getitem__)
            kwargs = map_arg(current.kwargs, values.__getitem__)
            values[current] = current.target(*args, **kwargs)
    return values[node]


def _erase_dead(gm: GraphModule, nodes: list[Node]) -> None:
    """Erase the pure nodes of ``nodes`` (and what only they read) that nothing reads any more."""
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if node.graph is not gm.graph or node.users or not (_pure(node) or node.op == "get_attr"):
            continue
        inputs = node.all_input_nodes
        gm.graph.erase_node(node)
        pending.extend(inputs)


def fold_quantized_constants(gm: GraphModule) -> GraphModule:
    """Replace every quantize op on a constant by the stored integer tensor (in place).

    Returns:
        ``gm``, with one ``_frozen_paramN`` buffer per folded quantize op, its graph linted
        (recompile it before running it, as convert does once).
    """
    constant = _constant_nodes(gm)
    values: dict[Node, Any] = {}
    quantize = quantize_ops()
    for q in list(gm.graph.nodes):
        if q.op != "call_function" or q.target not in quantize or q not in constant:
            continue
        value = _evaluate(gm, q, values)
        if not isinstance(value, torch.Tensor):
            continue
        with gm.graph.inserting_before(q):
            frozen = gm.graph.get_attr(register_new_buffer(gm, "_frozen_param", value))
        frozen.meta.update(q.meta)
        inputs = q.all_input_nodes
        q.replace_all_uses_with(frozen)
        gm.graph.erase_node(q)
        _erase_dead(gm, inputs)
    gm.graph.lint()
    return gm
