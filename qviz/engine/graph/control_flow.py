"""The subgraphs of control-flow operators, which prepare and convert quantize like the graph.

``torch.export`` keeps a loop as one higher-order operator whose body is a graph module of its
own: ``torch.ops.higher_order.scan(combine_fn, init, xs, additional_inputs)`` and
``torch.ops.higher_order.while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)``. The
operators inside the body run once per step; prepare annotates and observes them with the same
quantizer (the body gets its own observers and its own ``.plan``), calibration reaches them
whenever the loop runs, and convert turns them into q/dq ops, as the reference does. A loop's
condition (``cond_fn``) decides when to stop and is left in float.

Example:
    >>> import torch
    >>> from torch._higher_order_ops.scan import scan
    >>> class Cumulative(torch.nn.Module):
    ...     def forward(self, xs):
    ...         return scan(lambda c, x: (c + x, c + x), init=xs[0], xs=xs, dim=0)[1]
    >>> gm = torch.export.export(Cumulative(), (torch.randn(3, 2),)).module()
    >>> [(node.name, target) for node, target in loop_bodies(gm)]
    [('scan', 'scan_combine_graph_0')]
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.fx import GraphModule, Node

#: For each control-flow operator, the argument that holds the body it runs per step.
_BODY_ARGUMENT = {"scan": 0, "while_loop": 1}


def loop_bodies(gm: GraphModule) -> Iterator[tuple[Node, str]]:
    """``(operator node, body submodule path)`` for every scan and while_loop of ``gm``."""
    for name, index in _BODY_ARGUMENT.items():
        op = getattr(torch.ops.higher_order, name, None)
        if op is None:
            continue
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is op:
                body = node.args[index]
                if isinstance(body, Node) and body.op == "get_attr":
                    yield node, str(body.target)


def replace_submodule(gm: GraphModule, path: str, module: torch.nn.Module) -> None:
    """Put ``module`` at the dotted ``path`` of ``gm``."""
    owner, _, name = path.rpartition(".")
    setattr(gm.get_submodule(owner), name, module)
