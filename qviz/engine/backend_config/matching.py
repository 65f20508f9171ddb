"""Where a backend's patterns occur in an exported graph: module calls and functions, chained.

torch.export records which module called each ATen operator (``nn_module_stack``). A *unit* is
one call the pattern language can name: the operators one ``torch.nn`` layer emitted (an
``nn.Linear`` call, an ``nn.ReLU`` call), or one operator called as a function (``torch.add``,
``F.relu`` in a ``forward``). A pattern element matches a unit by module class, or by function
(through the ATen operator it exports to, :func:`qviz.engine.quantizers.scope.resolve_operator`);
a fused tuple ``(nn.Conv2d, nn.BatchNorm2d, nn.ReLU)`` matches a chain of units where each
unit's output feeds only the next. A BatchNorm that prepare folded into its conv is still part
of the chain (``(Conv2d, BatchNorm2d, ...)`` matches it, ``(Conv2d, ReLU)`` does not), so what
a backend runs fused is what it declared.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()).eval()
    >>> gm = torch.export.export(model, (torch.randn(1, 1, 5, 5),)).module()
    >>> units = graph_units(gm)
    >>> [u.name for u in units]
    ['Conv2d', 'ReLU']
    >>> [u.name for u in match_chain(units[0], (nn.Conv2d, nn.ReLU), first_nodes(units))]
    ['Conv2d', 'ReLU']
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

from qviz.engine.compat import OpOverloadPacket
from qviz.engine.pt2e.passes.bn_fold import FOLDED_BN
from qviz.engine.quantizers.scope import (
    module_names,
    module_type_names,
    operator_matches,
    resolve_operator,
)
from qviz.errors import ConfigError


@dataclass(frozen=True, eq=False)
class Unit:
    """One nameable call: a torch.nn layer's operators, or one function's operator."""

    nodes: tuple[Node, ...]
    module: str  # the module path the call happened in ("" at the top)
    module_class: str | None  # ``module.qualname`` for a layer call, None for a function
    folded: tuple[str, ...] = ()  # BatchNorm classes folded into this unit by prepare

    @property
    def output(self) -> Node:
        return self.nodes[-1]

    @property
    def name(self) -> str:
        if self.module_class is not None:
            return self.module_class.rpartition(".")[2]
        return getattr(self.nodes[0].target, "__name__", str(self.nodes[0].target)).split(".")[0]


def _innermost(node: Node) -> tuple[str, str | None]:
    names, types = module_names(node), module_type_names(node)
    return (names[-1] if names else ""), (types[-1] if types else None)


def _is_layer(qualname: str | None) -> bool:
    """A torch.nn layer (a call a pattern names by class), not a container or a user model."""
    return qualname is not None and qualname.startswith("torch.nn.modules.")


def graph_units(gm: GraphModule) -> list[Unit]:
    """The graph's units in graph order (getitem and other bookkeeping nodes join their op)."""
    units: list[Unit] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or str(node.target).startswith("_guards"):
            continue
        path, qualname = _innermost(node)
        folded = tuple(node.meta.get(FOLDED_BN, ()))
        last = units[-1] if units else None
        if node.target is operator.getitem and last is not None and node.args[0] in last.nodes:
            units[-1] = Unit((*last.nodes, node), last.module, last.module_class, last.folded)
        elif (
            _is_layer(qualname)
            and last is not None
            and last.module_class == qualname
            and (last.module == path)
        ):
            units[-1] = Unit((*last.nodes, node), path, qualname, last.folded + folded)
        else:
            layer = qualname if _is_layer(qualname) else None
            units.append(Unit((node,), path, layer, folded))
    return units


@functools.cache
def _ops_of(element: Any) -> tuple:
    """The ATen operators a function or method-name element exports to (() if none)."""
    if isinstance(element, str):
        names = dict.fromkeys((element, element.rstrip("_")))
        packets = (getattr(torch.ops.aten, n, None) for n in names)
        return tuple(p for p in packets if isinstance(p, OpOverloadPacket))
    try:
        ops = resolve_operator(element)
    except ConfigError:
        return ()
    # ``out += x`` exports to the in-place ``aten.add_``: the same operator to a backend
    inplace = (
        getattr(torch.ops.aten, f"{op._qualified_op_name.split('::')[1]}_", None)
        for op in ops
        if isinstance(op, OpOverloadPacket)
    )
    return (*ops, *(p for p in inplace if isinstance(p, OpOverloadPacket)))


def element_matches(unit: Unit, element: Any) -> bool:
    """Whether ``unit`` is a call of ``element`` (a module class, function or method name)."""
    if isinstance(element, type):
        return unit.module_class == f"{element.__module__}.{element.__qualname__}"
    if unit.module_class is not None or len(unit.nodes) != 1:
        return False
    ops = _ops_of(element)
    return bool(ops) and operator_matches(unit.nodes[0], ops)


def _next_unit(unit: Unit, by_first: dict[Node, Unit]) -> Unit | None:
    users = [u for u in unit.output.users if u.op == "call_function"]
    if len(unit.output.users) != 1 or len(users) != 1:
        return None
    return by_first.get(users[0])


def first_nodes(units: Sequence[Unit]) -> dict[Node, Unit]:
    """Each unit by its first node (what the chain functions follow users through)."""
    return {u.nodes[0]: u for u in units}


def match_chain(start: Unit, pattern: Any, by_first: dict[Node, Unit]) -> list[Unit] | None:
    """The units ``pattern`` covers when it starts at ``start``, or None.

    A folded BatchNorm must be named by the pattern (it is part of what the unit computes).
    """
    elements = pattern if isinstance(pattern, tuple) else (pattern,)
    chain, unit, index = [start], start, 0
    if not element_matches(start, elements[0]):
        return None
    index = 1
    while True:
        for bn in unit.folded:
            if index >= len(elements) or not element_matches(
                Unit(unit.nodes, unit.module, bn), elements[index]
            ):
                return None
            index += 1
        if index == len(elements):
            return chain
        unit = _next_unit(unit, by_first)
        if unit is None or not element_matches(unit, elements[index]):
            return None
        chain.append(unit)
        index += 1


def following_units(start: Unit, by_first: dict[Node, Unit], count: int) -> list[Unit]:
    """Up to ``count`` units after ``start``, each the only reader of the one before."""
    out: list[Unit] = []
    unit: Unit | None = start
    while len(out) < count:
        unit = _next_unit(unit, by_first) if unit is not None else None
        if unit is None:
            break
        out.append(unit)
    return out


def unit_chain(start: Unit, by_first: dict[Node, Unit], length: int = 3) -> tuple[str, ...]:
    """What the graph does from ``start`` on, as pattern element names (folded BatchNorms
    included), up to ``length`` elements: what a backend would have to declare."""
    names: list[str] = []
    for unit in (start, *following_units(start, by_first, length - 1)):
        names.append(unit.name)
        names.extend(bn.rpartition(".")[2] for bn in unit.folded)
    return tuple(names[:length])
