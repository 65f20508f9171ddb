"""Long edges of a graph too costly for Graphviz drawn as named references instead of arrows.

``dot`` routes an edge that spans ``k`` ranks through ``k - 1`` invisible nodes, and its
ordering and placement passes grow faster than linearly in those nodes. A DenseNet block, where
every layer's output feeds the concatenation of every later layer, has quadratically many such
edges: densenet121's observed graph needs ~16,000 of them (3.7 s of layout, ~9,000 crossings),
densenet201's ~49,000 (over a minute). Beyond a budget, this module keeps the short edges as
arrows and draws each consumer's long inputs as one small *reference* box right above it that
names them (an off-page connector), longest edges first, until the estimate fits the budget.
Nothing is dropped: every folded edge is named in the box and listed in its tooltip, and a click
on the box selects the first of them. Graphs within budget (every torchvision ResNet,
MobileNet, EfficientNet, ViT, the transformer encoders) are drawn exactly as before.

Ranks are estimated by longest path from the inputs, as dot's first ranking does before it
shortens edges, so the estimate is an upper bound of dot's virtual node count.

Example:
    >>> from qviz.viz.graph.graph_records import GraphView, ViewEdge, ViewNode
    >>> chain = [ViewNode(name=f"n{i}", kind="op", label="relu") for i in range(8)]
    >>> edges = [ViewEdge(f"n{i}", f"n{i + 1}") for i in range(7)] + [ViewEdge("n0", "n7")]
    >>> view = GraphView(stage="float", nodes=tuple(chain), edges=tuple(edges))
    >>> virtual_nodes(view)
    6
    >>> folded = fold_long_edges(view, budget=0, min_span=2)
    >>> [(n.name, n.label) for n in folded.nodes if n.kind == "ref"]
    [('ref/n7', 'from n0')]
    >>> ("n0", "n7") in {(e.src, e.dst) for e in folded.edges}
    False
"""

from __future__ import annotations

from dataclasses import replace

from qviz.viz.graph.graph_records import GraphView, ViewEdge, ViewNode

#: The virtual nodes dot is given: about 1 s of layout for densenet201's observed graph on one
#: core. Estimates of this module: densenet121's observed graph needs ~38,400 for 747 nodes
#: (3.7 s of layout unfolded), densenet201's ~260,000 for 1,227 (over a minute); swin_v2_t's
#: ~13,600 and maxvit_t's ~17,100 lose a few of their longest edges (0.4 s either way);
#: ResNets, MobileNets, EfficientNets, ViT and the transformer encoders need under 2,100.
LAYOUT_BUDGET = 12_000
#: Edges spanning this many ranks or fewer are always drawn as arrows.
MIN_SPAN = 8
_NAMES_PER_LINE = 3
_MAX_LINES = 4


def ranks(view: GraphView) -> dict[str, int]:
    """Each node's rank, as dot's ranking would roughly give it.

    First the longest path to each node from a node with no inputs; then, walking back from the
    outputs, a node with more edges out than in (a weight's observer marker, an input) moves
    down to just above its first consumer, which shortens more edges than it lengthens (dot
    places a weight beside its conv too, not at the top of the page), and so does a node drawn
    in its one consumer's module cluster but not in its inputs' (a converted graph's
    dequantize). Nodes on a cycle (there
    are none in an exported graph) keep the rank reached so far.

    Example:
        >>> from qviz.viz.graph.graph_records import GraphView, ViewEdge, ViewNode
        >>> v = GraphView(stage="float", nodes=tuple(ViewNode(name=x, kind="op",
        ...     label=x) for x in "abcw"),
        ...     edges=(ViewEdge("a", "b"), ViewEdge("b", "c"), ViewEdge("a", "c"), ViewEdge("w",
        ...     "c")))
        >>> ranks(v)
        {'a': 0, 'b': 1, 'c': 2, 'w': 1}
    """
    rank = {n.name: 0 for n in view.nodes}
    into = dict.fromkeys(rank, 0)
    out: dict[str, list[str]] = {}
    for e in view.edges:
        if e.src in rank and e.dst in rank:
            out.setdefault(e.src, []).append(e.dst)
            into[e.dst] += 1
    indegree = dict(into)
    ready = [name for name, k in into.items() if k == 0]
    order = []
    while ready:  # Kahn's topological order, longest path on the way
        name = ready.pop()
        order.append(name)
        for dst in out.get(name, ()):
            rank[dst] = max(rank[dst], rank[name] + 1)
            into[dst] -= 1
            if into[dst] == 0:
                ready.append(dst)
    module = {n.name: n.module for n in view.nodes}
    above: dict[str, list[str]] = {}
    for src, dsts in out.items():
        for dst in dsts:
            above.setdefault(dst, []).append(src)
    for name in reversed(order):
        below = out.get(name)
        if below and (len(below) > indegree[name] or _joins_consumer(name, below, above, module)):
            rank[name] = max(rank[name], min(rank[d] for d in below) - 1)
    return rank


def _joins_consumer(
    name: str, below: list[str], above: dict[str, list[str]], module: dict[str, str]
) -> bool:
    """Whether ``name`` is drawn in its one consumer's module cluster and not in its inputs'
    (a converted graph's dequantize sits with the op it feeds): dot keeps a cluster together,
    so the node lands just above the consumer."""
    home = module[name]
    if len(below) != 1 or not home or module[below[0]] != home:
        return False
    return all(module[src] != home for src in above.get(name, ()))


def _span(edge: ViewEdge, rank: dict[str, int]) -> int:
    return abs(rank.get(edge.dst, 0) - rank.get(edge.src, 0))


def virtual_nodes(view: GraphView, rank: dict[str, int] | None = None) -> int:
    """The invisible nodes dot adds to route ``view``'s edges: sum of (span - 1) per edge."""
    rank = ranks(view) if rank is None else rank
    return sum(max(_span(e, rank) - 1, 0) for e in view.edges)


def _producer(node: ViewNode) -> str:
    """The graph node an edge from ``node`` carries: an observer marker's producer."""
    if node.kind == "marker":
        return node.name.removeprefix("obs/").split("/")[0]
    return node.name


def _source_text(node: ViewNode) -> str:
    """How a reference box names an edge's source: ``conv2d_15 (g29)`` for an observer marker
    (its producer and group), the path for a collapsed module, else the node's name."""
    if node.kind == "marker":
        return f"{_producer(node)} ({node.label})"
    if node.kind == "collapsed":
        return node.label
    return node.name


def _ref_node(dst: ViewNode, sources: list[ViewNode], folded: list[ViewEdge]) -> ViewNode:
    names = [_source_text(s) for s in sources]
    shown = names[: _NAMES_PER_LINE * _MAX_LINES]
    lines = [
        ", ".join(shown[i : i + _NAMES_PER_LINE]) for i in range(0, len(shown), _NAMES_PER_LINE)
    ]
    if len(names) > len(shown):
        lines[-1] += f" … (+{len(names) - len(shown)})"
    label = "from " + "\\n".join(lines)
    tip = [f"{len(folded)} input(s) of {dst.name} drawn as names, not arrows (long edges):"]
    tip += [
        f"  {e.src} -> {e.dst}" + (f": {e.tooltip or e.label}" if e.label else "") for e in folded
    ]
    refs = tuple(f"{_producer(src)} -> {dst.name}" for src in sources)
    return ViewNode(
        name=f"ref/{dst.name}",
        kind="ref",
        label=label,
        module=dst.module,
        tooltip="\\n".join(tip),
        refs=refs,
    )


def fold_long_edges(
    view: GraphView,
    budget: int = LAYOUT_BUDGET,
    min_span: int = MIN_SPAN,
) -> GraphView:
    """``view`` with its longest edges drawn as reference boxes until dot's work fits ``budget``.

    Args:
        view: the records to draw.
        budget: the virtual nodes allowed (see :data:`LAYOUT_BUDGET`).
        min_span: edges spanning this many ranks or fewer are never folded.

    Returns:
        ``view`` itself when it fits; else a copy where each folded edge ``a -> c`` is gone and
        ``c`` has one node of kind ``"ref"`` (named ``ref/c``, drawn just above ``c``) naming
        all of its folded inputs, with ``refs`` the folded edges ``"a -> c"`` as the plan
        names them (an observer marker's producer for the marker), what a click selects.
    """
    rank = ranks(view)
    cost = virtual_nodes(view, rank)
    if cost <= budget:
        return view
    folded: set[tuple[str, str]] = set()
    for e in sorted(view.edges, key=lambda e: -_span(e, rank)):
        span = _span(e, rank)
        if cost <= budget or span <= min_span:
            break
        folded.add((e.src, e.dst))
        cost -= span - 1
    return _with_refs(view, folded) if folded else view


def _with_refs(view: GraphView, folded: set[tuple[str, str]]) -> GraphView:
    by_name = {n.name: n for n in view.nodes}
    kept: list[ViewEdge] = []
    into: dict[str, list[ViewEdge]] = {}
    for e in view.edges:
        if (e.src, e.dst) in folded:
            into.setdefault(e.dst, []).append(e)
        else:
            kept.append(e)
    nodes: list[ViewNode] = []
    for node in view.nodes:
        if node.name in into:
            edges = into[node.name]
            ref = _ref_node(node, [by_name[e.src] for e in edges], edges)
            nodes.append(ref)
            kept.append(ViewEdge(ref.name, node.name, style="ref"))
        nodes.append(node)
    return replace(view, nodes=tuple(nodes), edges=tuple(kept))
