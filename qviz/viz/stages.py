"""A model at one stage of the flow, read into drawable records: ops, observer markers, edges.

Three stages are recognised from the model itself: ``"float"`` (a captured graph),
``"observed"`` (``prepare_pt2e``'s result: observers and ``.plan``) and ``"converted"``
(``convert_pt2e``'s result: quantize/dequantize ops). Observers are not read from the graph's
observer calls but from the plan's records: each observed edge or node output becomes a small
marker on the edges it observes, labelled with its sharing group.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> view = read_graph(prepared)
    >>> view.stage, sorted({n.kind for n in view.nodes})
    ('observed', ['input', 'marker', 'op', 'output'])
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from torch.fx import GraphModule, Node

from qviz.engine.plan import GroupRecord, QuantPlan, TensorRecord, TensorRef

__all__ = ["GraphView", "ViewEdge", "ViewNode", "describe_group", "read_graph", "stage_of"]

_Q_NAMESPACE = "quantized_decomposed"


@dataclass(frozen=True)
class ViewNode:
    """One box to draw.

    ``kind`` is one of ``input``, ``output``, ``param``, ``op``, ``float`` (an op the plan left
    in float), ``marker`` (an observer on an edge), ``quantize``, ``dequantize``, ``collapsed``.
    ``refs`` are the plan's tensors a marker stands for; ``count`` the ops inside a collapsed box.
    """

    name: str
    kind: str
    label: str
    detail: str = ""
    module: str = ""
    group: int | None = None
    tooltip: str = ""
    refs: tuple[str, ...] = ()
    count: int = 1


@dataclass(frozen=True)
class ViewEdge:
    """An arrow from ``src`` to ``dst`` (names of :class:`ViewNode`)."""

    src: str
    dst: str


@dataclass(frozen=True)
class GraphView:
    """What to draw: the stage, the boxes, the arrows, and the type of each module path."""

    stage: str
    nodes: tuple[ViewNode, ...]
    edges: tuple[ViewEdge, ...]
    module_types: tuple[tuple[str, str], ...] = ()


def stage_of(model: GraphModule) -> str:
    """``"observed"``, ``"converted"`` or ``"float"``, read from the model's graph and plan."""
    plan = getattr(model, "plan", None)
    observers = {g.observer for g in plan.groups} if isinstance(plan, QuantPlan) else set()
    for node in model.graph.nodes:
        if node.op == "call_module" and str(node.target) in observers:
            return "observed"
        if node.op == "call_function" and _is_qdq(node):
            return "converted"
    return "float"


def describe_group(g: GroupRecord) -> str:
    """``g3 observer_3: observed int8 [-128, 127] per_tensor_affine HistogramObserver``."""
    s = g.spec
    text = f"g{g.group} {g.observer}: {s.kind} {s.dtype} [{s.quant_min}, {s.quant_max}]"
    text += f" {s.qscheme or ''} {s.observer or ''}".rstrip()
    if s.kind == "derived":
        text += " derived from " + ", ".join(str(r) for r in s.derived_from)
    if g.qparams is not None:
        text += " " + qparams_text(g)
    return text


def qparams_text(g: GroupRecord) -> str:
    """``scale=0.0224 zp=-9``, or ``scale=0.001..0.02 (64 ch)`` per channel; "" before convert."""
    q = g.qparams
    if q is None and g.spec.kind == "fixed":
        return f"scale={g.spec.scale:.4g} zp={g.spec.zero_point}"
    if q is None:
        return ""
    if isinstance(q.scale, tuple):
        return f"scale={min(q.scale):.3g}..{max(q.scale):.3g} ({len(q.scale)} ch)"
    return f"scale={q.scale:.4g} zp={q.zero_point}"


def _is_qdq(node: Node) -> bool:
    return str(getattr(node.target, "namespace", "")) == _Q_NAMESPACE or str(
        node.target
    ).startswith(f"{_Q_NAMESPACE}.")


def _op_name(node: Node) -> str:
    name = getattr(node.target, "__name__", str(node.target))
    return name.split(".")[0] if node.op == "call_function" else name


def _module_of(node: Node) -> tuple[str, dict[str, str]]:
    """The innermost module path of ``node`` and the type of each path on its stack."""
    stack = node.meta.get("nn_module_stack") or {}
    types = {}
    path = ""
    for value in stack.values():
        if isinstance(value, tuple) and len(value) == 2:
            path = str(value[0])
            types[path] = str(value[1]).rsplit(".", 1)[-1]
    return path, types


def _hidden(node: Node, show_params: bool, observers: set[str]) -> bool:
    if node.op == "call_module":
        return str(node.target) in observers or str(node.target).startswith("_guards")
    return node.op == "get_attr" and not show_params


def _base_node(node: Node, kind: str, tooltip: str = "") -> ViewNode:
    module, _ = _module_of(node)
    if node.op == "placeholder":
        return ViewNode(node.name, "input", f"input {node.name}")
    if node.op == "output":
        return ViewNode(node.name, "output", "output")
    if node.op == "get_attr":
        return ViewNode(node.name, "param", str(node.target), tooltip=tooltip, module=module)
    label = _op_name(node)
    detail = node.name if node.name != label else ""
    return ViewNode(node.name, kind, label, detail, module, tooltip=tooltip)


def _source(node: Node, observers: set[str]) -> Node:
    while node.op == "call_module" and str(node.target) in observers and node.args:
        node = node.args[0]
    return node


def _types(gm: GraphModule) -> tuple[tuple[str, str], ...]:
    types: dict[str, str] = {}
    for node in gm.graph.nodes:
        types.update(_module_of(node)[1])
    return tuple(sorted(types.items()))


def _graph_edges(gm: GraphModule, visible: set[str], observers: set[str]) -> list[tuple[str, str]]:
    edges: dict[tuple[str, str], None] = {}
    for node in gm.graph.nodes:
        if node.name not in visible:
            continue
        for arg in node.all_input_nodes:
            edges[(_source(arg, observers).name, node.name)] = None
    return list(edges)


def _marker(
    plan: QuantPlan, name: str, recs: list[TensorRecord], module: str, detail: str
) -> ViewNode:
    group = plan.group(recs[0].group)
    lines = [describe_group(group), "observes:"]
    for rec in recs:
        via = f" via {rec.via}" if rec.via is not None and rec.how != "own spec" else ""
        lines.append(f"  {rec.tensor} [{rec.how}{via}]")
    return ViewNode(
        name,
        "marker",
        f"g{group.group}",
        detail,
        module,
        group.group,
        "\\n".join(lines),
        tuple(str(r.tensor) for r in recs),
    )


def _observed(gm: GraphModule, plan: QuantPlan, show_params: bool) -> GraphView:
    observers = {g.observer for g in plan.groups}
    floats = {f.node: f for f in plan.float_nodes}
    nodes: dict[str, ViewNode] = {}
    for node in gm.graph.nodes:
        if _hidden(node, show_params, observers):
            continue
        f = floats.get(node.name)
        tip = f"left in float: {f.reason}" + (f" ({f.detail})" if f.detail else "") if f else ""
        nodes[node.name] = _base_node(node, "float" if f else "op", tip or node.format_node())
    calls = {n.name for n in gm.graph.nodes if n.op == "call_module" and n.target in observers}
    edges = _graph_edges(gm, {n.name for n in gm.graph.nodes} - calls, observers)
    return _place_markers(plan, nodes, edges)


def _place_markers(
    plan: QuantPlan, nodes: dict[str, ViewNode], edges: list[tuple[str, str]]
) -> GraphView:
    """Each edge ``p -> c`` becomes ``p -> [p's output observer] -> [edge observer] -> c``."""
    by_ref = {rec.tensor: rec for rec in plan.tensors}
    out_edges: list[ViewEdge] = []
    markers: dict[str, ViewNode] = {}
    for p, c in edges:
        if c not in nodes:
            continue
        chain = [p] if p in nodes else []
        out = by_ref.get(TensorRef(p))
        edge = by_ref.get(TensorRef(p, c))
        if out is not None:
            name = f"obs/{p}"
            if name not in markers:
                same = [r for r in plan.tensors if r.tensor.producer == p and r.group == out.group]
                module, detail = (nodes[p].module, "") if p in nodes else (nodes[c].module, p)
                markers[name] = _marker(plan, name, same, module, detail)
            chain.append(name)
        if edge is not None and (out is None or edge.group != out.group):
            name = f"obs/{p}/{c}"
            markers[name] = _marker(plan, name, [edge], nodes[c].module, "" if p in nodes else p)
            chain.append(name)
        chain.append(c)
        out_edges.extend(ViewEdge(a, b) for a, b in pairwise(chain))
    everything = {**nodes, **markers}
    unique = tuple(dict.fromkeys(out_edges))
    return GraphView("observed", tuple(everything.values()), unique)


def _qdq_group(node: Node, plan: QuantPlan | None) -> GroupRecord | None:
    """The plan's group a quantize/dequantize op executes: by producer/consumer and scale."""
    if plan is None:
        return None
    source = node
    while source.op == "call_function" and _is_qdq(source) and source.args:
        source = source.args[0]
    users = {u.name for u in node.users}
    scale = node.args[1] if len(node.args) > 1 else None
    candidates = [
        plan.group(r.group)
        for r in plan.tensors
        if r.tensor.producer == source.name or r.tensor.consumer in users
    ]
    for g in dict.fromkeys(candidates):
        q = g.qparams
        if q is None:
            continue
        if isinstance(scale, float) and q.scale == scale:
            return g
        if isinstance(scale, Node) and isinstance(q.scale, tuple):
            return g
    return None


def _qdq_node(gm: GraphModule, node: Node, plan: QuantPlan | None) -> ViewNode:
    group = _qdq_group(node, plan)
    op = _op_name(node)
    kind = "quantize" if op.startswith("quantize") else "dequantize"
    label = op.replace("_per_tensor", "").replace("_per_channel", " per-channel")
    detail = qparams_text(group) if group is not None else ""
    src = node.args[0] if node.args else None
    if isinstance(src, Node) and src.op == "get_attr":
        value = _attr(gm, str(src.target))
        dtype = str(getattr(value, "dtype", "")).replace("torch.", "")
        detail = f"{dtype} weight {tuple(getattr(value, 'shape', ()))}\\n{detail}".strip()
    tooltip = describe_group(group) if group is not None else node.format_node()
    # no module of its own: sit with the op it feeds (dequantize) or reads (quantize)
    users = list(node.users)
    near = users[0] if kind == "dequantize" and len(users) == 1 else src
    module = _module_of(near)[0] if isinstance(near, Node) else ""
    return ViewNode(node.name, kind, label, detail, module, group.group if group else None, tooltip)


def _attr(gm: GraphModule, target: str) -> object:
    owner, _, name = target.rpartition(".")
    return getattr(gm.get_submodule(owner), name, None)


def _converted(gm: GraphModule, plan: QuantPlan | None, show_params: bool) -> GraphView:
    floats = {f.node: f for f in plan.float_nodes} if plan is not None else {}
    nodes: dict[str, ViewNode] = {}
    for node in gm.graph.nodes:
        if _hidden(node, show_params, set()):
            continue
        if node.op == "call_function" and _is_qdq(node):
            nodes[node.name] = _qdq_node(gm, node, plan)
            continue
        f = floats.get(node.name)
        tip = f"left in float: {f.reason}" + (f" ({f.detail})" if f.detail else "") if f else ""
        nodes[node.name] = _base_node(node, "float" if f else "op", tip or node.format_node())
    edges = [
        ViewEdge(p, c) for p, c in _graph_edges(gm, set(nodes), set()) if p in nodes and c in nodes
    ]
    return GraphView("converted", tuple(nodes.values()), tuple(edges))


def _float(gm: GraphModule, show_params: bool) -> GraphView:
    nodes = {
        n.name: _base_node(n, "op", n.format_node())
        for n in gm.graph.nodes
        if not _hidden(n, show_params, set())
    }
    edges = [ViewEdge(p, c) for p, c in _graph_edges(gm, set(nodes), set()) if p in nodes]
    return GraphView("float", tuple(nodes.values()), tuple(edges))


def read_graph(model: GraphModule, *, show_params: bool = False) -> GraphView:
    """The drawable records of ``model`` at its stage (see :func:`stage_of`)."""
    stage = stage_of(model)
    plan = getattr(model, "plan", None)
    plan = plan if isinstance(plan, QuantPlan) else None
    if stage == "observed" and plan is not None:
        view = _observed(model, plan, show_params)
    elif stage == "converted":
        view = _converted(model, plan, show_params)
    else:
        view = _float(model, show_params)
    return GraphView(view.stage, view.nodes, view.edges, _types(model))
