"""The module hierarchy of a graph view: which boxes to collapse, which clusters to draw.

Each op carries the innermost module path it came from (``nn_module_stack``), e.g.
``layer1.0.conv1``. Collapsing merges every op under a module path into one box labelled with
the path and its op count; observer markers between two ops of the same box disappear with them.
A collapsed box carries the lowest (worst) metric value of its members (or, coloured by class, the
classes of its members), and says how many of its ops were left in float.

Example:
    >>> from qviz.viz.graph.graph_records import GraphView, ViewEdge, ViewNode
    >>> view = GraphView(stage="float", nodes=(
    ...     ViewNode(name="a", kind="op", label="conv2d", module="block.conv"),
    ...     ViewNode(name="b", kind="op", label="relu", module="block.relu"),
    ...     ViewNode(name="c", kind="output", label="output")), edges=(ViewEdge("a",
    ...     "b"), ViewEdge("b", "c")))
    >>> small = collapse(view, 1)
    >>> [(n.name, n.count) for n in small.nodes], [(e.src, e.dst) for e in small.edges]
    ([('module/block', 2), ('c', 1)], [('module/block', 'c')])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from qviz.errors import ConfigError, closest_names
from qviz.viz.graph.graph_records import GraphView, ViewEdge, ViewNode


def collapsed_path(module: str, collapse_: int | Sequence[str] | None) -> str | None:
    """The module path ``module`` is merged into, or None when it stays expanded."""
    if not module or collapse_ is None:
        return None
    if isinstance(collapse_, int) and not isinstance(collapse_, bool):
        parts = module.split(".")
        return ".".join(parts[:collapse_]) if len(parts) >= collapse_ else None
    for path in collapse_:
        if module == path or module.startswith(f"{path}."):
            return path
    return None


def _check(collapse_: object) -> None:
    if collapse_ is None:
        return
    if isinstance(collapse_, int) and not isinstance(collapse_, bool):
        if collapse_ < 1:
            raise ConfigError(
                f"collapse={collapse_}: give a depth >= 1, a list of module paths or None"
            )
        return
    if isinstance(collapse_, str) or not all(isinstance(p, str) for p in collapse_):  # type: ignore[union-attr]
        raise ConfigError(
            f"collapse={collapse_!r}: give a depth (int), a list of module paths such as "
            f"['layer1'], or None"
        )


def _check_paths(view: GraphView, paths: Sequence[str], modules: Iterable[str]) -> None:
    """A path that is no module of the model (drawn or not) is a typo: say so, with the closest."""
    known = set(modules) - {""}
    for node in view.nodes:
        parts = node.module.split(".") if node.module else []
        known.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    for path in paths:
        if path not in known:
            raise ConfigError(
                f"collapse: no module {path!r} in this graph ({closest_names(path, known)}); "
                f"give module paths as model.named_modules() spells them (e.g. 'layer1')"
            )


def _representatives(view: GraphView, collapse_: int | Sequence[str] | None) -> dict[str, str]:
    rep = {}
    for node in view.nodes:
        path = collapsed_path(node.module, collapse_) if node.kind != "marker" else None
        rep[node.name] = f"module/{path}" if path is not None else node.name
    neighbours: dict[str, set[str]] = {}
    for e in view.edges:
        neighbours.setdefault(e.src, set()).add(e.dst)
        neighbours.setdefault(e.dst, set()).add(e.src)
    for node in view.nodes:  # a marker inside one collapsed box vanishes into it
        if node.kind == "marker":
            reps = {rep[n] for n in neighbours.get(node.name, ()) if rep[n] != n}
            outside = [n for n in neighbours.get(node.name, ()) if rep[n] == n]
            if len(reps) == 1 and not outside:
                rep[node.name] = reps.pop()
    return rep


def collapse(
    view: GraphView, collapse_: int | Sequence[str] | None, modules: Iterable[str] = ()
) -> GraphView:
    """``view`` with every module at depth ``collapse_`` (or named in it) merged into one box.

    Args:
        view: the records of :func:`qviz.viz.graph.read_graph.read_graph`.
        collapse_: a depth (``2`` keeps ``layer1.0`` and merges ``layer1.0.conv1`` into it),
            module paths (``["layer1"]``), or None to keep everything.
        modules: module paths of the model that may have no drawn node (a BatchNorm folded
            into its conv); collapsing one of them is no error.

    Raises:
        ConfigError: ``collapse_`` is neither a positive int, a list of paths nor None, or a
            path names no module of the graph (with the closest paths).
    """
    _check(collapse_)
    if collapse_ is None:
        return view
    if not isinstance(collapse_, int):
        _check_paths(view, collapse_, modules)
    rep = _representatives(view, collapse_)
    types = dict(view.module_types)
    nodes: dict[str, ViewNode] = {}
    members: dict[str, list[ViewNode]] = {}
    for node in view.nodes:
        name = rep[node.name]
        if name == node.name:
            nodes[name] = node
            continue
        members.setdefault(name, []).append(node)
        if name not in nodes:
            path = name.removeprefix("module/")
            parent = path.rpartition(".")[0]
            nodes[name] = ViewNode(
                name=name, kind="collapsed", label=path, detail=types.get(path, ""), module=parent
            )
    for name, inside in members.items():
        if any(n.kind != "marker" for n in inside):
            nodes[name] = _box(nodes[name], inside, view.higher_is_better)
    return replace(view, nodes=tuple(nodes.values()), edges=_merge_edges(view, rep))


def _box(box: ViewNode, inside: list[ViewNode], higher_is_better: bool) -> ViewNode:
    """A collapsed box for the nodes ``inside`` it: their op count, their worst metric value
    (or their classes), the ops left in float, and the kernels a lowered program runs them on
    (float if any is)."""
    count = sum(n.count for n in inside if n.kind != "marker")
    values = [n.value for n in inside if n.value is not None]
    value = (max(values) if not higher_is_better else min(values)) if values else None
    detail, tooltip = box.detail, ""
    left = [n.name for n in inside if n.kind == "float"]
    if left:  # a box must not hide that some of its ops stay in float
        note = f"{len(left)} left in float"
        detail = f"{detail}\\n{note}" if detail else note
        tooltip = f"left in float: {', '.join(left)}"
    kernel, kernel_op = "", ""
    runs = [n for n in inside if n.kernel]
    floats = [n for n in runs if n.kernel == "float"]
    if runs:
        kernel = "float" if floats else "integer"
        plural = "" if len(runs) == 1 else "s"
        kernel_op = (
            f"{len(floats)} of {len(runs)} op{plural}" if floats else f"{len(runs)} op{plural}"
        )
        if floats:  # each with the backend's reason, as on the op's own box
            names = "\\n".join(
                f"{n.name} ({n.kernel_op}): {n.kernel_reason}" if n.kernel_reason
                else f"{n.name} ({n.kernel_op})" for n in floats
            )  # fmt: skip
            tooltip = "\\n".join(t for t in (f"float kernels:\\n{names}", tooltip) if t)
    return replace(
        box, detail=detail, tooltip=tooltip, count=count, value=value, kernel=kernel,
        kernel_op=kernel_op, category=_box_category(inside),
    )  # fmt: skip


def _box_category(inside: list[ViewNode]) -> tuple[str, str] | None:
    """The classes of a box's members (``graph(metrics=diagnosis, metric_column="cause")``):
    their names in graph order, in the colour of the first, so a box never hides a finding."""
    found = [n.category for n in inside if n.category is not None]
    if not found:
        return None
    names = list(dict.fromkeys(name for name, _ in found))
    return ", ".join(names), found[0][1]


def _merge_edges(view: GraphView, rep: dict[str, str]) -> tuple[ViewEdge, ...]:
    """Edges between representatives; an edge that stands for one original keeps its label."""
    merged: dict[tuple[str, str], list[ViewEdge]] = {}
    for e in view.edges:
        if rep[e.src] != rep[e.dst]:
            merged.setdefault((rep[e.src], rep[e.dst]), []).append(e)
    edges = []
    for (src, dst), originals in merged.items():
        e = originals[0]
        if len(originals) == 1:
            edges.append(ViewEdge(src, dst, e.label, e.tooltip, e.style))
        else:
            edges.append(ViewEdge(src, dst))
    return tuple(edges)


def cluster_paths(view: GraphView) -> list[str]:
    """Module paths worth a cluster: those holding two ops or more (sorted, parents first)."""
    held: dict[str, int] = {}
    for node in view.nodes:
        if node.kind in ("marker", "ref"):
            continue
        parts = node.module.split(".") if node.module else []
        for depth in range(1, len(parts) + 1):
            path = ".".join(parts[:depth])
            held[path] = held.get(path, 0) + 1
    return sorted(p for p, n in held.items() if n >= 2)
