"""A graph exported from a quant_nn model, read into drawable records: one marker per quantizer.

Each TensorQuantizer call becomes one small marker on the edge it quantizes, read from
:func:`qviz.engine.tensor.records.quantizer_records`: its ATen arithmetic (amax buffer,
``div``, ``reciprocal``, ``round``, ``clamp``, ``mul``, or a ``fake_quantize`` op) is not drawn.
The marker says the grid, the amax, the PyTorch-convention scale (``amax / quant_max``) and the
calibration method: ``int8 amax=4.52 scale=0.0356 entropy``; a per-channel quantizer shows the
range of its amax and scale, a dynamic one ``dynamic``. Input quantizers are teal, weight
quantizers yellow (their ``group`` is 0 or 1: a colour, not a sharing group). A weight's marker
sits on the weight edge; with ``show_params`` the weight itself is drawn before it.

Example:
    >>> import torch, qviz
    >>> from qviz.engine import quant_nn
    >>> layer = quant_nn.QuantLinear(4, 2)
    >>> layer.input_quantizer.amax = 4.52
    >>> gm = qviz.export(layer, (torch.randn(1, 4),))
    >>> view = quantizer_view(gm)
    >>> [(n.label, n.detail) for n in view.nodes if n.kind == "marker"]
    [('int8 amax=4.52 scale=0.0356', ''), ('int8/ch0 dynamic', '')]
"""

from __future__ import annotations

from torch.fx import GraphModule, Node

from qviz.engine.tensor.records import QuantizerRecord, quantizer_records, short_values
from qviz.viz.graph.graph_records import (
    GraphView,
    ViewEdge,
    ViewNode,
    base_node,
    graph_edges,
    hidden,
)

#: The stage name of a graph exported from a quant_nn model.
STAGE = "quant_nn"
_ROLE_GROUP = {"input": 0, "weight": 1}
_AMAX_BUFFER = "_amax"  # TensorQuantizer's buffer


def marker_name(record: QuantizerRecord, call: int = 0) -> str:
    """The drawn name of a quantizer's marker: ``tq/<module path>`` (``@k`` for call k > 0).

    Example:
        >>> from qviz.engine.tensor.records import quantizer_records
        >>> from qviz.engine import quant_nn
        >>> marker_name(quantizer_records(quant_nn.QuantMaxPool2d(2))[0])
        'tq/_input_quantizer'
    """
    return f"tq/{record.name}" + (f"@{call}" if call else "")


def marker_label(record: QuantizerRecord) -> tuple[str, str]:
    """``(label, detail)`` of a quantizer's marker.

    Per tensor: ``("int8 amax=4.52 scale=0.0356 max", "")``; per channel (``/ch0``: one amax
    per index of axis 0): ``("int8/ch0 max", "amax=0.0785..0.131 (64 ch)\\nscale=...")``;
    dynamic: ``("int8 dynamic", "")``. The method is left out when no calibration method
    computed the amax (set by hand, or loaded from a state_dict): the tooltip says so.
    """
    grid = record.dtype
    if record.per_channel:
        grid += "/ch" + ",".join(str(a) for a in record.axis or ())
    grid += " narrow" if record.narrow_range else ""
    if record.dynamic:
        return f"{grid} dynamic", ""
    method = f" {record.method}" if record.calibrated else ""
    if record.per_channel:
        scale = short_values(record.scale, count=False)
        return f"{grid}{method}", f"amax={record.amax_text}\\nscale={scale}"
    return f"{grid} amax={record.amax_text} scale={record.scale[0]:.3g}{method}", ""


def _tooltip(record: QuantizerRecord, index: int) -> str:
    call = record.calls[index]
    kind = f"{record.layer_type} " if record.layer_type else ""
    lines = [
        f"{record.name}: {record.role} quantizer of {kind}{record.layer or 'the model'}",
        f"{record.dtype} [{record.quant_min}, {record.quant_max}]"
        + (f" per-channel axis={record.axis}" if record.per_channel else " per-tensor")
        + (" narrow range" if record.narrow_range else ""),
    ]
    if record.dynamic:
        lines.append("dynamic: amax computed from each input")
    else:
        lines.append(f"amax={record.amax_text} scale=amax/{record.quant_max}={record.scale_text}")
    if record.calibrated:
        lines.append(f"calibration: {record.method} ({record.calibrator})")
    elif not record.dynamic:
        lines.append(
            f"amax set by hand or loaded from a state_dict (descriptor's calib_method: "
            f"{record.method}, {record.calibrator})"
        )
    lines.append(f"quantizes {call.producer} -> {', '.join(call.consumers)}")
    lines.append(f"nodes: {', '.join(call.nodes)}")
    return "\\n".join(lines)


def _markers(records: tuple[QuantizerRecord, ...]) -> tuple[dict[str, ViewNode], dict[str, str]]:
    """Each call's marker, and ``{output node of the call: marker name}``."""
    markers: dict[str, ViewNode] = {}
    outputs: dict[str, str] = {}
    for record in records:
        label, detail = marker_label(record)
        for index, call in enumerate(record.calls):
            name = marker_name(record, index)
            tooltip = _tooltip(record, index)
            group = _ROLE_GROUP.get(record.role, 0)
            refs = (record.name,)
            markers[name] = ViewNode(
                name=name,
                kind="marker",
                label=label,
                detail=detail,
                module=record.layer,
                group=group,
                tooltip=tooltip,
                refs=refs,
            )
            outputs[call.output] = name
    return markers, outputs


def _call_text(node: Node, quantized: dict[str, str]) -> str:
    """``conv2d_3 = conv2d(conv1.0._input_quantizer(max_pool2d), ...)``: inputs named past the
    quantizers' hidden arithmetic."""
    if node.op != "call_function":
        return node.format_node()

    def name(arg: object) -> str:
        if isinstance(arg, Node):
            return quantized.get(arg.name, arg.name)
        if isinstance(arg, list | tuple):
            return "[" + ", ".join(name(a) for a in arg) + "]"
        return repr(arg)

    op = getattr(node.target, "__name__", str(node.target))
    return f"{node.name} = {op}({', '.join(name(a) for a in node.args)})"


def quantizer_view(
    model: GraphModule,
    records: tuple[QuantizerRecord, ...] | None = None,
    show_params: bool = False,
) -> GraphView:
    """The drawable records of a graph exported from a quant_nn model (stage ``"quant_nn"``).

    Args:
        model: the graph module :func:`qviz.export` captured from a quant_nn model.
        records: its :func:`~qviz.engine.tensor.records.quantizer_records` (read here when
            not given).
        show_params: also draw parameters (a weight is then drawn before its quantizer's
            marker); the quantizers' amax buffers are never drawn.
    """
    records = quantizer_records(model) if records is None else records
    inside = {name for r in records for name in r.nodes}
    quantized = {
        call.output: f"{r.name}({call.producer or ''})" for r in records for call in r.calls
    }
    nodes: dict[str, ViewNode] = {}
    for node in model.graph.nodes:
        if node.name in inside or hidden(node, show_params, set()):
            continue
        if node.op == "get_attr" and str(node.target).rpartition(".")[2] == _AMAX_BUFFER:
            continue  # a quantizer's amax (a disabled one's too) is its marker's label
        nodes[node.name] = base_node(node, "op", _call_text(node, quantized))
    markers, outputs = _markers(records)
    edges: dict[tuple[str, str], None] = {}
    for record in records:
        for index, call in enumerate(record.calls):
            if call.producer in nodes:
                edges[(call.producer, marker_name(record, index))] = None
    for p, c in graph_edges(model, set(nodes) | set(outputs), set()):
        if c in nodes and (p in nodes or p in outputs):
            edges[(outputs.get(p, p), c)] = None
    return GraphView(
        stage=STAGE,
        nodes=(*nodes.values(), *markers.values()),
        edges=tuple(ViewEdge(a, b) for a, b in edges),
    )
