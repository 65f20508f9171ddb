"""Records to a graphviz Digraph: HTML-table boxes, group colours, module clusters, a legend.

Pure: the same :class:`~qviz.viz.stages.GraphView` always gives the same DOT text. Boxes are
``shape=plaintext`` with an HTML table (``shape=record`` inside clusters makes dot 2.43 fail
with "lost edge"). An observer marker takes its sharing group's colour, so the tensors that
share one observer read as one colour at a glance.

Example:
    >>> from qviz.viz.stages import GraphView, ViewEdge, ViewNode
    >>> view = GraphView("observed", (ViewNode("a", "input", "input a"),
    ...     ViewNode("obs/a", "marker", "g0", group=0), ViewNode("b", "op", "relu", "relu")),
    ...     (ViewEdge("a", "obs/a"), ViewEdge("obs/a", "b")))
    >>> 'label=g0' in to_digraph(view).source
    True
"""

from __future__ import annotations

import html
from collections.abc import Collection
from typing import Any

from qviz.errors import MissingDependencyError
from qviz.viz.hierarchy import cluster_paths
from qviz.viz.stages import GraphView, ViewNode

__all__ = ["PALETTE", "group_colour", "to_digraph"]

#: Fill colours of sharing groups (group id modulo the length), pastels with no grey: grey
#: means "left in float".
PALETTE = (
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
    "#b3de69", "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f", "#a6cee3",
    "#e5c494", "#b2df8a", "#fb9a99", "#cab2d6",
)  # fmt: skip

_STYLE = {  # kind: (fill, border, font colour)
    "op": ("#ffffff", "#333333", "#000000"),
    "float": ("#eeeeee", "#aaaaaa", "#888888"),
    "input": ("#e8f0fe", "#4a6fa5", "#000000"),
    "output": ("#e8f0fe", "#4a6fa5", "#000000"),
    "param": ("#f7f7f7", "#999999", "#555555"),
    "collapsed": ("#f3ecf8", "#6a3d9a", "#000000"),
    "quantize": ("#fff3e0", "#e6550d", "#000000"),
    "dequantize": ("#e5f5e0", "#31a354", "#000000"),
}
_HIGHLIGHT = "#d62728"


def group_colour(group: int) -> str:
    """The fill colour of sharing group ``group``."""
    return PALETTE[group % len(PALETTE)]


def _graphviz() -> Any:
    try:
        import graphviz
    except ImportError as err:
        raise MissingDependencyError(
            "drawing graphs needs the graphviz Python package: pip install graphviz "
            "(and the dot program: apt install graphviz, or conda install graphviz)"
        ) from err
    return graphviz


def _table(node: ViewNode, highlighted: bool) -> str:
    fill, border, font = _STYLE.get(node.kind, _STYLE["op"])
    if node.group is not None:
        fill = group_colour(node.group)
    width = 3 if highlighted else 1
    border = _HIGHLIGHT if highlighted else border
    title = html.escape(node.label)
    if node.kind == "collapsed":
        title = f"{title} ({node.count} ops)"
    if node.group is not None and node.kind in ("quantize", "dequantize"):
        title = f"{title} · g{node.group}"
    rows = [f'<tr><td><font color="{font}"><b>{title}</b></font></td></tr>']
    for line in node.detail.split("\\n") if node.detail else ():
        text = html.escape(line)
        rows.append(f'<tr><td><font point-size="9" color="#555555">{text}</font></td></tr>')
    style = ' style="rounded"' if node.kind in ("input", "output", "collapsed") else ""
    return (
        f'<<table border="{width}" cellborder="0" cellspacing="0" cellpadding="3" '
        f'bgcolor="{fill}" color="{border}"{style}>{"".join(rows)}</table>>'
    )


def _add_node(g: Any, node: ViewNode, highlighted: bool) -> None:
    tooltip = node.tooltip or node.name
    if node.kind == "marker":
        label = node.label if not node.detail else f"{node.label}\\n{node.detail}"
        g.node(
            node.name,
            label=label,
            shape="box",
            style="rounded,filled",
            fillcolor=group_colour(node.group or 0),
            color=_HIGHLIGHT if highlighted else "#555555",
            fontsize="9",
            height="0.2",
            margin="0.04,0.02",
            tooltip=tooltip,
        )
        return
    g.node(node.name, label=_table(node, highlighted), shape="plaintext", tooltip=tooltip)


def _is_highlighted(node: ViewNode, highlight: Collection[str]) -> bool:
    if node.name in highlight:
        return True
    path = node.label if node.kind == "collapsed" else node.module
    return any(path == h or path.startswith(f"{h}.") for h in highlight if path)


def _home(node: ViewNode, paths: list[str]) -> str:
    """The deepest cluster path holding ``node`` ("" for the top level)."""
    best = ""
    for p in paths:
        if (node.module == p or node.module.startswith(f"{p}.")) and len(p) > len(best):
            best = p
    return best


def _emit(
    g: Any,
    path: str,
    tree: dict[str, list[str]],
    members: dict[str, list[ViewNode]],
    draw: Any,
    types: dict[str, str],
) -> None:
    for node in members.get(path, []):
        draw(g, node)
    for child in tree.get(path, []):
        with g.subgraph(name=f"cluster_{child}") as sub:
            kind = types.get(child, "")
            sub.attr(
                label=f"{child} ({kind})" if kind else child,
                style="rounded,dashed",
                color="#9e9e9e",
                fontsize="10",
                fontcolor="#616161",
            )
            _emit(sub, child, tree, members, draw, types)


def _legend(g: Any, stage: str) -> None:
    rows = [("#ffffff", "op")]
    if stage == "observed":
        rows += [(PALETTE[0], "gN: observer of sharing group N (same colour = one observer)")]
    if stage == "converted":
        rows += [
            (_STYLE["quantize"][0], "quantize (scale, zero_point)"),
            (_STYLE["dequantize"][0], "dequantize; int8 weight: stored integer weight"),
        ]
    rows += [
        (_STYLE["float"][0], "left in float (hover: reason)"),
        (_STYLE["collapsed"][0], "collapsed module (op count)"),
    ]
    cells = "".join(
        f'<tr><td bgcolor="{c}" width="14"> </td><td align="left">{html.escape(t)}</td></tr>'
        for c, t in rows
    )
    label = (
        f'<<table border="0" cellspacing="2" cellpadding="2"><tr><td colspan="2">'
        f"<b>{stage} graph</b></td></tr>{cells}</table>>"
    )
    g.node("legend", label=label, shape="plaintext", fontsize="9")


def to_digraph(view: GraphView, highlight: Collection[str] = (), legend: bool = True) -> Any:
    """A ``graphviz.Digraph`` drawing ``view``; ``highlight`` names nodes or module paths.

    Raises:
        MissingDependencyError: the graphviz Python package is not installed.
    """
    graphviz = _graphviz()
    g = graphviz.Digraph(
        "qviz",
        graph_attr={"rankdir": "TB", "nodesep": "0.25", "ranksep": "0.3", "fontname": "Helvetica"},
        node_attr={"fontname": "Helvetica", "fontsize": "11"},
        edge_attr={"arrowsize": "0.6", "color": "#555555"},
    )
    paths = cluster_paths(view)
    tree: dict[str, list[str]] = {}
    for p in paths:
        parent = next((q for q in reversed(paths) if p.startswith(f"{q}.")), "")
        tree.setdefault(parent, []).append(p)
    members: dict[str, list[ViewNode]] = {}
    for node in view.nodes:
        members.setdefault(_home(node, paths), []).append(node)
    marked = set(highlight)

    def draw(sub: Any, node: ViewNode) -> None:
        _add_node(sub, node, _is_highlighted(node, marked))

    _emit(g, "", tree, members, draw, dict(view.module_types))
    for e in view.edges:
        g.edge(e.src, e.dst)
    if legend:
        _legend(g, view.stage)
    return g
