"""What the AnnotationEditor's panel shows for a selection, read from the plan (plain data), and
its HTML.

For a node: each observed input edge and its output, with dtype, range, qscheme, channel axis,
observer, sharing group and how the tensor joined it (own spec, explicit, implicit, transitive),
or why the node stays in float. For an edge: that tensor. For a module: the nodes inside.

Example:
    >>> row = {"tensor": "x -> linear", "dtype": "int8", "range": "[-128, 127]",
    ...        "qscheme": "per_tensor_affine", "ch_axis": None, "observer": "HistogramObserver",
    ...        "group": 0, "how": "own spec", "choice": None}
    >>> "x -&gt; linear" in rows_html([row])
    True
"""

from __future__ import annotations

import html
from typing import Any

from qviz.engine.quantizers.fallback import inside_module, module_path
from qviz.widgets.kit.layout import breakable, scrolling


def _row(editor: Any, record: Any) -> dict[str, Any]:
    plan = editor.plan
    group = plan.groups[record.group]
    spec = group.spec  # the group's resolved spec: what the tensor is quantized with
    how = record.how if record.via is None else f"{record.how} via {record.via}"
    return {
        "tensor": str(record.tensor),
        "dtype": spec.dtype,
        "range": f"[{spec.quant_min}, {spec.quant_max}]",
        "qscheme": spec.qscheme,
        "ch_axis": spec.ch_axis,
        "observer": _observer(spec),
        "group": record.group,
        "how": how,
        "choice": group.choice,
    }


def _observer(spec: Any) -> str:
    if spec.kind != "observed":
        return str(spec.kind)
    return f"{spec.observer} ({spec.method})" if spec.method else str(spec.observer)


def describe(editor: Any, name: str) -> dict[str, Any]:
    """The panel's data for ``name``: kind, its tensors' rows, float reason, edits."""
    plan = editor.plan
    if not name:
        return {"kind": "none", "name": "", "rows": [], "float": None, "edits": {}}
    edits = {k: v for k, v in editor.overrides.items() if k == name}
    if "->" in name:
        producer, _, consumer = (s.strip() for s in name.partition("->"))
        rows = [_row(editor, r) for r in plan.tensors if r.tensor.producer == producer
                and r.tensor.consumer == consumer]  # fmt: skip
        return {"kind": "edge", "name": name, "rows": rows, "float": None, "edits": edits}
    nodes = {n.name: n for n in editor.model.graph.nodes}
    if name in nodes:
        rows = [_row(editor, r) for r in plan.tensors if r.tensor.consumer == name]
        rows += [_row(editor, r) for r in plan.tensors
                 if r.tensor.producer == name and r.tensor.consumer is None]  # fmt: skip
        left = next((f for f in plan.float_nodes if f.node == name), None)
        reason = None if left is None else {"reason": left.reason.value, "detail": left.detail}
        return {"kind": "node", "name": name, "rows": rows, "float": reason, "edits": edits,
                "module": module_path(nodes[name])}  # fmt: skip
    inside = [n.name for n in editor.model.graph.nodes
              if n.op == "call_function" and inside_module(module_path(n), name)]  # fmt: skip
    return {"kind": "module", "name": name, "rows": [], "float": None, "edits": edits,
            "nodes": inside}  # fmt: skip


def rows_html(rows: list[dict[str, Any]]) -> str:
    """The tensors' rows as an HTML table, narrow enough for the panel: the integer range under
    the dtype, the channel axis beside the qscheme, long names wrapping at word boundaries."""
    cell = 'style="padding:2px 6px;border-bottom:1px solid #ddd;text-align:left"'
    head = "".join(
        f"<th {cell}>{c}</th>"
        for c in ("tensor", "dtype", "qscheme", "observer", "group", "how it joined")
    )
    body = "".join(
        "<tr>" + "".join(f"<td {cell}>{value}</td>" for value in _cells(r)) + "</tr>" for r in rows
    )
    return scrolling(
        '<table style="border-collapse:collapse;font-size:12px" '
        f'class="qviz-annotation"><tr>{head}</tr>{body}</table>'
    )


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    small = '<br><span style="color:#666">{}</span>'
    axis = "" if r.get("ch_axis") is None else small.format(f"axis {r['ch_axis']}")
    return (
        breakable(str(r.get("tensor", ""))),
        breakable(str(r.get("dtype", ""))) + small.format(html.escape(str(r.get("range", "")))),
        breakable(str(r.get("qscheme", ""))) + axis,
        breakable(str(r.get("observer", ""))),
        html.escape(str(r.get("group", ""))),
        breakable(str(r.get("how", ""))),
    )


def panel_html(info: dict[str, Any], error: str | None) -> str:
    """The panel: selection heading, float reason, tensors table, edits, error."""
    parts = []
    if info["kind"] == "none":
        parts.append(
            "<i>Click a node, an edge or an observer in the graph, or choose a tensor "
            "in the <b>edit</b> dropdown.</i>"
        )
    else:
        where = f" in {html.escape(info['module'])}" if info.get("module") else ""
        parts.append(f"<b>{html.escape(info['kind'])} {html.escape(info['name'])}</b>{where}")
    if info.get("float"):
        f = info["float"]
        parts.append(
            f"<div>left in float: <b>{html.escape(f['reason'])}</b> "
            f"({html.escape(f['detail'])})</div>"
        )
    if info["rows"]:
        parts.append(rows_html(info["rows"]))
    elif info["kind"] == "module":
        parts.append(f"<div>{len(info.get('nodes', []))} operators inside</div>")
    elif info["kind"] in ("node", "edge") and not info.get("float"):
        parts.append("<div>not quantized (no spec)</div>")
    if info["edits"]:
        parts.append(f"<div>your edits: <code>{html.escape(str(info['edits']))}</code></div>")
    if error:
        parts.append(f'<div style="color:#b00020">⚠ {html.escape(error)}</div>')
    return "".join(parts)
