"""The ipywidgets of :class:`~qviz.widgets.editor.AnnotationEditor`: the graph on the left, the
selection's annotation and the controls on the right. Controls only call the editor's Python
methods; :func:`refresh_view` redraws from the editor's state.

Example:
    >>> changes_from({"dtype": "int4 (int8 storage, -8..7)", "qscheme": KEEP, "observer": KEEP,
    ...               "method": "entropy", "share_with": NONE, "quantize": True, "fixed": False,
    ...               "scale": 0.1, "zero_point": 0})
    {'dtype': 'int8', 'quant_min': -8, 'quant_max': 7, 'method': 'entropy'}
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["KEEP", "NONE", "build_view", "changes_from", "refresh_view"]

KEEP = "(keep)"
NONE = "(none)"
_INT4 = "int4 (int8 storage, -8..7)"
_DTYPES = [KEEP, "int8", "uint8", "int16", _INT4]
_QSCHEMES = [KEEP, "per_tensor_affine", "per_tensor_symmetric", "per_channel_symmetric",
             "per_channel_affine"]  # fmt: skip
_OBSERVERS = [KEEP, "HistogramObserver", "MinMaxObserver", "MovingAverageMinMaxObserver",
              "PerChannelMinMaxObserver"]  # fmt: skip
_METHODS = [KEEP, "l2", "max", "percentile", "entropy", "mse"]


def changes_from(values: dict[str, Any]) -> dict[str, Any]:
    """The edit the controls describe (``KEEP`` / ``NONE`` values are left out)."""
    if not values["quantize"]:
        return {"quantize": False}
    changes: dict[str, Any] = {}
    if values["dtype"] == _INT4:
        changes |= {"dtype": "int8", "quant_min": -8, "quant_max": 7}
    elif values["dtype"] != KEEP:
        changes["dtype"] = values["dtype"]
    for key in ("qscheme", "observer", "method"):
        if values[key] != KEEP:
            changes[key] = values[key]
    if values["share_with"] != NONE:
        changes["share_with"] = values["share_with"]
    if values["fixed"]:
        changes |= {"scale": float(values["scale"]), "zero_point": int(values["zero_point"])}
    return changes


def build_view(editor: Any, with_graph: bool) -> None:
    """Create the graph widget and the controls, wired to the editor's Python methods."""
    import ipywidgets as w

    from qviz.widgets.layout import row, split

    c = {
        "target": w.Dropdown(
            description="edit", options=[""], layout=w.Layout(width="340px", max_width="100%")
        ),
        "quantize": w.Checkbox(value=True, description="quantize"),
        "dtype": w.Dropdown(options=_DTYPES, description="dtype"),
        "qscheme": w.Dropdown(options=_QSCHEMES, description="qscheme"),
        "observer": w.Dropdown(options=_OBSERVERS, description="observer"),
        "method": w.Dropdown(options=_METHODS, description="method"),
        "share_with": w.Dropdown(options=[NONE], description="share with"),
        "fixed": w.Checkbox(value=False, description="fixed qparams"),
        "scale": w.FloatText(value=1 / 256, description="scale", layout=w.Layout(width="170px")),
        "zero_point": w.IntText(value=0, description="zero_point", layout=w.Layout(width="170px")),
    }
    editor._controls = c
    buttons = {
        name: w.Button(description=name, button_style=style)
        for name, style in (("Apply", "primary"), ("Undo", ""), ("Redo", ""), ("Reset", ""))
    }
    buttons["Apply"].on_click(lambda _: _apply(editor))
    buttons["Undo"].on_click(lambda _: editor.undo())
    buttons["Redo"].on_click(lambda _: editor.redo())
    buttons["Reset"].on_click(lambda _: editor.reset(c["target"].value))
    editor._buttons = buttons
    editor._panel = w.HTML()
    editor._code = w.HTML()
    code_box = w.Accordion(children=[editor._code], titles=("Python",))
    controls = w.VBox(
        [editor._panel, c["target"], c["quantize"], c["dtype"], c["qscheme"], c["observer"],
         c["method"], c["share_with"], row([c["fixed"], c["scale"], c["zero_point"]]),
         row(list(buttons.values())), code_box],
    )  # fmt: skip
    editor._graph = _graph_widget(editor) if with_graph else None
    editor.widget = split(editor._graph, controls)


def _graph_widget(editor: Any) -> Any:
    from qviz.widgets.graph_widget import GraphWidget

    widget = GraphWidget()

    def on_select(change: dict[str, Any]) -> None:
        if change["new"] and change["new"] != editor.selection:
            editor.select(change["new"])

    def on_module(change: dict[str, Any]) -> None:
        path = (change["new"] or {}).get("path")
        if path:
            editor.toggle_module(path)

    widget.observe(on_select, "selected")
    widget.observe(on_module, "module_click")
    return widget


def _apply(editor: Any) -> None:
    c = editor._controls
    target = c["target"].value
    if not target:
        editor.error = "select a node, an edge or a module first"
        refresh_view(editor, redraw=False)
        return
    values = {k: v.value for k, v in c.items() if k != "target"}
    changes = changes_from(values)
    if not changes:
        editor.error = "nothing to apply: change a control first"
        refresh_view(editor, redraw=False)
        return
    editor.edit(target, **changes)
    if editor.error is None:
        _reset_controls(editor)


def _reset_controls(editor: Any) -> None:
    c = editor._controls
    for key in ("dtype", "qscheme", "observer", "method"):
        c[key].value = KEEP
    c["share_with"].value = NONE
    c["quantize"].value, c["fixed"].value = True, False


def _targets(editor: Any, info: dict[str, Any]) -> list[str]:
    """The keys an edit of the selection can address: itself, its tensors, module, op type."""
    name = info["name"]
    if not name:
        return [""]
    keys = [name]
    keys += [r["tensor"] for r in info["rows"] if r["tensor"] != name]
    if info.get("module"):
        keys.append(info["module"])
    node = next((n for n in editor.model.graph.nodes if n.name == name), None)
    if node is not None and node.op == "call_function":
        keys.append("op:" + getattr(node.target, "__name__", str(node.target)).split(".")[0])
    return list(dict.fromkeys(keys))


def refresh_view(editor: Any, redraw: bool = True) -> None:
    """Redraw the graph (when the plan changed) and the panel from the editor's state."""
    from qviz.viz import graph
    from qviz.widgets.editor_panel import panel_html

    if redraw and editor._graph is not None:
        collapse = list(editor.collapsed) or None
        editor._graph.show(graph(editor.prepared, collapse=collapse))
    if editor._graph is not None and editor._graph.selected != editor.selection:
        editor._graph.selected = editor.selection
    if editor._pending_reset:
        _reset_controls(editor)
        editor._pending_reset = False
    info = editor.describe()
    editor._panel.value = panel_html(info, editor.error)
    c = editor._controls
    targets = _targets(editor, info)
    c["target"].options = targets
    c["target"].value = targets[0]
    tensors = [NONE] + [str(r.tensor) for r in editor.plan.tensors]
    if list(c["share_with"].options) != tensors:
        c["share_with"].options = tensors
    editor._buttons["Undo"].disabled = not editor._undo
    editor._buttons["Redo"].disabled = not editor._redo
    editor._code.value = f"<pre>{html.escape(editor.to_code())}</pre>"
