"""In-place writes in an exported graph: which tensors a model updates as it runs.

A model that keeps state in a buffer (a cache, a running statistic) updates it with in-place
ops (``index_put_``, ``copy_``, ``add_``); ``torch.export`` records these buffers in
``buffers_to_mutate``. Quantization must leave that state alone: prepare does not observe the
destination of such a write (the values written into it are observed instead, and the result,
so the buffer shares their qparams), and convert never folds a written buffer into a constant.

Example:
    >>> import torch
    >>> class Cache(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.register_buffer("buf", torch.zeros(4))
    ...     def forward(self, x, idx):
    ...         return self.buf.index_put_((idx,), x).clone()
    >>> ex = (torch.ones(2), torch.tensor([1, 3]))
    >>> gm = torch.export.export(Cache(), ex, strict=True).module()
    >>> index_put = next(n for n in gm.graph.nodes if "index_put" in n.name)
    >>> is_written_buffer_edge(gm, index_put.args[0], index_put)
    True
    >>> sorted(n.name for n in written_attrs(gm))
    ['buf']
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.fx import Graph, GraphModule, Node

from qviz.engine.compat import OpOverload


def _returns_alias(node: Node) -> bool:
    """``node``'s result is its first argument's storage (a view, or an in-place op's result)."""
    if node.op != "call_function" or not isinstance(node.target, OpOverload):
        return False
    returns = node.target._schema.returns
    return bool(returns) and returns[0].alias_info is not None and bool(node.args)


def aliased_attr(node: Node) -> Node | None:
    """The ``get_attr`` whose storage ``node`` is (through views such as ``select``), or None."""
    while _returns_alias(node) and isinstance(node.args[0], Node):
        node = node.args[0]
    return node if node.op == "get_attr" else None


def _written_args(node: Node) -> list[Node]:
    """The arguments ``node`` writes in place (by its operator's schema)."""
    if node.op != "call_function" or not isinstance(node.target, OpOverload):
        return []
    out = []
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        if isinstance(value, Node):
            out.append(value)
    return out


def written_attrs(gm: GraphModule) -> set[Node]:
    """The ``get_attr`` nodes whose storage an in-place op writes (directly or through a view)."""
    written = set()
    for node in gm.graph.nodes:
        for arg in _written_args(node):
            attr = aliased_attr(arg)
            if attr is not None:
                written.add(attr)
    return written


def is_written_buffer_edge(gm: GraphModule, producer: Node, consumer: Node) -> bool:
    """``consumer`` writes in place into its first argument ``producer``, a buffer or a view
    of one (not a parameter, not a tensor computed from the inputs)."""
    if not consumer.args or consumer.args[0] is not producer:
        return False
    if producer not in _written_args(consumer):
        return False
    attr = aliased_attr(producer)
    return attr is not None and str(attr.target) in {name for name, _ in gm.named_buffers()}


def value_probe(gm: GraphModule, nodes: Sequence[Node]) -> GraphModule:
    """A graph module computing only what ``nodes`` need and returning a copy of each one's
    value, taken as it is computed: a later in-place op of the graph (ResNet's ``out += x``,
    ``relu_``) writes into the tensor a node returned, and would otherwise change the value
    read out.

    Example:
        >>> import torch
        >>> class Block(torch.nn.Module):
        ...     def forward(self, x):
        ...         y = x * 2
        ...         y += 1  # aten.add_ writes into mul's result
        ...         return y
        >>> gm = torch.export.export(Block(), (torch.ones(2),), strict=True).module()
        >>> mul = next(n for n in gm.graph.nodes if n.name == "mul")
        >>> value_probe(gm, [mul])(torch.ones(2))  # mul's value, before the add_
        (tensor([2., 2.]),)
    """
    graph, env = Graph(), {}
    wanted = set(nodes)
    copies: dict[Node, Node] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
        if node in wanted:
            copies[node] = graph.call_function(torch.ops.aten.clone.default, (env[node],))
    graph.output(tuple(copies[n] for n in nodes))
    probe = GraphModule(gm, graph)
    probe.graph.eliminate_dead_code()
    probe.recompile()
    return probe
