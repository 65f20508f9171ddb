"""The per-node values qviz hands to other tools: a numeric report's columns and each operator's
output scale, keyed by FX node name.

Model Explorer's node data (:func:`qviz.viz.to_model_explorer`) and the ONNX file's node
properties (``qviz.export_onnx(..., report=...)``) carry the same values, read here once:

* from a report of :func:`qviz.numeric.compare` (``report.df``: one row per quantized operator,
  ``node`` the operator's name in the quantized graph, ``op`` its ATen operator), the columns
  asked for, NaN left out (an operator without that figure gets no value);
* from a converted graph, each node's output scale: the ``scale`` of the per-tensor quantize
  that reads the node's output (what the next operator's input grid steps by).

The engine reads the report by duck typing (``report.df``), so it imports nothing of
``qviz.numeric`` or pandas.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> x = torch.randn(8, 4)
    >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 3)).eval(), (x,))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> converted = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), x, progress=False))
    >>> sorted(output_scales(converted.graph))   # the input and the linear's output
    ['input_1', 'linear']
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from torch.fx import Graph, Node

from qviz.engine.compat import quantized_decomposed
from qviz.engine.graph.qdq_ops import dequantize_ops, quantize_ops
from qviz.errors import ConfigError, closest_names

#: The value read from the graph rather than the report: the output quantize's scale.
SCALE = "scale"
#: The report's columns handed on by default: local / cumulative SQNR (dB), clipped share.
REPORT_COLUMNS = ("local_sqnr", "cumulative_sqnr", "clipped")
#: What is handed on by default: the report's columns, then the output scale.
DEFAULT_COLUMNS = (*REPORT_COLUMNS, SCALE)


def op_name(node: Node) -> str:
    """The operator's short name as the numeric report's ``op`` column writes it.

    Example:
        >>> import torch
        >>> gm = torch.export.export(torch.nn.ReLU(), (torch.randn(2),)).module()
        >>> [op_name(n) for n in gm.graph.nodes if n.op == "call_function"]
        ['relu']
    """
    return getattr(node.target, "__name__", str(node.target)).split(".")[0]


def output_scales(graph: Graph) -> dict[str, float]:
    """Each node's output scale: the scale of the per-tensor quantize reading its output.

    Nodes whose output is not quantized per tensor with a constant scale (float operators,
    quantize / dequantize nodes themselves, per-channel weights) have none.

    Example:
        >>> import torch
        >>> from torch.fx import symbolic_trace
        >>> output_scales(symbolic_trace(torch.nn.ReLU()).graph)
        {}
    """
    quantize = quantized_decomposed().quantize_per_tensor.default
    qdq = quantize_ops() | dequantize_ops()
    scales: dict[str, float] = {}
    for node in graph.nodes:
        if node.op == "call_function" and node.target in qdq:
            continue
        for user in node.users:
            if user.target is quantize and isinstance(user.args[1], int | float):
                scales[node.name] = float(user.args[1])
                break
    return scales


def _table(report: Any) -> Any:
    df = getattr(report, "df", None)
    if df is None or not hasattr(df, "columns") or "node" not in df.columns:
        raise ConfigError(
            f"report must be the NumericReport qviz.numeric.compare returned (a .df with a "
            f"'node' column), got {type(report).__name__}"
        )
    return df


def report_columns(report: Any) -> list[str]:
    """The report's numeric columns (those a value can be handed on from).

    Example:
        >>> from qviz.numeric import NumericReport
        >>> "local_sqnr" in report_columns(NumericReport.from_table([{"node": "a"}]))
        True
    """
    df = _table(report)
    return [str(c) for c in df.columns if df[c].dtype.kind in "fiu" and c != "handle"]


def report_values(report: Any, columns: Sequence[str]) -> dict[str, dict[str, float]]:
    """``{node: {column: value}}`` for the report's rows, NaN left out, in graph order.

    Raises:
        ConfigError: ``report`` is not a numeric report, or a column is not one of its
            numeric columns.

    Example:
        >>> from qviz.numeric import NumericReport
        >>> r = NumericReport.from_table([{"node": "conv2d", "local_sqnr": 31.5}])
        >>> report_values(r, ["local_sqnr", "clipped"])
        {'conv2d': {'local_sqnr': 31.5}}
    """
    df = _table(report)
    known = report_columns(report)
    for column in columns:
        if column not in known:
            raise ConfigError(
                f"column {column!r} is not a numeric column of the report "
                f"({closest_names(column, known)}); choose from {known}"
            )
    values: dict[str, dict[str, float]] = {}
    for row in df[["node", *columns]].itertuples(index=False, name=None):
        node, figures = str(row[0]), row[1:]
        kept = {c: float(v) for c, v in zip(columns, figures, strict=True) if not math.isnan(v)}
        values.setdefault(node, {}).update(kept)
    return values


def report_ops(report: Any) -> dict[str, str]:
    """``{node: op}`` of the report's rows (``op`` empty when the report has no such column).

    Example:
        >>> from qviz.numeric import NumericReport
        >>> report_ops(NumericReport.from_table([{"node": "conv2d", "op": "conv2d"}]))
        {'conv2d': 'conv2d'}
    """
    df = _table(report)
    ops = df["op"] if "op" in df.columns else [""] * len(df)
    return {str(node): str(op) for node, op in zip(df["node"], ops, strict=True)}


def check_report_matches(report: Any, found: Iterable[str], ops: Mapping[str, str], where: str):
    """Refuse a report whose rows name operators the model does not have.

    Args:
        report: the numeric report.
        found: the report's node names that were placed on a node of the model.
        ops: the model's node names and their operators (for the hint).
        where: what the model is, for the message ("this ExportedProgram").

    Raises:
        ConfigError: a row was not placed: the report comes from another model.
    """
    rows = report_ops(report)
    missing = [name for name in rows if name not in set(found)]
    if not missing:
        return
    first = missing[0]
    raise ConfigError(
        f"the report does not match {where}: {len(missing)} of its {len(rows)} rows name no "
        f"node with the same operator ({[f'{m} ({rows[m]})' for m in missing[:5]]}; for "
        f"{first!r}: {closest_names(first, ops)}); pass the report qviz.numeric.compare made for "
        f"this model (compare(float_gm, quantized, data))"
    )
