"""Find operator patterns (conv → batch_norm → relu, add → relu, ...) in an exported graph.

Multi-operator patterns are found with torch.fx's ``SubgraphMatcher`` (the matcher behind
``SubgraphMatcherWithNameNodeMap``): each pattern is a tiny ATen graph, built here node by node,
whose placeholders are wildcards. The matcher only reports a pattern when its inner nodes feed
nothing outside it (a conv whose output also goes elsewhere cannot fuse with its relu) and,
with ``ignore_literals``, whatever the strides, paddings or eps. Each match comes back as a
:class:`PatternMatch`, a role → node map (``"input"``, ``"weight"``, ``"bias"``, ``"op"``,
``"bn"``, ``"bn_item"``, ``"output"``).

``get_source_partitions`` (the other utility the PT2E tutorial suggests) is not used: it reads
``source_fn_stack``, which non-strict ``torch.export`` (the default) no longer records, and its
fallback groups separate calls of one function together. Single operators are found by their
ATen overload instead.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()).eval()
    >>> gm = torch.export.export(model, (torch.randn(1, 1, 5, 5),)).module()
    >>> [m.roles["output"].name for m in find_chains(gm.graph, CONV_ACT_OPS, [RELU_OPS])]
    ['relu']
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.fx import Graph, Node
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

aten = torch.ops.aten
#: Convolutions annotated alone (conv1d / conv2d, also with padding="same").
CONV_OPS = (aten.conv1d.default, aten.conv2d.default, aten.conv1d.padding, aten.conv2d.padding)
#: Convolutions fused with a following relu.
CONV_ACT_OPS = (
    aten.conv1d.default,
    aten.conv1d.padding,
    aten.conv2d.default,
    aten.conv2d.padding,
    aten.conv3d.default,
    aten.conv3d.padding,
)
#: Convolutions fused with a following batch norm (as the reference's conv-bn patterns).
CONV_BN_OPS = (aten.conv1d.default, aten.conv2d.default)
#: Transposed convolutions fused with a following batch norm.
CONV_TRANSPOSE_BN_OPS = (aten.conv_transpose1d.default, aten.conv_transpose2d.input)
CONV_TRANSPOSE_OPS = (
    aten.conv_transpose1d.default,
    aten.conv_transpose2d.input,
    aten.conv_transpose3d.input,
)
LINEAR_OPS = (aten.linear.default,)
RELU_OPS = (aten.relu.default, aten.relu_.default)
ADD_OPS = (aten.add.Tensor, aten.add_.Tensor)
MUL_OPS = (aten.mul.Tensor, aten.mul_.Tensor)
#: Inference batch norm: one output, or a tuple read with getitem (older captures).
BN_OPS = (aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default)

_BN_PARAMS = ("bn_weight", "bn_bias", "bn_mean", "bn_var")


@dataclass(frozen=True)
class PatternMatch:
    """One occurrence of a pattern: its nodes by role (``None`` for an absent optional input).

    Example:
        >>> PatternMatch({"op": None}).roles
        {'op': None}
    """

    roles: Mapping[str, Node | None]

    def nodes(self) -> list[Node]:
        """The matched operator and parameter nodes (no duplicates, no None).

        Example:
            >>> PatternMatch({"op": None}).nodes()
            []
        """
        out: list[Node] = []
        for node in self.roles.values():
            if isinstance(node, Node) and node not in out:
                out.append(node)
        return out


def nodes_calling(graph: Graph, ops: Iterable[object]) -> list[Node]:
    """The ``call_function`` nodes of ``graph`` whose target is one of ``ops``, in graph order.

    Example:
        >>> nodes_calling(torch.fx.Graph(), RELU_OPS)
        []
    """
    wanted = set(ops)
    return [n for n in graph.nodes if n.op == "call_function" and n.target in wanted]


def _follow(graph: Graph, node: Node, op: object, roles: dict[str, Node]) -> Node:
    """Append ``op`` applied to ``node`` to a pattern graph."""
    if op in BN_OPS:
        params = [graph.placeholder(name) for name in _BN_PARAMS]
        literals = (False, 0.1, 1e-5, True) if op == aten.batch_norm.default else (0.1, 1e-5)
        roles["bn"] = graph.call_function(op, (node, *params, *literals))
        return roles["bn"]
    if op is operator.getitem:
        roles["bn_item"] = graph.call_function(operator.getitem, (node, 0))
        return roles["bn_item"]
    return graph.call_function(op, (node,))


@functools.cache
def _pattern(head: object, head_roles: tuple[str, ...], tail: tuple[object, ...]):
    """A pattern graph ``tail[-1](...tail[0](head(*head_roles)))`` and its role → node map."""
    graph = Graph()
    roles: dict[str, Node] = {}
    for role in head_roles:
        if role not in roles:
            roles[role] = graph.placeholder(role)
    node = graph.call_function(head, tuple(roles[r] for r in head_roles))
    roles["op"] = node
    for op in tail:
        node = _follow(graph, node, op, roles)
    roles["output"] = node
    graph.output(node)
    return graph, roles


def _expand(tail: Sequence[Sequence[object]]) -> Iterable[tuple[object, ...]]:
    """Every concrete tail: one op from each alternative set; bn with a tuple output + getitem."""
    for combo in itertools.product(*tail):
        out: list[object] = []
        for op in combo:
            out.append(op)
            if op == aten._native_batch_norm_legit_no_training.default:
                out.append(operator.getitem)
        yield tuple(out)


def _valid(match: PatternMatch) -> bool:
    output = match.roles["output"]
    return not (output is not None and output.target is operator.getitem and output.args[1] != 0)


def find_chains(
    graph: Graph,
    heads: Iterable[object],
    tail: Sequence[Sequence[object]],
    head_roles: Sequence[tuple[str, ...]] = (("input", "weight", "bias"),),
) -> list[PatternMatch]:
    """Matches of ``head → tail[0] → tail[1] ...``, ordered by their output node.

    Args:
        graph: the graph to search.
        heads: the operators that may start the chain (e.g. the conv overloads).
        tail: for each following step, the operators that may fill it (e.g. ``[RELU_OPS]``).
        head_roles: the head's inputs by role; a repeated role means the same node (``add(x, x)``).

    Example:
        >>> find_chains(torch.fx.Graph(), ADD_OPS, [RELU_OPS], [("input", "other")])
        []
    """
    present = {n.target for n in graph.nodes if n.op == "call_function"}
    order = {node: index for index, node in enumerate(graph.nodes)}
    found: dict[Node, PatternMatch] = {}
    for head, concrete, roles_in in itertools.product(heads, list(_expand(tail)), head_roles):
        if head not in present or not all(op in present for op in concrete):
            continue
        pattern, roles = _pattern(head, tuple(roles_in), concrete)
        matcher = SubgraphMatcher(pattern, ignore_literals=True)
        for internal in matcher.match(graph):
            named = {role: internal.nodes_map.get(node) for role, node in roles.items()}
            match = PatternMatch(named)
            if _valid(match):
                found.setdefault(match.roles["output"], match)
    return [found[node] for node in sorted(found, key=order.__getitem__)]
