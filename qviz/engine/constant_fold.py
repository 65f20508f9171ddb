"""Quantized constants stored as integers: every quantize op on a constant is computed once.

A weight reaches its quantize op from a ``get_attr``, sometimes through ops that only depend on
constants (``weight.t()``, a ``permute``, a ``view``). Convert evaluates that whole chain and the
quantize op once and stores the integer result as a buffer ``_frozen_paramN``; the graph keeps
only the ``dequantize`` of it. The new ``get_attr`` takes the quantize node's metadata (which
carries the weight's, see :mod:`qviz.engine.port_metadata`). Ops that are not on the way to a
quantize op are left alone, and nothing random or in-place is ever evaluated.

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
from qviz.engine.constants import get_attr_value
from qviz.engine.mutation import written_attrs
from qviz.engine.qdq_ops import quantize_ops

__all__ = ["fold_quantized_constants"]


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


def _constant_value(gm: GraphModule, node: Node, memo: dict[Node, Any]) -> Any:
    """The value of ``node`` if it depends on constants only, else ``_NOT_CONSTANT``.

    ``memo`` is filled in advance with ``_NOT_CONSTANT`` for the buffers written in place
    (model state, which ``torch.export`` records in ``buffers_to_mutate``).
    """
    if node in memo:
        return memo[node]
    value: Any = _NOT_CONSTANT
    if node.op == "get_attr":
        value = get_attr_value(gm, node)
    elif _pure(node):
        inputs = [_constant_value(gm, n, memo) for n in node.all_input_nodes]
        if all(v is not _NOT_CONSTANT for v in inputs):
            env = dict(zip(node.all_input_nodes, inputs, strict=True))
            args = map_arg(node.args, lambda n: env[n])
            kwargs = map_arg(node.kwargs, lambda n: env[n])
            value = node.target(*args, **kwargs)
    memo[node] = value
    return value


_NOT_CONSTANT = object()


def _new_buffer(gm: GraphModule, value: torch.Tensor) -> str:
    index = 0
    while hasattr(gm, f"_frozen_param{index}"):
        index += 1
    gm.register_buffer(f"_frozen_param{index}", value)
    return f"_frozen_param{index}"


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
        ``gm``, with one ``_frozen_paramN`` buffer per folded quantize op.
    """
    memo: dict[Node, Any] = dict.fromkeys(written_attrs(gm), _NOT_CONSTANT)
    quantize = quantize_ops()
    for q in list(gm.graph.nodes):
        if q.op != "call_function" or q.target not in quantize:
            continue
        value = _constant_value(gm, q, memo)
        if not isinstance(value, torch.Tensor):
            continue
        with gm.graph.inserting_before(q):
            frozen = gm.graph.get_attr(_new_buffer(gm, value))
        frozen.meta.update(q.meta)
        inputs = q.all_input_nodes
        q.replace_all_uses_with(frozen)
        gm.graph.erase_node(q)
        _erase_dead(gm, inputs)
    gm.graph.lint()
    gm.recompile()
    return gm
