"""qviz's findings as Google Model Explorer node data: open the model there, see the heatmap.

`Model Explorer <https://github.com/google-ai-edge/model-explorer>`_ colours a graph's nodes by
*node data*: a JSON file of one value per node id, with the thresholds or gradient that turn
values into colours. :func:`to_model_explorer` writes one such file per column of the numeric
suite (local and cumulative SQNR, clipped share) and per output scale, keyed by the node ids
Model Explorer's PyTorch adapter gives the same ``torch.export.ExportedProgram``.

How the ids are found (checked against the adapter itself, ``ai-edge-model-explorer`` 0.1.34,
in ``tests/viz/test_model_explorer.py``): its ``PytorchExportedProgramAdapterImpl`` makes one
graph, id ``"graph"``, with one node per FX node of ``exported_program.graph_module``, the node
id being the FX node's name. A report row names an operator of the *quantized* graph
(``convert_pt2e``'s names); it is placed on

* the node of the same name and operator, in the ExportedProgram of the float model
  (``torch.export.export(model, example_inputs)`` names its operators as :func:`qviz.export`
  does; a conv with a BatchNorm folded into it carries the pair's figures, the BatchNorm node
  none), or
* the node that re-export made from it, in ``torch.export.export(quantized, example_inputs)``:
  torch records each node's source (``node.meta["from_node"]``); re-export renames the
  quantize / dequantize nodes, so only the provenance finds them reliably.

Colours: SQNR and the clipped share by the fixed bands of :mod:`qviz.display.bands`, the ones the
HTML report uses (SQNR: ≤ 10 dB red, ≤ 20 orange, ≤ 30 yellow, ≤ 40 light green, above green;
±inf, an exact or all-zero output, is written as ±200 dB since JSON has no infinity; clipped:
0 green to over 1 % red); scale and other columns by a white-to-blue gradient from the smallest
to the largest value.

Example:
    >>> import json, tempfile, torch, qviz, qviz.numeric
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    >>> x = torch.randn(8, 4)
    >>> gm = qviz.export(model, (x,))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> quantized = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), x, progress=False))
    >>> report = qviz.numeric.compare(gm, quantized, [x], progress=False)
    >>> program = torch.export.export(quantized, (x,))      # the model to open in Model Explorer
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     data = to_model_explorer(program, report, path=folder)
    ...     sqnr = json.loads(data.files["local_sqnr"].read_text())
    >>> sorted(data.files), sorted(sqnr["graph"]["results"])
    (['clipped', 'cumulative_sqnr', 'local_sqnr', 'scale'], ['linear', 'relu'])
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from qviz.display.bands import bands_for
from qviz.engine.graph.fingerprint import check_fingerprint
from qviz.engine.graph.node_data import (
    DEFAULT_COLUMNS,
    SCALE,
    check_report_matches,
    op_name,
    output_scales,
    report_columns,
    report_ops,
    report_values,
)
from qviz.engine.graph.qdq_ops import dequantize_ops, quantize_ops
from qviz.errors import ConfigError, closest_names

#: The graph id Model Explorer's PyTorch adapter gives an ExportedProgram's (only) graph.
GRAPH_ID = "graph"
#: dB written for an infinite SQNR (JSON has no infinity); -SQNR_CAP for -inf.
SQNR_CAP = 200.0

_GRADIENT = ({"stop": 0, "bgColor": "#f7fbff"}, {"stop": 1, "bgColor": "#2171b5"})


@dataclass(frozen=True)
class ModelExplorerData:
    """What :func:`to_model_explorer` wrote: one node-data JSON per column.

    Attributes:
        path: the folder.
        files: ``{column: path}`` of each JSON file.
        nodes: ``{column: how many nodes have a value}``.

    Example:
        >>> d = ModelExplorerData(Path("me"), {"local_sqnr": Path("me/local_sqnr.json")}, {})
        >>> d.node_data_paths
        'me/local_sqnr.json'
    """

    path: Path
    files: dict[str, Path] = field(hash=False)
    nodes: dict[str, int] = field(hash=False)

    @property
    def node_data(self) -> list[dict[str, str]]:
        """For ``model_explorer.visualize_pytorch(name, program, node_data=...)``."""
        return [
            {"name": f"qviz {column}", "node_data_path": str(path)}
            for column, path in self.files.items()
        ]

    @property
    def node_data_paths(self) -> str:
        """For the command line: ``model-explorer model.pt2 --node_data_paths=...``."""
        return ",".join(str(p) for p in self.files.values())


def _styles(column: str, values: Sequence[float]) -> dict[str, Any]:
    """Thresholds (value ≤ threshold takes its colour, first match) or a gradient."""
    bands = bands_for(column)  # the fixed bands the report and the graph colour by
    if bands is not None:  # inf closes the SQNR bands; JSON writes it as SQNR_CAP
        edges = [(min(upper, SQNR_CAP), colour) for upper, colour in bands.edges]
        return {"thresholds": [{"value": v, "bgColor": c} for v, c in edges]}
    if values and min(values) == max(values):  # a gradient over one value colours nothing
        return {"thresholds": [{"value": max(values), "bgColor": _GRADIENT[1]["bgColor"]}]}
    return {"gradient": [dict(stop) for stop in _GRADIENT]}


def _json_value(column: str, value: float) -> float | None:
    if math.isinf(value) and column.endswith("sqnr"):
        return math.copysign(SQNR_CAP, value)
    return value if math.isfinite(value) else None


def node_data(column: str, values: dict[str, float]) -> dict[str, Any]:
    """Model Explorer's model node data (``ModelNodeData``) for one column: the adapter's graph
    id mapped to a ``GraphNodeData`` of one ``{"value": v}`` per node id, with its colours.

    Example:
        >>> d = node_data("local_sqnr", {"conv2d": 12.5, "relu": float("inf")})
        >>> d["graph"]["results"]
        {'conv2d': {'value': 12.5}, 'relu': {'value': 200.0}}
        >>> d["graph"]["thresholds"][0]
        {'value': 10.0, 'bgColor': '#f46d43'}
    """
    results = {}
    for node, value in values.items():
        written = _json_value(column, value)
        if written is not None:
            results[node] = {"value": written}
    graph = {"name": f"qviz {column}", "results": results}
    graph |= _styles(column, [r["value"] for r in results.values()])
    return {GRAPH_ID: graph}


def _graph_of(model: Any) -> tuple[Graph, str]:
    """The graph whose node names are Model Explorer's ids, and how to call it in messages."""
    if isinstance(model, torch.export.ExportedProgram):
        return model.graph_module.graph, "this ExportedProgram"
    if isinstance(model, GraphModule):
        qdq = quantize_ops() | dequantize_ops()
        if any(n.op == "call_function" and n.target in qdq for n in model.graph.nodes):
            raise ConfigError(
                f"to_model_explorer: {type(model).__name__} is a quantized graph module, which "
                f"Model Explorer opens only as an ExportedProgram, and re-export renames its "
                f"quantize / dequantize nodes; pass the program you open: "
                f"torch.export.export(quantized, example_inputs)"
            )
        return model.graph, "this graph module"
    raise ConfigError(
        f"to_model_explorer needs the torch.export.ExportedProgram you open in Model Explorer "
        f"(or the float graph module qviz.export returned), got {type(model).__name__}; export "
        f"it first: torch.export.export(model, example_inputs)"
    )


def _sources(node: Node) -> list[str]:
    """Names this node may carry a report row of: its provenance (nearest first), then its own."""
    names: list[str] = []
    stack = list(reversed(node.meta.get("from_node") or []))
    while stack:
        source = stack.pop()
        names.append(str(getattr(source, "name", "")))
        stack.extend(reversed(list(getattr(source, "from_node", None) or [])))
    return [*names, node.name]


def _place(graph: Graph, rows: dict[str, str]) -> dict[str, str]:
    """``{node id: report row}``: each operator node and the row it carries, if any."""
    placed = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        op = op_name(node)
        row = next((s for s in _sources(node) if rows.get(s) == op), None)
        if row is not None:
            placed[node.name] = row
    return placed


def _columns(report: Any, scales: dict[str, float], columns: Sequence[str] | None) -> list[str]:
    available = (report_columns(report) if report is not None else []) + [SCALE]
    if columns is None:
        chosen = [c for c in DEFAULT_COLUMNS if c in available and (c != SCALE or scales)]
        if not chosen:
            raise ConfigError(
                "to_model_explorer has nothing to write: this model has no quantize op to read "
                "scales from; pass the report of qviz.numeric.compare, or the ExportedProgram of "
                "the quantized model (torch.export.export(quantized, example_inputs))"
            )
        return chosen
    if isinstance(columns, str) or not columns:
        raise ConfigError(f"columns must be a non-empty sequence of names, got {columns!r}")
    for column in columns:
        if column == SCALE and not scales:
            raise ConfigError(
                "column 'scale' needs a quantized model: pass torch.export.export(quantized, "
                "example_inputs); this one has no per-tensor quantize op"
            )
        if column not in available:
            raise ConfigError(
                f"column {column!r} is not a numeric column of the report nor 'scale' "
                f"({closest_names(column, available)}); choose from {available}"
            )
    return list(columns)


def _values(model: Any, report: Any, columns: Sequence[str] | None) -> dict[str, dict[str, float]]:
    """``{column: {node id: value}}`` for the model's graph."""
    graph, where = _graph_of(model)
    scales = output_scales(graph)
    chosen = _columns(report, scales, columns)
    by_column: dict[str, dict[str, float]] = {c: {} for c in chosen}
    if SCALE in by_column:
        by_column[SCALE] = scales
    wanted = [c for c in chosen if c != SCALE]
    if report is not None:
        check_fingerprint(report, model, "to_model_explorer")  # another model's: refused
        rows = report_ops(report)
        placed = _place(graph, rows)
        ops = {n.name: op_name(n) for n in graph.nodes if n.op == "call_function"}
        check_report_matches(report, placed.values(), ops, where)
        figures = report_values(report, wanted)
        for node_id, row in placed.items():
            for column, value in figures.get(row, {}).items():
                by_column[column][node_id] = value
    return by_column


def _write(folder: Path, column: str, data: dict[str, Any]) -> Path:
    target = folder / f"{column}.json"
    try:
        target.write_text(json.dumps(data, indent=1, allow_nan=False), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"to_model_explorer cannot write {target}: {exc.strerror or exc}; choose a "
            f"writable folder as path="
        ) from exc
    return target


def _folder(path: Any) -> Path:
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"path must be a folder path (str or Path), got {type(path).__name__}")
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise ConfigError(
            f"to_model_explorer writes a folder of JSON files, but {folder} is a file; pass a "
            f"folder as path="
        ) from exc
    except OSError as exc:
        raise ConfigError(
            f"to_model_explorer cannot create {folder}: {exc.strerror or exc}; choose a "
            f"writable folder as path="
        ) from exc
    return folder


def to_model_explorer(
    model: Any,
    report: Any = None,
    *,
    path: str | os.PathLike[str],
    columns: Sequence[str] | None = None,
) -> ModelExplorerData:
    """Write Model Explorer node data (one JSON per column) for ``model`` into the folder ``path``.

    Open the model in Model Explorer with the files as its node data, e.g.
    ``model_explorer.visualize_pytorch("model", program, node_data=data.node_data)``, or save
    the program (``torch.export.save``) and run ``model-explorer model.pt2
    --node_data_paths=<data.node_data_paths>``. Nothing of ``model`` or ``report`` is changed.

    Args:
        model: the ``torch.export.ExportedProgram`` you open: of the float model
            (``torch.export.export(model, example_inputs)``) or of the quantized one
            (``torch.export.export(quantized, example_inputs)``, which also has the scales);
            or the float graph module :func:`qviz.export` returned (its operators have the
            float program's names).
        report: the :class:`~qviz.numeric.NumericReport` of :func:`qviz.numeric.compare`
            for this model; None writes the output scales only (a quantized program).
        path: the folder to write ``<column>.json`` into (created if missing).
        columns: the report's numeric columns to write, and/or ``"scale"``; default
            ``local_sqnr``, ``cumulative_sqnr``, ``clipped`` (with a report) and ``scale``
            (a quantized program).

    Returns:
        A :class:`ModelExplorerData`: the files and how many nodes each colours.

    Raises:
        ConfigError: a model that is not an exported graph (or a quantized graph module, which
            must be re-exported first), a report from another model (a row naming no node with
            its operator), an unknown column, nothing to write, or a path that cannot be
            written.

    Example:
        >>> import tempfile, torch
        >>> from qviz.numeric.compare.report import NumericReport
        >>> program = torch.export.export(torch.nn.ReLU(), (torch.randn(2),))
        >>> report = NumericReport.from_table([{"node": "relu", "op": "relu", "local_sqnr": 9.0}])
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     data = to_model_explorer(program, report, path=folder, columns=["local_sqnr"])
        >>> data.nodes
        {'local_sqnr': 1}
    """
    by_column = _values(model, report, columns)
    folder = _folder(path)
    files, counts = {}, {}
    for column, values in by_column.items():
        data = node_data(column, values)
        files[column] = _write(folder, column, data)
        counts[column] = len(data[GRAPH_ID]["results"])
    return ModelExplorerData(folder, files, counts)
