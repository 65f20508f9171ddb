"""The numeric suite's per-node values as ONNX metadata properties, so Netron shows them.

ONNX (IR version 10, onnx 1.16 and later) gives every node ``metadata_props``: string keys and
values that Netron lists under the node's *Metadata*. ``export_onnx(..., report=report)`` writes
on each ONNX node computing a quantized operator of the report

==========================  =================================================================
``qviz.local_sqnr``         dB, the operator's own error (:func:`qviz.numeric.compare`)
``qviz.cumulative_sqnr``    dB, the error of everything up to its output
``qviz.clipped``            share of its float output beyond the output grid
``qviz.scale``              the scale of its output's QuantizeLinear
``qviz.node``               the operator's name in the converted graph (the report's ``node``)
==========================  =================================================================

and on the model ``qviz.numeric_report`` (the report's one-line summary) and
``qviz.output_sqnr``.

Which ONNX nodes compute an operator: torch.onnx names, in each ONNX node's
``pkg.torch.onnx.name_scopes`` property, the FX node of its own ExportedProgram that the ONNX
node was translated from (last entry), and that FX node records its source
(``node.meta["from_node"]``, a tree of ``NodeSource``), down to the graph module handed to
torch.onnx, found by its graph's ``id``. So ``adaptive_avg_pool2d`` of the converted graph,
decomposed to ``mean`` and translated to ``ReduceMean``, still carries its row. Where torch
records no source, an FX node of the same name and operator is taken.

Example:
    >>> import torch
    >>> format_value(31.41592653), format_value(float("inf"))
    ('31.4159', 'inf')
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from torch.fx import GraphModule, Node

from qviz.engine.graph.node_data import op_name

#: The key prefix of qviz's properties.
PREFIX = "qviz."
#: torch.onnx's node property naming the FX nodes an ONNX node comes from (innermost last).
NAME_SCOPES = "pkg.torch.onnx.name_scopes"


def format_value(value: float) -> str:
    """A value as a metadata string: 6 significant digits, ``inf`` / ``-inf`` as such.

    Example:
        >>> format_value(0.000123456789)
        '0.000123457'
    """
    return f"{value:.6g}"


def _provenance(node: Node, graph_id: int) -> str | None:
    """The name of the node of graph ``graph_id`` that ``node`` was made from, if recorded."""
    stack = list(node.meta.get("from_node") or [])
    while stack:
        source = stack.pop()
        if getattr(source, "graph_id", None) == graph_id:
            return str(source.name)
        stack.extend(getattr(source, "from_node", None) or [])
    return None


def onnx_sources(program: Any, source: GraphModule) -> dict[str, str]:
    """``{FX node of torch.onnx's program: node of source}`` for every operator of the program.

    Args:
        program: the ``torch.export.ExportedProgram`` torch.onnx translated
            (``ONNXProgram.exported_program``).
        source: the graph module handed to torch.onnx.
    """
    ops = {n.name: op_name(n) for n in source.graph.nodes if n.op == "call_function"}
    found = {}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        name = _provenance(node, id(source.graph))
        if name is None and ops.get(node.name) == op_name(node):
            name = node.name
        if name is not None:
            found[node.name] = name
    return found


def _fx_name(onnx_node: Any) -> str | None:
    scopes = onnx_node.metadata_props.get(NAME_SCOPES)
    try:
        names = ast.literal_eval(scopes) if scopes else None
    except (ValueError, SyntaxError):
        return None
    return str(names[-1]) if isinstance(names, list) and names else None


def write_metadata(
    model: Any,
    sources: Mapping[str, str],
    values: Mapping[str, Mapping[str, float]],
    summary: Mapping[str, str],
) -> dict[str, tuple[str, ...]]:
    """Put ``values`` on the ONNX nodes of ``model`` (an onnx_ir Model), in place.

    Args:
        model: torch.onnx's model (``ONNXProgram.model``), after any optimization.
        sources: :func:`onnx_sources`.
        values: ``{node of the source graph: {column: value}}``.
        summary: model-level properties (keys without the prefix).

    Returns:
        ``{node of the source graph: the ONNX nodes that carry its values}``.
    """
    placed: dict[str, list[str]] = {}
    for onnx_node in model.graph.all_nodes():
        fx_name = _fx_name(onnx_node)
        node = sources.get(fx_name) if fx_name is not None else None
        if node is None or node not in values:
            continue
        props = onnx_node.metadata_props
        props[f"{PREFIX}node"] = node
        for column, value in values[node].items():
            props[f"{PREFIX}{column}"] = format_value(value)
        placed.setdefault(node, []).append(str(onnx_node.name))
    for key, text in summary.items():
        model.metadata_props[f"{PREFIX}{key}"] = text
    return {node: tuple(names) for node, names in placed.items()}
