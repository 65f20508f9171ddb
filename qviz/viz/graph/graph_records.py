"""The records a graph drawing is made of, and the blocks that read them from fx nodes.

:class:`GraphView` holds the boxes (:class:`ViewNode`) and arrows (:class:`ViewEdge`) of a model
at one stage; :mod:`qviz.viz.graph.read_graph` and :mod:`qviz.viz.graph.quantizer_view` build
them with the node-level functions here, and :mod:`qviz.viz.graph.dot` draws them.

Example:
    >>> import torch
    >>> gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    >>> boxes = [base_node(n, "op") for n in gm.graph.nodes if not hidden(n, False, set())]
    >>> [(b.kind, b.label) for b in boxes]
    [('input', 'input input_1'), ('op', '0'), ('op', '1'), ('output', 'output')]
    >>> graph_edges(gm, {b.name for b in boxes}, set())
    [('input_1', '_0'), ('_0', '_1'), ('_1', 'output')]
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import GraphModule, Node

from qviz.display.bands import Bands


@dataclass(frozen=True, kw_only=True)
class ViewNode:
    """One box to draw.

    ``kind`` is one of ``input``, ``output``, ``param``, ``op``, ``float`` (an op the plan left
    in float), ``marker`` (an observer on an edge), ``quantize``, ``dequantize``, ``collapsed``,
    ``ref`` (the names of a node's inputs whose edges are too long to draw, see
    :mod:`qviz.viz.graph.long_edges`).
    ``refs`` are the plan's tensors a marker stands for; ``count`` the ops inside a collapsed box;
    ``value`` a metric drawn as the box's colour (see ``graph(metrics=...)``); ``kernel`` what a
    lowered program runs the op on (``"integer"`` or ``"float"``, see ``graph(lowered=...)``)
    and ``kernel_op`` that kernel's operator, ``kernel_reason`` why a float kernel runs it (the
    backend's reason, shown on hover, also on a collapsed box); ``category`` a class drawn as
    the box's colour, ``(name, colour)`` (see ``graph(metrics=diagnosis,
    metric_column="cause")``).
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
    value: float | None = None
    kernel: str = ""
    kernel_op: str = ""
    category: tuple[str, str] | None = None
    kernel_reason: str = ""


@dataclass(frozen=True)
class ViewEdge:
    """An arrow from ``src`` to ``dst`` (names of :class:`ViewNode`).

    ``label`` is short text on the arrow (an annotated input spec), ``tooltip`` its full text,
    ``style`` ``""``, ``"float"`` (an input the annotation leaves unquantized: grey, dashed) or
    ``"ref"`` (from a reference box to the node whose long inputs it names: grey, dotted).
    """

    src: str
    dst: str
    label: str = ""
    tooltip: str = ""
    style: str = ""


@dataclass(frozen=True, kw_only=True)
class GraphView:
    """What to draw: the stage, the boxes, the arrows, and the type of each module path.

    ``metric`` names the values carried by :attr:`ViewNode.value` (``""`` when there are none);
    ``metric_span`` fixes the colour scale (None: the values' min..max) and
    ``higher_is_better`` says which end is green; ``partition`` names the backend whose
    kernels the ops are marked with ("" when none); ``categories`` lists the classes the
    boxes are coloured by, ``(name, colour)`` each, for the legend (empty when none);
    ``metric_bands`` (a :class:`qviz.display.bands.Bands`) colours the values by fixed bands
    instead of the span's gradient (None: the gradient).
    """

    stage: str
    nodes: tuple[ViewNode, ...]
    edges: tuple[ViewEdge, ...]
    module_types: tuple[tuple[str, str], ...] = ()
    metric: str = ""
    metric_span: tuple[float, float] | None = None
    higher_is_better: bool = True
    partition: str = ""
    categories: tuple[tuple[str, str], ...] = ()
    metric_bands: Bands | None = None


def op_name(node: Node) -> str:
    """The op a node runs: ``conv2d`` for ``aten.conv2d.default``, a submodule's path."""
    name = getattr(node.target, "__name__", str(node.target))
    return name.split(".")[0] if node.op == "call_function" else name


def module_of(node: Node) -> tuple[str, dict[str, str]]:
    """The innermost module path of ``node`` and the type of each path on its stack."""
    stack = node.meta.get("nn_module_stack") or {}
    types = {}
    path = ""
    for value in stack.values():
        if isinstance(value, tuple) and len(value) == 2:
            path = str(value[0])
            types[path] = str(value[1]).rsplit(".", 1)[-1]
    return path, types


def hidden(node: Node, show_params: bool, observers: set[str]) -> bool:
    """Whether ``node`` is left out of a drawing: an observer or guard call, or a parameter
    (unless ``show_params``)."""
    if node.op == "call_module":
        return str(node.target) in observers or str(node.target).startswith("_guards")
    return node.op == "get_attr" and not show_params


def base_node(node: Node, kind: str, tooltip: str = "") -> ViewNode:
    """The box of ``node``: an input, the output, a parameter, or an op of ``kind``."""
    module, _ = module_of(node)
    if node.op == "placeholder":
        return ViewNode(name=node.name, kind="input", label=f"input {node.name}")
    if node.op == "output":
        return ViewNode(name=node.name, kind="output", label="output")
    if node.op == "get_attr":
        return ViewNode(
            name=node.name, kind="param", label=str(node.target), tooltip=tooltip, module=module
        )
    label = op_name(node)
    detail = node.name if node.name != label else ""
    return ViewNode(
        name=node.name, kind=kind, label=label, detail=detail, module=module, tooltip=tooltip
    )


def source_of(node: Node, observers: set[str]) -> Node:
    """The node an input really comes from, past the observer calls in between."""
    while node.op == "call_module" and str(node.target) in observers and node.args:
        node = node.args[0]
    return node


def module_types(gm: GraphModule) -> tuple[tuple[str, str], ...]:
    """``(module path, type name)`` of every module on the graph's nodes' stacks, sorted."""
    types: dict[str, str] = {}
    for node in gm.graph.nodes:
        types.update(module_of(node)[1])
    return tuple(sorted(types.items()))


def graph_edges(gm: GraphModule, visible: set[str], observers: set[str]) -> list[tuple[str, str]]:
    """``(producer, consumer)`` of each input of the ``visible`` nodes, past observers, in
    graph order."""
    edges: dict[tuple[str, str], None] = {}
    for node in gm.graph.nodes:
        if node.name not in visible:
            continue
        for arg in node.all_input_nodes:
            edges[(source_of(arg, observers).name, node.name)] = None
    return list(edges)
