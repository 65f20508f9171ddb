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
