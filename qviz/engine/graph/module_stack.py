"""Which modules called a node: the ``nn_module_stack`` that torch.export records, read as names.

Quantizer scopes (``set_module_name``, ``set_module_type``) and the BatchNorm fold read the same
facts here.

Example:
    >>> import torch
    >>> gm = torch.export.export(torch.nn.Sequential(torch.nn.ReLU()), (torch.randn(2),)).module()
    >>> relu = next(n for n in gm.graph.nodes if n.op == "call_function")
    >>> module_names(relu), module_type_names(relu)
    (['', '0'], ['torch.nn.modules.container.Sequential', 'torch.nn.modules.activation.ReLU'])
"""

from __future__ import annotations

from torch.fx import Node


def _strip_self(path: str) -> str:
    prefix = "L['self']."
    return path[len(prefix) :] if path.startswith(prefix) else path


def module_names(node: Node) -> list[str]:
    """Fully qualified names of the modules that called ``node``, outermost first.

    Example:
        >>> import torch
        >>> module_names(torch.fx.Graph().placeholder("x"))
        []
    """
    stack = node.meta.get("nn_module_stack") or {}
    return [_strip_self(str(path)) for path, _ in stack.values()]


def module_type_names(node: Node) -> list[str]:
    """``module.qualname`` of the classes of the modules that called ``node``, outermost first.

    Example:
        >>> import torch
        >>> module_type_names(torch.fx.Graph().placeholder("x"))
        []
    """
    stack = node.meta.get("nn_module_stack") or {}
    out = []
    for _, cls in stack.values():
        out.append(qualified_name(cls) if isinstance(cls, type) else str(cls))
    return out


def qualified_name(module_type: type) -> str:
    """``module.qualname`` of a class, as ``nn_module_stack`` records it.

    Example:
        >>> import torch
        >>> qualified_name(torch.nn.Conv2d)
        'torch.nn.modules.conv.Conv2d'
    """
    return f"{module_type.__module__}.{module_type.__qualname__}"
