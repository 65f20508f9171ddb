"""The view of :class:`~qviz.widgets.editor.AnnotationEditor`: :class:`EditorView` owns its
ipywidgets, the graph on the left, the selection's annotation and the controls on the right.
Controls only call the editor's Python methods; :meth:`EditorView.refresh` redraws from the
editor's state.

Example:
    >>> changes_from({"dtype": "int4 (int8 storage, -8..7)", "qscheme": KEEP, "observer": KEEP,
    ...               "method": "entropy", "share_with": NONE, "quantize": True, "fixed": False,
    ...               "scale": 0.1, "zero_point": 0})
    {'dtype': 'int8', 'quant_min': -8, 'quant_max': 7, 'method': 'entropy'}
"""

from __future__ import annotations

import html
from typing import Any, Protocol

from qviz.widgets.editor.panel import panel_html
from qviz.widgets.kit.graph_panel import linked_graph
from qviz.widgets.kit.layout import row, split

KEEP = "(keep)"
NONE = "(none)"
_INT4 = "int4 (int8 storage, -8..7)"
_DTYPES = [KEEP, "int8", "uint8", "int16", _INT4]
_QSCHEMES = [KEEP, "per_tensor_affine", "per_tensor_symmetric", "per_channel_symmetric",
             "per_channel_affine"]  # fmt: skip
_OBSERVERS = [KEEP, "HistogramObserver", "MinMaxObserver", "MovingAverageMinMaxObserver",
              "PerChannelMinMaxObserver"]  # fmt: skip
_METHODS = [KEEP, "l2", "max", "percentile", "entropy", "mse"]
#: The edit dropdown's first option while nothing is selected.
_CHOOSE = "(choose a tensor, or click the graph)"


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


class Editor(Protocol):
    """What :class:`EditorView` reads and calls: the public surface of an AnnotationEditor."""

    model: Any
    prepared: Any
    selection: str
    error: str | None
    collapsed: list[str]

    @property
    def plan(self) -> Any: ...

    @property
    def can_undo(self) -> bool: ...

    @property
    def can_redo(self) -> bool: ...

    def describe(self, name: str | None = None) -> dict[str, Any]: ...

    def to_code(self) -> str: ...

    def select(self, name: str) -> Any: ...

    def edit(self, name: str, **changes: Any) -> Any: ...

    def reset(self, name: str) -> Any: ...

    def undo(self) -> Any: ...

    def redo(self) -> Any: ...

    def toggle_module(self, path: str) -> Any: ...


class EditorView:
    """The editor's graph, annotation panel, edit controls, buttons and Python code.

    Args:
        editor: the editor shown (its public methods are what the controls call).
        with_graph: draw the prepared model beside the panel.

    Attributes:
        widget: the ipywidgets box shown in Jupyter.
        graph: the :class:`~qviz.widgets.kit.graph_widget.GraphWidget` (None without a graph).
        controls: the edit controls by name (``"target"``, ``"dtype"``, ``"quantize"``, ...).
        buttons: ``"Apply"``, ``"Undo"``, ``"Redo"``, ``"Reset"``.
        panel, code: the selection's annotation and the Python that rebuilds the quantizer.

    Example:
        >>> import torch, qviz
        >>> from qviz.widgets.editor import AnnotationEditor
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),))
        >>> view = AnnotationEditor(gm, graph=False).select("linear").view
        >>> view.controls["target"].value, view.buttons["Undo"].disabled
        ('linear', True)
    """

    def __init__(self, editor: Editor, *, with_graph: bool) -> None:
        import ipywidgets as w

        self._editor = editor
        self._shown_selection = editor.selection
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
            "scale": w.FloatText(
                value=1 / 256, description="scale", layout=w.Layout(width="240px")
            ),
            "zero_point": w.IntText(
                value=0, description="zero_point", layout=w.Layout(width="170px")
            ),
        }
        self.controls = c
        self.buttons = {
            name: w.Button(description=name, button_style=style)
            for name, style in (("Apply", "primary"), ("Undo", ""), ("Redo", ""), ("Reset", ""))
        }
        self.buttons["Apply"].on_click(lambda _: self._apply())
        self.buttons["Undo"].on_click(lambda _: editor.undo())
        self.buttons["Redo"].on_click(lambda _: editor.redo())
        self.buttons["Reset"].on_click(lambda _: editor.reset(c["target"].value))
        self.panel, self.code = w.HTML(), w.HTML()
        code_box = w.Accordion(children=[self.code], titles=("Python",))
        controls = w.VBox(
            [self.panel, c["target"], c["quantize"], c["dtype"], c["qscheme"], c["observer"],
             c["method"], c["share_with"], row([c["fixed"], c["scale"], c["zero_point"]]),
             row(list(self.buttons.values())), code_box],
        )  # fmt: skip
        self.graph = (
            linked_graph(self._clicked, editor.toggle_module, modules_select=True)
            if with_graph
            else None
        )
        self.widget = split(self.graph, controls)

    def refresh(self, redraw: bool = True) -> None:
        """Redraw the graph (when the plan changed) and the panel from the editor's state."""
        from qviz.viz import graph

        editor = self._editor
        if redraw and self.graph is not None:
            self.graph.show(graph(editor.prepared, collapse=list(editor.collapsed) or None))
        if self.graph is not None and self.graph.selected != editor.selection:
            self.graph.selected = editor.selection
        if editor.selection != self._shown_selection:  # controls set for the old selection
            self._reset_controls()
            self._shown_selection = editor.selection
        info = editor.describe()
        self.panel.value = panel_html(info, editor.error)
        c = self.controls
        targets = self._targets(info)
        c["target"].options = (  # nothing selected yet: the first option says what to do
            targets if targets[0] else [(_CHOOSE, ""), *((t, t) for t in targets[1:])]
        )
        c["target"].value = targets[0]
        tensors = [NONE] + [str(r.tensor) for r in editor.plan.tensors]
        if list(c["share_with"].options) != tensors:
            c["share_with"].options = tensors
        self.buttons["Undo"].disabled = not editor.can_undo
        self.buttons["Redo"].disabled = not editor.can_redo
        self.code.value = f"<pre>{html.escape(editor.to_code())}</pre>"

    def _clicked(self, name: str) -> None:
        if name != self._editor.selection:
            self._editor.select(name)

    def _apply(self) -> None:
        editor, c = self._editor, self.controls
        target = c["target"].value
        if not target:
            editor.error = "select a node, an edge or a module first"
            self.refresh(redraw=False)
            return
        changes = changes_from({k: v.value for k, v in c.items() if k != "target"})
        if not changes:
            editor.error = "nothing to apply: change a control first"
            self.refresh(redraw=False)
            return
        editor.edit(target, **changes)
        if editor.error is None:
            self._reset_controls()

    def _reset_controls(self) -> None:
        c = self.controls
        for key in ("dtype", "qscheme", "observer", "method"):
            c[key].value = KEEP
        c["share_with"].value = NONE
        c["quantize"].value, c["fixed"].value = True, False

    def _targets(self, info: dict[str, Any]) -> list[str]:
        """The keys an edit can address: the selection's (itself, its tensors, module, op)
        first, then every other tensor of the plan, so that the dropdown offers something to
        edit before anything is clicked (then it starts with ``""``: nothing chosen yet)."""
        tensors = [str(r.tensor) for r in self._editor.plan.tensors]
        name = info["name"]
        if not name:
            return ["", *dict.fromkeys(tensors)]
        keys = [name]
        keys += [r["tensor"] for r in info["rows"] if r["tensor"] != name]
        if info.get("module"):
            keys.append(info["module"])
        node = next((n for n in self._editor.model.graph.nodes if n.name == name), None)
        if node is not None and node.op == "call_function":
            keys.append("op:" + getattr(node.target, "__name__", str(node.target)).split(".")[0])
        return list(dict.fromkeys([*keys, *tensors]))
