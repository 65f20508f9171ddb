"""Records to a graphviz Digraph: HTML-table boxes, group colours, module clusters, a legend.

Pure: the same :class:`~qviz.viz.graph.graph_records.GraphView` always gives the same DOT
text. Boxes are ``shape=plaintext`` with an HTML table (``shape=record`` inside clusters makes
dot 2.43 fail with "lost edge"). An observer marker takes its sharing group's colour, so the
tensors that share one observer read as one colour at a glance.

Example:
    >>> from qviz.viz.graph.graph_records import GraphView, ViewEdge, ViewNode
    >>> view = GraphView(stage="observed", nodes=(ViewNode(name="a", kind="input", label="input a"),
    ...     ViewNode(name="obs/a", kind="marker", label="g0", group=0), ViewNode(name="b",
    ...     kind="op", label="relu", detail="relu")),
    ...     edges=(ViewEdge("a", "obs/a"), ViewEdge("obs/a", "b")))
    >>> 'label=g0' in to_digraph(view).source
    True
"""

from __future__ import annotations

import html
import math
from collections.abc import Collection
from typing import Any

from qviz.errors import MissingDependencyError
from qviz.viz.graph.graph_records import GraphView, ViewEdge, ViewNode
from qviz.viz.graph.hierarchy import cluster_paths

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
#: Borders of ops a lowered program runs: on an integer kernel, on a float kernel (dashed).
_KERNEL_BORDER = {"integer": "#1f4e9c", "float": "#e6550d"}
#: Observer markers' fill under a heatmap, so that only the metric's colours stand out.
_MUTED = "#f4f4f4"

#: Metric colormap anchors, low to high (red, yellow, green; light enough for black text).
HEAT = ("#f46d43", "#fee08b", "#66bd63")
_BAR_CELLS = 9


def group_colour(group: int) -> str:
    """The fill colour of sharing group ``group``."""
    return PALETTE[group % len(PALETTE)]


def heat_colour(t: float) -> str:
    """The colour of ``t`` in [0, 1] on :data:`HEAT` (linear in RGB; outside values clip).

    Example:
        >>> heat_colour(0.0), heat_colour(1.0), heat_colour(0.5) == HEAT[1]
        ('#f46d43', '#66bd63', True)
    """
    t = min(max(t, 0.0), 1.0) * (len(HEAT) - 1)
    i = min(int(t), len(HEAT) - 2)
    a, b = (tuple(int(c[k : k + 2], 16) for k in (1, 3, 5)) for c in HEAT[i : i + 2])
    mix = [round(x + (y - x) * (t - i)) for x, y in zip(a, b, strict=True)]
    return "#" + "".join(f"{v:02x}" for v in mix)


def _metric_range(view: GraphView) -> tuple[float, float] | None:
    values = [n.value for n in view.nodes if n.value is not None and math.isfinite(n.value)]
    if not values:
        return None
    return view.metric_span if view.metric_span is not None else (min(values), max(values))


def _value_colour(
    value: float, span: tuple[float, float], higher_is_better: bool = True, bands: Any = None
) -> str:
    if bands is not None:  # fixed bands (qviz.display.bands): the same colour in every drawing
        return bands.colour(value) or _MUTED
    lo, hi = span
    if math.isinf(value):
        t = 1.0 if value > 0 else 0.0
    else:
        t = min(1.0, max(0.0, (value - lo) / (hi - lo))) if hi > lo else 0.5
    return heat_colour(t if higher_is_better else 1.0 - t)


def _graphviz() -> Any:
    try:
        import graphviz
    except ImportError as err:
        raise MissingDependencyError(
            "drawing graphs needs the graphviz Python package: pip install graphviz "
            "(and the dot program: apt install graphviz, or conda install graphviz)"
        ) from err
    return graphviz


def _table(
    node: ViewNode,
    highlighted: bool,
    span: tuple[float, float] | None,
    metric: str,
    higher: bool = True,
    muted: bool = False,
    bands: Any = None,
) -> str:
    fill, border, font = _STYLE.get(node.kind, _STYLE["op"])
    if node.group is not None and not muted:  # a heatmap mutes the group colours
        fill = group_colour(node.group)
    if node.value is not None and span is not None:
        fill = _value_colour(node.value, span, higher, bands)
    if node.category is not None:
        fill = node.category[1]
    width = 3 if highlighted else (2 if node.kernel else 1)
    border = _HIGHLIGHT if highlighted else _KERNEL_BORDER.get(node.kernel, border)
    title = html.escape(node.label)
    if node.kind == "collapsed":
        title = f"{title} ({node.count} op{'' if node.count == 1 else 's'})"
    if node.group is not None and node.kind in ("quantize", "dequantize"):
        title = f"{title} · g{node.group}"
    rows = [f'<tr><td><font color="{font}"><b>{title}</b></font></td></tr>']
    for line in node.detail.split("\\n") if node.detail else ():
        text = html.escape(line)
        rows.append(f'<tr><td><font point-size="9" color="#555555">{text}</font></td></tr>')
    if node.value is not None:
        text = html.escape(f"{metric} {node.value:.3g}".strip())
        rows.append(f'<tr><td><font point-size="10"><b>{text}</b></font></td></tr>')
    if node.category is not None:
        text = html.escape(f"{metric}: {node.category[0]}")
        rows.append(f'<tr><td><font point-size="10"><b>{text}</b></font></td></tr>')
    if node.kernel:
        text = html.escape(f"{node.kernel} kernel: {node.kernel_op}")
        rows.append(f'<tr><td><font point-size="9" color="{border}">{text}</font></td></tr>')
    style = ' style="rounded"' if node.kind in ("input", "output", "collapsed") else ""
    style = ' style="dashed"' if node.kernel == "float" else style
    return (
        f'<<table border="{width}" cellborder="0" cellspacing="0" cellpadding="3" '
        f'bgcolor="{fill}" color="{border}"{style}>{"".join(rows)}</table>>'
    )


def _add_node(
    g: Any,
    node: ViewNode,
    highlighted: bool,
    span: tuple[float, float] | None,
    metric: str,
    higher: bool = True,
    muted: bool = False,
    bands: Any = None,
) -> None:
    tooltip = node.tooltip or node.name
    if node.kind == "ref":
        _add_ref(g, node, highlighted)
        return
    if node.kind == "marker":
        label = node.label if not node.detail else f"{node.label}\\n{node.detail}"
        g.node(
            node.name,
            label=label,
            shape="box",
            style="rounded,filled",
            fillcolor=_MUTED if muted else group_colour(node.group or 0),
            color=_HIGHLIGHT if highlighted else "#555555",
            fontsize="9",
            height="0.2",
            margin="0.04,0.02",
            tooltip=tooltip,
        )
        return
    if node.value is not None:
        tooltip = f"{metric or 'metric'} = {node.value:.6g}\\n{tooltip}"
    if node.category is not None:
        tooltip = f"{metric or 'class'}: {node.category[0]}\\n{tooltip}"
    label = _table(node, highlighted, span, metric, higher, muted, bands)
    g.node(node.name, label=label, shape="plaintext", tooltip=tooltip)


def _add_ref(g: Any, node: ViewNode, highlighted: bool) -> None:
    """A reference box: the names of a node's inputs whose edges are too long to draw."""
    g.node(
        node.name,
        label=node.label,
        shape="box",
        style="rounded,dashed,filled",
        fillcolor="#fafafa",
        color=_HIGHLIGHT if highlighted else "#9e9e9e",
        fontcolor="#555555",
        fontsize="8",
        height="0.2",
        margin="0.04,0.02",
        tooltip=node.tooltip or node.name,
    )


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


def _colour_bar(span: tuple[float, float], metric: str, higher: bool = True) -> str:
    """A legend row: the metric's name, then ``min [cells low to high] max``."""
    lo, hi = span
    steps = [i / (_BAR_CELLS - 1) for i in range(_BAR_CELLS)]
    cells = "".join(
        f'<td bgcolor="{heat_colour(t if higher else 1.0 - t)}" width="12"> </td>' for t in steps
    )
    bar = (
        f'<table border="0" cellspacing="0" cellpadding="2"><tr><td align="right">{lo:.3g}</td>'
        f'{cells}<td align="left">{hi:.3g}</td></tr></table>'
    )
    name = html.escape(metric or "metric")
    order = "low (red) to high (green)" if higher else "low (green) to high (red)"
    return (
        f'<tr><td colspan="2" align="left">{name}: {order}</td></tr>'
        f'<tr><td colspan="2">{bar}</td></tr>'
    )


def _band_rows(bands: Any, metric: str) -> str:
    """Legend rows of fixed bands: the metric's name, then one swatch per band, low to high."""
    name = html.escape(f"{metric or bands.name}: fixed {bands.name} bands")
    rows = f'<tr><td colspan="2" align="left">{name}</td></tr>'
    return rows + "".join(
        f'<tr><td bgcolor="{c}" width="14"> </td><td align="left">{html.escape(t)}</td></tr>'
        for c, t in bands.legend()
    )


def _legend_rows(
    stage: str, kinds: set[str], muted: bool, partition: str = ""
) -> list[tuple[str, str]]:
    """The legend's rows for what this drawing shows (nothing it does not)."""
    rows = [("#ffffff", "op")]
    if stage == "annotated":
        rows += [
            ("", "edge label: input spec (dtype [quant_min,quant_max] sym/aff, /chN axis)"),
            ("", "out ...: output spec; fixed s= zp=, shares (...), derived from ..."),
            ("", "grey dashed edge 'float': input annotated None"),
        ]
    if stage == "observed" and muted:
        rows += [(_MUTED, "gN: observer of sharing group N (colours muted under the metric)")]
    elif stage == "observed":
        rows += [(PALETTE[0], "gN: observer of sharing group N (same colour = one observer)")]
    if stage == "quant_nn":
        muted_note = " (colours muted under the metric)" if muted else ""
        rows += [
            (_MUTED if muted else PALETTE[0], f"input TensorQuantizer{muted_note}"),
            (_MUTED if muted else PALETTE[1], "weight TensorQuantizer (per channel: ranges)"),
            ("", "grid (/chN: one amax per index of axis N), amax, scale, calibration method"),
            ("", "scale = amax / quant_max; dynamic: amax computed from each input"),
        ]
    if stage == "converted":
        rows += [
            (_STYLE["quantize"][0], "quantize (scale, zero_point)"),
            (_STYLE["dequantize"][0], "dequantize; weight: stored integers (bits, storage dtype)"),
        ]
    if "float" in kinds:
        rows.append((_STYLE["float"][0], "left in float (hover: reason)"))
    if partition:
        rows += [
            (_KERNEL_BORDER["integer"], f"blue border: runs on an integer kernel ({partition})"),
            (_KERNEL_BORDER["float"], "orange dashed border: float kernel (hover: why)"),
        ]
    if "collapsed" in kinds:
        rows.append((_STYLE["collapsed"][0], "collapsed module (op count)"))
    if "ref" in kinds:
        rows.append(("#fafafa", "from ...: inputs whose edges are too long to draw (hover: all)"))
    return rows


def _bg(colour: str) -> str:
    return f' bgcolor="{colour}"' if colour else ""


def _legend(g: Any, view: GraphView, span: tuple[float, float] | None) -> None:
    stage, metric = view.stage, view.metric
    kinds = {n.kind for n in view.nodes}
    muted = span is not None or bool(view.categories)
    cells = "".join(
        f'<tr><td{_bg(c)} width="14"> </td><td align="left">{html.escape(t)}</td></tr>'
        for c, t in _legend_rows(stage, kinds, muted, view.partition)
    )
    if span is not None and view.metric_bands is not None:
        cells += _band_rows(view.metric_bands, metric)
    elif span is not None:
        cells += _colour_bar(span, metric, view.higher_is_better)
    if view.categories:
        cells += f'<tr><td colspan="2" align="left">{html.escape(metric or "class")}:</td></tr>'
        cells += "".join(
            f'<tr><td bgcolor="{c}" width="14"> </td><td align="left">{html.escape(t)}</td></tr>'
            for t, c in view.categories
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
        edge_attr={"arrowsize": "0.6", "color": "#555555", "fontname": "Helvetica"},
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
    span = _metric_range(view)
    muted = span is not None or bool(view.categories)  # colours that mean something else

    def draw(sub: Any, node: ViewNode) -> None:
        marked_node = _is_highlighted(node, marked)
        higher, bands = view.higher_is_better, view.metric_bands
        _add_node(sub, node, marked_node, span, view.metric, higher, muted, bands)

    _emit(g, "", tree, members, draw, dict(view.module_types))
    for e in view.edges:
        g.edge(e.src, e.dst, **_edge_attrs(e))
    if legend:
        _legend(g, view, span)
    return g


def _edge_attrs(edge: ViewEdge) -> dict[str, str]:
    attrs: dict[str, str] = {}
    if edge.label:
        attrs.update(label=edge.label, fontsize="8", fontcolor="#1f4e79")
    if edge.tooltip:
        attrs.update(tooltip=edge.tooltip, labeltooltip=edge.tooltip)
    if edge.style == "float":
        attrs.update(style="dashed", color="#aaaaaa", fontcolor="#888888")
    if edge.style == "ref":
        attrs.update(style="dotted", color="#9e9e9e")
    return attrs
