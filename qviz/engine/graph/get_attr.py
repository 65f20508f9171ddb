"""The constants (parameters, buffers, tensor constants) a graph's ``get_attr`` nodes read.

Example:
    >>> import torch
    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 3)))
    >>> get_attr_value(gm, "0.bias").shape
    torch.Size([3])
    >>> get_attr_value(gm, "0.missing", default=None) is None
    True
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.fx import Node

_REQUIRED = object()


def get_attr_value(module: nn.Module, target: str | Node, *, default: Any = _REQUIRED) -> Any:
    """The attribute at the dotted path ``target`` (or a ``get_attr`` node's target).

    Args:
        module: the graph module owning the attribute.
        target: ``"layer1.0.conv1.weight"``, or the ``get_attr`` node that reads it.
        default: returned when the path does not resolve; without it, AttributeError.
    """
    path = str(target.target) if isinstance(target, Node) else target
    owner, _, name = path.rpartition(".")
    try:
        return getattr(module.get_submodule(owner), name)
    except AttributeError:
        if default is _REQUIRED:
            raise
        return default


def set_constant(gm: nn.Module, target: str, value: torch.Tensor) -> None:
    """Replace the parameter or buffer at ``target`` (``"conv.weight"``) with ``value`` as a
    frozen parameter (no gradient), so every ``get_attr`` of it reads the new value.

    Example:
        >>> m = nn.Sequential(nn.Linear(2, 2))
        >>> set_constant(m, "0.bias", torch.zeros(2))
        >>> m[0].bias.tolist(), m[0].bias.requires_grad
        ([0.0, 0.0], False)
    """
    owner, _, name = target.rpartition(".")
    module = gm.get_submodule(owner)
    if name in module._parameters:
        del module._parameters[name]
    elif name in module._buffers:
        del module._buffers[name]
    module.register_parameter(name, nn.Parameter(value.detach(), requires_grad=False))


def register_new_buffer(module: nn.Module, prefix: str, value: Any) -> str:
    """Register tensor ``value`` as a buffer of ``module`` under the first free name
    ``prefix0``, ``prefix1``, ...; return that name.

    Example:
        >>> import torch
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> [register_new_buffer(gm, "_scale_", torch.ones(1)) for _ in range(2)]
        ['_scale_0', '_scale_1']
    """
    index = 0
    while hasattr(module, f"{prefix}{index}"):
        index += 1
    module.register_buffer(f"{prefix}{index}", value)
    return f"{prefix}{index}"


def drop_unread_constants(gm: Any) -> None:
    """Erase ``gm``'s unread ``get_attr`` nodes, then every parameter or buffer that no
    ``get_attr`` reads any more and no called submodule owns (a folded BatchNorm's statistics,
    float weights replaced by integer ones), so a state_dict holds what the graph computes with,
    as torchao's prepare and convert leave it.

    Example:
        >>> import torch, qviz
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)).eval()
        >>> gm = qviz.export(model, (torch.randn(1, 1, 5, 5),))
        >>> conv, bn = [n for n in gm.graph.nodes if n.op == "call_function"]
        >>> _ = bn.replace_all_uses_with(conv); gm.graph.erase_node(bn)
        >>> drop_unread_constants(gm)
        >>> sorted(gm.state_dict())
        ['0.bias', '0.weight']
    """
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and not node.users:
            gm.graph.erase_node(node)
    read = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    called = {str(n.target) for n in gm.graph.nodes if n.op == "call_module"}
    owners = read | called  # a loop body read whole, an observer called: their state stays
    named = [
        *gm.named_parameters(remove_duplicate=False),
        *gm.named_buffers(remove_duplicate=False),
    ]
    for name, _ in named:
        owner, _, attr = name.rpartition(".")
        if (
            name not in read
            and not _inside(name, owners)
            and hasattr(gm.get_submodule(owner), attr)
        ):
            delattr(gm.get_submodule(owner), attr)


def _inside(name: str, owners: set[str]) -> bool:
    """Whether dotted ``name`` lies inside one of ``owners`` (one of its proper prefixes is an
    owner): one set lookup per level, not one string test per owner."""
    parts = name.split(".")
    return any(".".join(parts[:i]) in owners for i in range(1, len(parts)))
