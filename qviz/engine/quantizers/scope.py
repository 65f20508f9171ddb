"""Which nodes a quantizer setting applies to: by module name, module type or operator.

torch.export records, for every operator node, the stack of modules that called it
(``node.meta["nn_module_stack"]``: fully qualified name and class of each). A module-name or
module-type setting covers the nodes whose stack contains that module; an operator setting covers
the nodes of that ATen operator. Parameters (``get_attr`` nodes) carry no module stack, so only
operator nodes (``call_function``) are checked against a scope.

Example:
    >>> import torch
    >>> from torch import nn
    >>> gm = torch.export.export(nn.Sequential(nn.Linear(2, 2)).eval(),
    ...                          (torch.randn(1, 2),)).module()
    >>> linear = next(n for n in gm.graph.nodes if n.op == "call_function")
    >>> module_names(linear), in_module_type(linear, nn.Linear)
    (['', '0'], True)
    >>> resolve_operator(torch.nn.functional.linear)
    (<OpOverloadPacket(op='aten.linear')>,)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from qviz.engine.compat import OpOverload, OpOverloadPacket
from qviz.engine.graph.module_stack import (
    module_names,
    module_type_names,
    qualified_name,
)
from qviz.errors import ConfigError, closest_names

#: An ATen operator: one overload (``aten.add.Tensor``) or all of them (``aten.add``).
AtenOp = OpOverload | OpOverloadPacket
#: What set_operator_type accepts: an ATen operator, or a torch function or method.
OperatorLike = AtenOp | Callable

aten = torch.ops.aten
# Python functions whose ATen operator in an exported graph has another name.
_RENAMED: dict[Callable, tuple[OpOverloadPacket, ...]] = {
    F.relu6: (aten.hardtanh, aten.hardtanh_),
    F.softmax: (aten.softmax, aten._softmax),
    operator.getitem: (aten.slice, aten.select),
    torch.Tensor.__getitem__: (aten.slice, aten.select),
    operator.iadd: (aten.add_,),
    operator.imul: (aten.mul_,),
}


def check_module_names(model: GraphModule, names: Iterable[str], setter: str) -> None:
    """Raise if a module name matches no module that calls an operator of ``model``.

    A setting for a module the graph does not have would silently apply to nothing: it is a
    typo (``"featurez"`` for ``"features"``), or a module whose calls left no operator.

    Example:
        >>> import collections, torch
        >>> from torch import nn
        >>> model = nn.Sequential(collections.OrderedDict(features=nn.Linear(2, 2)))
        >>> gm = torch.export.export(model.eval(), (torch.randn(1, 2),)).module()
        >>> check_module_names(gm, ["features"], "set_module_name")
        >>> check_module_names(gm, ["featurez"], "set_module_name")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: set_module_name('featurez', ...): no module of that name ... \
(closest: ['features']); give a name as model.named_modules() spells it (e.g. 'layer1.0.conv1')
    """
    known = {name for node in model.graph.nodes for name in module_names(node)}
    for name in names:
        if name not in known:
            raise ConfigError(
                f"{setter}({name!r}, ...): no module of that name calls an operator of this graph "
                f"({closest_names(name, known - {''})}); give a name as model.named_modules() "
                f"spells it (e.g. 'layer1.0.conv1')"
            )


def in_module_name(node: Node, name: str) -> bool:
    """Whether ``node`` was called inside the module named ``name`` (e.g. ``"layer1.0"``).

    Example:
        >>> import torch
        >>> in_module_name(torch.fx.Graph().placeholder("x"), "conv")
        False
    """
    return name in module_names(node)


def in_module_type(node: Node, module_type: type) -> bool:
    """Whether ``node`` was called inside a module of class ``module_type``.

    Example:
        >>> import torch
        >>> in_module_type(torch.fx.Graph().placeholder("x"), torch.nn.Conv2d)
        False
    """
    return qualified_name(module_type) in module_type_names(node)


def resolve_operator(op: OperatorLike) -> tuple[AtenOp, ...]:
    """The ATen operators (overloads or packets) that ``op`` becomes in an exported graph.

    Args:
        op: an ATen overload (``torch.ops.aten.conv2d.default``: that overload only), an ATen
            packet (``torch.ops.aten.add``: every overload), or a torch function or method
            (``F.conv2d``, ``torch.add``, ``torch.Tensor.view``: the ATen packet of that name).

    Raises:
        ConfigError: ``op`` is not an operator, or no ATen operator has its name.

    Example:
        >>> resolve_operator(torch.ops.aten.add.Tensor)
        (<OpOverload(op='aten.add', overload='Tensor')>,)
    """
    if isinstance(op, AtenOp):
        return (op,)
    if op in _RENAMED:
        return _RENAMED[op]
    name = getattr(op, "__name__", None)
    if not callable(op) or isinstance(op, type) or not name:
        raise ConfigError(
            f"set_operator_type: {op!r} is not an operator; pass a torch function (F.conv2d, "
            f"torch.add) or an ATen operator (torch.ops.aten.conv2d.default); module classes go "
            f"to set_module_type"
        )
    packet = getattr(aten, name.lstrip("_"), None)
    if not isinstance(packet, OpOverloadPacket):
        raise ConfigError(
            f"set_operator_type: no ATen operator is named after {name!r}; pass the ATen operator "
            f"it exports to (e.g. torch.ops.aten.{name.lstrip('_')}.default, as printed by "
            f"gm.graph.print_tabular())"
        )
    return (packet,)


def operator_matches(node: Node, ops: Iterable[AtenOp]) -> bool:
    """Whether ``node`` calls one of ``ops`` (an overload exactly, a packet by any overload).

    Example:
        >>> import torch
        >>> operator_matches(torch.fx.Graph().placeholder("x"), [torch.ops.aten.add])
        False
    """
    if node.op != "call_function":
        return False
    packet = getattr(node.target, "overloadpacket", None)
    return any(node.target == op or (packet is not None and packet == op) for op in ops)


def _always(node: Node) -> bool:
    return True


@dataclass(frozen=True)
class Scope:
    """Where one annotation pass may claim patterns.

    Attributes:
        region: every operator node of a pattern must satisfy it (e.g. "inside module conv1").
        anchor: the pattern's main operator (the conv of conv-relu) must satisfy it.

    Example:
        >>> import torch
        >>> x = torch.fx.Graph().placeholder("x")
        >>> Scope(region=lambda n: False).accepts(x, [x])   # placeholders are not checked
        True
    """

    region: Callable[[Node], bool] = _always
    anchor: Callable[[Node], bool] = _always

    def accepts(self, anchor: Node, nodes: Iterable[Node | None]) -> bool:
        """Whether the pattern ``nodes`` with main operator ``anchor`` lies in this scope.

        Example:
            >>> import torch
            >>> g = torch.fx.Graph()
            >>> relu = g.call_function(torch.relu, (g.placeholder("x"),))
            >>> Scope(anchor=lambda n: False).accepts(relu, [relu])
            False
        """
        if anchor.op == "call_function" and not self.anchor(anchor):
            return False
        return all(
            self.region(node) for node in nodes if node is not None and node.op == "call_function"
        )
