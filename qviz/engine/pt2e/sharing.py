"""Sharing groups: which edges and node outputs use one observer, and why. Pure: reads, never edits.

Every annotated tensor is an edge ``(producer, consumer)`` (an input of the consumer) or a node
(its output). Tensors join one group, and so one observer and one set of qparams, in two ways:

* **explicit**: a ``SharedQuantizationSpec(other)`` joins a tensor to ``other``'s group;
* **implicit**: an input edge and its producer's output (or another edge leaving the same
  producer) are the same tensor, so when their resolved specs agree on dtype, range, qscheme,
  axis and fixed qparams they share (unless the consumer sets ``allow_implicit_sharing=False``).

Groups are the classes of a union-find over these links, built in annotation order with the
same order rules as torchao, so both create the same observers. A member linked to the group's
observer-owning tensor through other members joined **transitively**.

Worked example (the tutorial's cat): conv1 and conv2 output spec A; cat's input 0 uses A, its
input 1 and output are ``SharedQuantizationSpec((conv1, cat))``::

    conv1 (A) ──implicit── (conv1 -> cat) (A) ──explicit── cat
                                  │ explicit
    conv2 (A) ──implicit── (conv2 -> cat) Shared

    one group {conv1, conv2, conv1 -> cat, conv2 -> cat, cat}, one observer. conv1's output
    comes first in annotation order with a concrete spec, so it owns the observer; conv1 -> cat
    links to it directly (implicit); conv2 -> cat, cat and conv2 join transitively.

Example:
    >>> import torch
    >>> from qviz.engine.specs import FixedQParamsQuantizationSpec
    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.ReLU()))
    >>> x, r0, r1 = list(gm.graph.nodes)[:3]
    >>> spec = FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=1 / 256, zero_point=0,
    ...     quant_min=0, quant_max=255)
    >>> sharing = resolve_sharing({(x, r0): spec, r0: spec, (r0, r1): spec})
    >>> {describe(k): str(m.how) for k, m in sharing.members.items()}
    {'input_1 -> _0': 'own spec', '_0': 'own spec', '_0 -> _1': 'implicit'}
    >>> len(sharing.groups)  # input_1 -> _0 is another tensor than _0's output
    2
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from torch.fx import Node

from qviz.engine.specs import EdgeOrNode, QuantizationSpecBase, SharedQuantizationSpec
from qviz.errors import AnnotationError

#: Attributes two specs must agree on for an edge to share its producer's observer implicitly.
IMPLICIT_SHARING_ATTRS = (
    "dtype",
    "is_dynamic",
    "quant_min",
    "quant_max",
    "qscheme",
    "ch_axis",
    "scale",
    "zero_point",
)


class Link(StrEnum):
    """How a tensor came to use its group's observer."""

    OWN_SPEC = "own spec"
    EXPLICIT = "explicit"
    IMPLICIT = "implicit"
    TRANSITIVE = "transitive"


@dataclass(frozen=True)
class Membership:
    """One tensor's place in the sharing: its group, how it joined, and through which tensor."""

    key: EdgeOrNode
    group: int
    how: Link
    via: EdgeOrNode | None


@dataclass(frozen=True)
class Sharing:
    """The resolved sharing: groups in creation order, each group's owner and concrete spec."""

    groups: dict[int, tuple[EdgeOrNode, ...]]
    owner: dict[int, EdgeOrNode]
    spec: dict[int, QuantizationSpecBase]
    members: dict[EdgeOrNode, Membership]


def describe(key: EdgeOrNode) -> str:
    """``"conv1 -> cat"`` for an edge, ``"conv1"`` for a node's output."""
    if isinstance(key, tuple):
        return f"{key[0].name} -> {key[1].name}"
    return key.name


def _same_attrs(a: QuantizationSpecBase, b: QuantizationSpecBase) -> bool:
    def same(attr: str) -> bool:
        has_a, has_b = hasattr(a, attr), hasattr(b, attr)
        return (has_a and has_b and getattr(a, attr) == getattr(b, attr)) or (
            not has_a and not has_b
        )

    return all(same(attr) for attr in IMPLICIT_SHARING_ATTRS)


class _Resolver:
    """Union-find over annotated tensors, recording every link it makes."""

    def __init__(self, specs: Mapping[EdgeOrNode, QuantizationSpecBase]) -> None:
        self.specs = specs
        self.parent: dict[EdgeOrNode, EdgeOrNode] = {k: k for k in specs}
        self.links: dict[EdgeOrNode, list[tuple[EdgeOrNode, Link]]] = {k: [] for k in specs}

    def find(self, key: EdgeOrNode) -> EdgeOrNode:
        root = key
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[key] != root:  # path compression
            self.parent[key], key = root, self.parent[key]
        return root

    def target(self, member: EdgeOrNode, spec: SharedQuantizationSpec) -> EdgeOrNode:
        target = spec.edge_or_node
        if target not in self.specs:
            raise AnnotationError(
                f"{describe(member)}: SharedQuantizationSpec points at {_fmt(target)}, which has "
                f"no quantization spec; annotate {_fmt(target)} too, or share with an annotated "
                f"edge or node"
            )
        return target

    def union(self, parent: EdgeOrNode, child: EdgeOrNode, how: Link) -> None:
        root_parent, root_child = self.find(parent), self.find(child)
        self.links[parent].append((child, how))
        self.links[child].append((parent, how))
        parent_spec = self.specs[root_parent]
        if (
            isinstance(parent_spec, SharedQuantizationSpec)
            and parent_spec.edge_or_node == root_child
        ):
            self.parent[root_parent] = root_child  # pointing back would close a cycle
        else:
            self.parent[root_child] = root_parent

    def resolved(self, member: EdgeOrNode) -> QuantizationSpecBase:
        """The concrete spec a tensor's SharedQuantizationSpec chain leads to."""
        spec, chain = self.specs[member], [member]
        while isinstance(spec, SharedQuantizationSpec):
            root = self.find(self.target(chain[-1], spec))
            if root in chain:
                names = " => ".join(f"({describe(k)})" for k in [*chain, root])
                raise AnnotationError(
                    f"sharing cycle with no concrete spec: {names}; give one of these a "
                    f"QuantizationSpec (or FixedQParams/Derived spec) for the others to share"
                )
            chain.append(root)
            spec = self.specs[root]
        return spec


def _fmt(key: object) -> str:
    if isinstance(key, Node) or (
        isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, Node) for k in key)
    ):
        return describe(key)  # type: ignore[arg-type]
    return repr(key)


def _link_all(resolver: _Resolver, implicit: Callable[[Node], bool]) -> None:
    for key, spec in resolver.specs.items():
        if isinstance(key, tuple):
            producer, consumer = key
            root_spec = resolver.resolved(key)
            if implicit(consumer):
                # other edges leaving the producer first, then its output: the reverse order
                # could point the producer's output at this edge and close a cycle
                others = [(producer, user) for user in producer.users if user is not consumer]
                for other in [*others, producer]:
                    if other in resolver.specs and _same_attrs(resolver.resolved(other), root_spec):
                        resolver.union(other, key, Link.IMPLICIT)
        if isinstance(spec, SharedQuantizationSpec):
            resolver.union(resolver.target(key, spec), key, Link.EXPLICIT)


def _memberships(
    resolver: _Resolver, members: tuple[EdgeOrNode, ...], group: int, owner: EdgeOrNode
) -> dict[EdgeOrNode, Membership]:
    """Breadth-first from the owner: direct links keep their kind, longer paths are transitive.

    Two tensors linked both implicitly and explicitly are reported as explicit: that is what
    the quantizer wrote."""
    out = {owner: Membership(owner, group, Link.OWN_SPEC, None)}
    queue = deque([owner])
    while queue:
        current = queue.popleft()
        links: dict[EdgeOrNode, Link] = {}
        for neighbour, how in resolver.links[current]:
            if links.get(neighbour) is not Link.EXPLICIT:
                links[neighbour] = how
        for neighbour, how in links.items():
            if neighbour not in out:
                kind = how if current == owner else Link.TRANSITIVE
                out[neighbour] = Membership(neighbour, group, kind, current)
                queue.append(neighbour)
    return {m: out[m] for m in members}


def resolve_sharing(
    specs: Mapping[EdgeOrNode, QuantizationSpecBase],
    *,
    implicit: Callable[[Node], bool] = lambda node: True,
) -> Sharing:
    """Group the annotated tensors that share one observer.

    Args:
        specs: every annotated edge and node output with its (non-None) spec, in annotation order
            (graph order; a node's input edges, then its output).
        implicit: whether a consumer node allows implicit sharing on its input edges
            (its annotation's ``allow_implicit_sharing``).

    Raises:
        AnnotationError: a SharedQuantizationSpec points at an unannotated tensor, or a chain of
            shared specs cycles without reaching a concrete spec.
    """
    resolver = _Resolver(specs)
    _link_all(resolver, implicit)
    ids: dict[EdgeOrNode, int] = {}
    grouped: dict[int, list[EdgeOrNode]] = {}
    for key in specs:
        group = ids.setdefault(resolver.find(key), len(ids))
        grouped.setdefault(group, []).append(key)
    groups = {g: tuple(m) for g, m in grouped.items()}
    owner, spec, members = {}, {}, {}
    for g, group_members in groups.items():
        concrete = [m for m in group_members if not isinstance(specs[m], SharedQuantizationSpec)]
        if not concrete:  # only shared specs: resolving any member reports the cycle
            resolver.resolved(group_members[0])
            raise AnnotationError(f"no member of {[describe(m) for m in group_members]} has a spec")
        owner[g] = concrete[0]
        spec[g] = specs[owner[g]]
        members.update(_memberships(resolver, group_members, g, owner[g]))
    return Sharing(groups=groups, owner=owner, spec=spec, members=members)
