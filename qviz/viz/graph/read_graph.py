"""A model at one stage of the flow, read into drawable records: ops, observer markers, edges.

Five stages are recognised from the model itself: ``"float"`` (a captured graph),
``"annotated"`` (a quantizer's annotations in ``node.meta``, not prepared yet), ``"observed"``
(``prepare_pt2e``'s result: observers and ``.plan``), ``"converted"`` (``convert_pt2e``'s
result: quantize/dequantize ops) and ``"quant_nn"`` (exported from a model of quant_nn layers:
each TensorQuantizer is one marker, see :mod:`qviz.viz.graph.quantizer_view`). Observers are not
read from the graph's observer calls but from the plan's records: each observed edge or node
output becomes a small marker on the edges it observes, labelled with its sharing group.

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

from dataclasses import replace
from itertools import pairwise

from torch.fx import GraphModule, Node

from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.graph.qdq_ops import is_qdq
from qviz.engine.pt2e.plan import (
    QUANTIZABLE_OPS,
    GroupRecord,
    QuantPlan,
    SpecSummary,
    TensorRecord,
    TensorRef,
    plan_of,
)
from qviz.engine.qparams import bits_of_range
from qviz.engine.specs import Q_ANNOTATION_KEY, QuantizationAnnotation, as_annotation
from qviz.engine.tensor.records import is_quantizer_node
from qviz.viz.graph.graph_records import (
    GraphView,
    ViewEdge,
    ViewNode,
    base_node,
    graph_edges,
    hidden,
    module_of,
    module_types,
    op_name,
    source_of,
)
from qviz.viz.graph.quantizer_view import quantizer_view

_Q_NAMESPACE = "quantized_decomposed"


def stage_of(model: GraphModule) -> str:
    """``"observed"``, ``"converted"``, ``"annotated"``, ``"quant_nn"`` or ``"float"``, read
    from the model.

    ``"annotated"``: some node carries ``meta["quantization_annotation"]`` and the model has
    neither observers nor quantize/dequantize ops nor a ``.plan`` (annotated, not prepared).
    ``"quant_nn"``: no plan, and some nodes are a TensorQuantizer's arithmetic (exported from a
    model of quant_nn layers).
    """
    plan = plan_of(model)
    observers = plan.observer_names() if plan is not None else set()
    for node in model.graph.nodes:
        if node.op == "call_module" and str(node.target) in observers:
            return "observed"
        if node.op == "call_function" and _is_qdq(node):
            return "converted"
    if plan is None and any(Q_ANNOTATION_KEY in n.meta for n in model.graph.nodes):
        return "annotated"
    if plan is None and any(is_quantizer_node(n) for n in model.graph.nodes):
        return "quant_nn"
    return "float"


def describe_group(g: GroupRecord) -> str:
    """``g3 activation_post_process_3: observed int8 [-128, 127] per_tensor_affine
    HistogramObserver``."""
    s = g.spec
    text = f"g{g.group} {g.observer}: {s.kind} {s.dtype} [{s.quant_min}, {s.quant_max}]"
    text += f" {s.qscheme or ''} {s.observer or ''}".rstrip()
    if s.kind == "derived":
        text += " derived from " + ", ".join(str(r) for r in s.derived_from)
    if g.qparams is not None:
        text += " " + qparams_text(g)
    return text


_PLAIN_DTYPES = ("int8", "uint8", "qint8", "quint8", None)


def qparams_text(g: GroupRecord) -> str:
    """``scale=0.0224 zp=-9``, or ``scale=0.001..0.02 (64 ch)`` per channel; "" before convert.

    A dtype other than 8-bit integers leads: ``int16 scale=8.7e-05 zp=-271``,
    ``float8_e4m3fn scale=...``, ``float16`` (a half-precision round trip).
    """
    q = g.qparams
    dtype = "" if g.spec.dtype in _PLAIN_DTYPES else f"{g.spec.dtype} "
    if q is None and g.spec.kind == "fixed":
        return f"{dtype}scale={g.spec.scale:.4g} zp={g.spec.zero_point}"
    if q is None:
        return dtype.strip()
    if isinstance(q.scale, tuple):
        return f"{dtype}scale={min(q.scale):.3g}..{max(q.scale):.3g} ({len(q.scale)} ch)"
    return f"{dtype}scale={q.scale:.4g} zp={q.zero_point}"


def _is_qdq(node: Node) -> bool:
    return node.op == "call_function" and (
        is_qdq(node) or str(getattr(node.target, "namespace", "")) == _Q_NAMESPACE
    )


def _call_text(node: Node, observers: set[str]) -> str:
    """``conv2d = conv2d(relu, block_conv1_weight, ...)``: inputs named past their observers
    (an observer call node's fx name is not the observer module's name, so it would mislead)."""
    if node.op != "call_function":
        return node.format_node()

    def name(arg: object) -> str:
        if isinstance(arg, Node):
            return source_of(arg, observers).name
        if isinstance(arg, list | tuple):
            return "[" + ", ".join(name(a) for a in arg) + "]"
        return repr(arg)

    args = ", ".join(name(a) for a in node.args)
    op = getattr(node.target, "__name__", str(node.target))
    return f"{node.name} = {op}({args})"


def _marker(
    plan: QuantPlan, name: str, recs: list[TensorRecord], module: str, detail: str
) -> ViewNode:
    group = plan.group(recs[0].group)
    lines = [describe_group(group), "observes:"]
    for rec in recs:
        via = f" via {rec.via}" if rec.via is not None and rec.how != "own spec" else ""
        lines.append(f"  {rec.tensor} [{rec.how}{via}]")
    return ViewNode(
        name=name,
        kind="marker",
        label=f"g{group.group}",
        detail=detail,
        module=module,
        group=group.group,
        tooltip="\\n".join(lines),
        refs=tuple(str(r.tensor) for r in recs),
    )


def _observed(gm: GraphModule, plan: QuantPlan, show_params: bool) -> GraphView:
    observers = plan.observer_names()
    floats = {f.node: f for f in plan.float_nodes}
    nodes: dict[str, ViewNode] = {}
    for node in gm.graph.nodes:
        if hidden(node, show_params, observers):
            continue
        f = floats.get(node.name)
        tip = f"left in float: {f.reason}" + (f" ({f.detail})" if f.detail else "") if f else ""
        text = tip or _call_text(node, observers)
        nodes[node.name] = base_node(node, "float" if f else "op", text)
    calls = {n.name for n in gm.graph.nodes if n.op == "call_module" and n.target in observers}
    edges = graph_edges(gm, {n.name for n in gm.graph.nodes} - calls, observers)
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
    return GraphView(stage="observed", nodes=tuple(everything.values()), edges=unique)


def _qdq_group(node: Node, plan: QuantPlan | None) -> GroupRecord | None:
    """The plan's group a quantize/dequantize op executes: by producer/consumer and scale."""
    if plan is None:
        return None
    recorded = plan.group_of_node(node.name)
    if recorded is not None or any(g.nodes for g in plan.groups):
        return recorded
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


def weight_kind(dtype: str, group: GroupRecord | None) -> str:
    """How a stored weight is labelled: its storage dtype, or its bit width when its integer
    range is narrower than the dtype's (4-bit weights are stored in int8: ``4-bit (int8)``).

    Example:
        >>> weight_kind("int8", None)
        'int8'
    """
    spec = group.spec if group is not None else None
    low, high = getattr(spec, "quant_min", None), getattr(spec, "quant_max", None)
    if not isinstance(low, int) or not isinstance(high, int) or high <= low:
        return dtype
    bits = bits_of_range(low, high)
    stored = {"int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32}.get(dtype)
    return f"{bits}-bit ({dtype})" if stored is not None and bits < stored else dtype


def _qdq_node(gm: GraphModule, node: Node, plan: QuantPlan | None) -> ViewNode:
    group = _qdq_group(node, plan)
    op = op_name(node)
    kind = "quantize" if op.startswith(("quantize", "choose_qparams")) else "dequantize"
    label = op.replace("_per_tensor", "").replace("_per_channel", " per-channel")
    label = label.replace("_affine", " affine").replace("convert_element_type", "round trip")
    detail = qparams_text(group) if group is not None else ""
    out_dtype = node.kwargs.get("out_dtype") or node.kwargs.get("output_dtype")
    if out_dtype is not None:
        detail = f"{detail} → {str(out_dtype).replace('torch.', '')}".strip()
    src = node.args[0] if node.args else None
    if isinstance(src, Node) and src.op == "get_attr":
        value = get_attr_value(gm, src, default=None)
        stored = weight_kind(str(getattr(value, "dtype", "")).replace("torch.", ""), group)
        detail = f"{stored} weight {tuple(getattr(value, 'shape', ()))}\\n{detail}".strip()
    tooltip = describe_group(group) if group is not None else node.format_node()
    # no module of its own: sit with the op it feeds (dequantize) or reads (quantize)
    users = list(node.users)
    near = users[0] if kind == "dequantize" and len(users) == 1 else src
    module = module_of(near)[0] if isinstance(near, Node) else ""
    return ViewNode(
        name=node.name,
        kind=kind,
        label=label,
        detail=detail,
        module=module,
        group=group.group if group else None,
        tooltip=tooltip,
    )


def _converted(gm: GraphModule, plan: QuantPlan | None, show_params: bool) -> GraphView:
    floats = {f.node: f for f in plan.float_nodes} if plan is not None else {}
    nodes: dict[str, ViewNode] = {}
    for node in gm.graph.nodes:
        if hidden(node, show_params, set()):
            continue
        if node.op == "call_function" and _is_qdq(node):
            nodes[node.name] = _qdq_node(gm, node, plan)
            continue
        f = floats.get(node.name)
        tip = f"left in float: {f.reason}" + (f" ({f.detail})" if f.detail else "") if f else ""
        nodes[node.name] = base_node(node, "float" if f else "op", tip or node.format_node())
    edges = [
        ViewEdge(p, c) for p, c in graph_edges(gm, set(nodes), set()) if p in nodes and c in nodes
    ]
    return GraphView(stage="converted", nodes=tuple(nodes.values()), edges=tuple(edges))


def _float(gm: GraphModule, show_params: bool) -> GraphView:
    nodes = {
        n.name: base_node(n, "op", n.format_node())
        for n in gm.graph.nodes
        if not hidden(n, show_params, set())
    }
    edges = [ViewEdge(p, c) for p, c in graph_edges(gm, set(nodes), set()) if p in nodes]
    return GraphView(stage="float", nodes=tuple(nodes.values()), edges=tuple(edges))


_SCHEMES = {"affine": "aff", "symmetric": "sym"}


def spec_text(spec: SpecSummary) -> tuple[str, str]:
    """A spec as a short edge label and as full tooltip text.

    Example:
        >>> spec_text(SpecSummary(kind="observed", dtype="int8", quant_min=-127, quant_max=127,
        ...     qscheme="per_channel_symmetric", ch_axis=0))[0]
        'int8 [-127,127] sym/ch0'
        >>> spec_text(SpecSummary(kind="fixed", dtype="int8", quant_min=-128, quant_max=127,
        ...     scale=1 / 256, zero_point=-128))[0]
        'fixed s=0.0039 zp=-128'
        >>> spec_text(SpecSummary(kind="shared", shared_with=TensorRef("x", "add")))[0]
        'shares (x -> add)'
    """
    if spec.kind == "shared":
        return f"shares ({spec.shared_with})", f"shared: same observer as {spec.shared_with}"
    scheme = spec.qscheme or ""
    short = f"{spec.dtype} [{spec.quant_min},{spec.quant_max}]"
    short += f" {_SCHEMES.get(scheme.rpartition('_')[2], scheme)}".rstrip()
    if scheme.startswith("per_channel") and spec.ch_axis is not None:
        short += f"/ch{spec.ch_axis}"
    short += " dyn" if spec.is_dynamic else ""
    full = f"{spec.kind} {spec.dtype} [{spec.quant_min}, {spec.quant_max}] {scheme}"
    full += f" ch_axis={spec.ch_axis}" if spec.ch_axis is not None else ""
    full += " dynamic" if spec.is_dynamic else ""
    if spec.kind == "fixed":
        short = f"fixed s={spec.scale:.2g} zp={spec.zero_point}"
        full += f" scale={spec.scale} zero_point={spec.zero_point}"
    if spec.kind == "derived":
        short = "derived from " + ", ".join(str(r) for r in spec.derived_from)
        full += " " + short
    if spec.observer:
        full += f" {spec.observer}"
    return short, full.rstrip()


def _read_annotations(gm: GraphModule) -> dict[str, QuantizationAnnotation]:
    return {
        n.name: as_annotation(n.meta[Q_ANNOTATION_KEY], n)
        for n in gm.graph.nodes
        if n.meta.get(Q_ANNOTATION_KEY) is not None
    }


def _annotated_node(node: Node, ann: QuantizationAnnotation | None) -> ViewNode:
    if ann is None:
        quantizable = node.op == "call_function" and node.target in QUANTIZABLE_OPS
        tip = "not annotated: stays float" if quantizable else node.format_node()
        if "batch_norm" in str(node.target):
            tip += " (prepare_pt2e folds BatchNorm into the conv before it)"
        return base_node(node, "float" if quantizable else "op", tip)
    lines = [node.format_node()]
    for arg, spec in ann.input_qspec_map.items():
        full = spec_text(SpecSummary.of(spec))[1] if spec is not None else "float (None)"
        lines.append(f"input {arg.name}: {full}")
    base = base_node(node, "op")
    detail = [base.detail] if base.detail else []
    if ann.output_qspec is not None:
        short, full = spec_text(SpecSummary.of(ann.output_qspec))
        detail.append(f"out {short}")
        lines.append(f"output: {full}")
    tip = "\\n".join(lines)
    return ViewNode(
        name=node.name,
        kind="op",
        label=base.label,
        detail="\\n".join(detail),
        module=base.module,
        tooltip=tip,
    )


def _annotated_edge(arg: Node, node: Node, ann: QuantizationAnnotation | None) -> ViewEdge:
    if ann is None or arg not in ann.input_qspec_map:
        return ViewEdge(arg.name, node.name)
    spec = ann.input_qspec_map[arg]
    if spec is None:
        tip = f"{arg.name} -> {node.name}: annotated None, stays float"
        return ViewEdge(arg.name, node.name, "float", tip, "float")
    short, full = spec_text(SpecSummary.of(spec))
    return ViewEdge(arg.name, node.name, short, f"{arg.name} -> {node.name}: {full}")


def annotated_view(model: GraphModule, show_params: bool = False) -> GraphView:
    """The records of an annotated, not yet prepared graph: specs on edges and under nodes.

    Each input spec labels its edge (``int8 [-127,127] sym/ch0``, ``fixed s=0.0039 zp=-128``,
    ``shares (x -> add)``, ``derived from a, b``); an output spec is a line ``out ...`` under
    its node; inputs annotated None are grey dashed ``float`` edges and quantizable ops with no
    annotation are grey. Parameters in an annotation are drawn even without ``show_params``.

    Raises:
        ConfigError: a node's ``quantization_annotation`` is not a QuantizationAnnotation.
    """
    anns = _read_annotations(model)
    nodes: dict[str, ViewNode] = {}
    edges: list[ViewEdge] = []
    for node in model.graph.nodes:
        if hidden(node, show_params, set()):
            continue
        ann = anns.get(node.name)
        nodes[node.name] = _annotated_node(node, ann)
        for arg in node.all_input_nodes:
            if hidden(arg, show_params, set()):
                if ann is None or arg not in ann.input_qspec_map:
                    continue
                param = base_node(arg, "param", arg.format_node())
                nodes.setdefault(arg.name, replace(param, module=nodes[node.name].module))
            if arg.name in nodes:
                edges.append(_annotated_edge(arg, node, ann))
    order = {n.name: i for i, n in enumerate(model.graph.nodes)}
    ordered = tuple(sorted(nodes.values(), key=lambda v: order[v.name]))
    return GraphView(stage="annotated", nodes=ordered, edges=tuple(edges))


def read_graph(model: GraphModule, *, show_params: bool = False) -> GraphView:
    """The drawable records of ``model`` at its stage (see :func:`stage_of`)."""
    stage = stage_of(model)
    plan = plan_of(model)
    if stage == "observed" and plan is not None:
        view = _observed(model, plan, show_params)
    elif stage == "annotated":
        view = annotated_view(model, show_params)
    elif stage == "converted":
        view = _converted(model, plan, show_params)
    elif stage == "quant_nn":
        view = quantizer_view(model, show_params=show_params)
    else:
        view = _float(model, show_params)
    return GraphView(
        stage=view.stage, nodes=view.nodes, edges=view.edges, module_types=module_types(model)
    )
