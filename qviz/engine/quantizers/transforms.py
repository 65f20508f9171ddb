"""Graph rewrites a quantizer applies before annotating.

:func:`scalars_to_tensors` turns the Python scalar operand of ``add`` / ``mul`` (``x + 1``,
``x * 0.5``) into a 0-d float tensor constant (a ``get_attr`` node named ``_tensor_constant_N``),
so the operand can be observed and quantized like any other input, as torchao's XNNPACKQuantizer
does.

Example:
    >>> import torch
    >>> class Half(torch.nn.Module):
    ...     def forward(self, x):
    ...         return x * 0.5
    >>> gm = torch.export.export(Half(), (torch.randn(2),)).module()
    >>> gm = scalars_to_tensors(gm)
    >>> mul = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.mul.Tensor)
    >>> [a.name for a in mul.args], gm._tensor_constant_0
    (['x', '_tensor_constant_0'], tensor(0.5000))
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

aten = torch.ops.aten
_SCALAR_OPERAND_OPS = (aten.add.Tensor, aten.mul.Tensor)
_PREFIX = "_tensor_constant_"


def _free_name(gm: GraphModule) -> str:
    index = 0
    while hasattr(gm, f"{_PREFIX}{index}"):
        index += 1
    return f"{_PREFIX}{index}"


def _example_value(node: Node, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in the fake mode of ``node``'s example value (the tensor itself without one)."""
    fake_mode = getattr(node.meta.get("val"), "fake_mode", None)
    return fake_mode.from_tensor(tensor, static_shapes=True) if fake_mode is not None else tensor


def _constant_node(gm: GraphModule, user: Node, value: float) -> Node:
    name = _free_name(gm)
    tensor = torch.tensor(float(value))
    gm.register_buffer(name, tensor)
    with gm.graph.inserting_before(user):
        node = gm.graph.create_node("get_attr", name, (), {})
    node.meta["val"] = _example_value(user, tensor)
    return node


def scalars_to_tensors(gm: GraphModule) -> GraphModule:
    """Replace the scalar operands of float ``add`` / ``mul`` nodes with tensor constants.

    Integer arithmetic is left alone (a float constant would change its result dtype).

    Args:
        gm: the exported graph module; changed in place.

    Returns:
        ``gm``, recompiled.

    Example:
        >>> import torch
        >>> gm = torch.export.export(torch.nn.ReLU(), (torch.randn(2),)).module()
        >>> scalars_to_tensors(gm) is gm
        True
    """
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SCALAR_OPERAND_OPS:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not val.is_floating_point():
            continue
        if all(isinstance(arg, Node) for arg in node.args):
            continue
        node.args = tuple(
            arg if isinstance(arg, Node) else _constant_node(gm, node, arg) for arg in node.args
        )
        changed = True
    if changed:  # the code only when the graph changed
        gm.recompile()
    return gm
