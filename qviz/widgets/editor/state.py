"""``AnnotationEditor``: click a node, change how it is quantized, see the new plan at once.

The editor keeps the user's edits as plain data (:attr:`AnnotationEditor.overrides`: node, edge,
module or op type -> changes, JSON-serialisable) on top of a base quantizer. Every edit asks the
engine for a new plan (``qviz.prepare_pt2e`` with an
:class:`~qviz.engine.quantizers.override.OverrideQuantizer`) and redraws the observed graph, so
sharing groups visibly change; an edit the engine refuses leaves everything as it was and puts
the engine's message in :attr:`AnnotationEditor.error`. Nothing here touches an observer.

Every control has a Python equivalent: :meth:`~AnnotationEditor.select`,
:meth:`~AnnotationEditor.edit`, :meth:`~AnnotationEditor.undo`, :meth:`~AnnotationEditor.redo`,
:meth:`~AnnotationEditor.toggle_module`. What the edits amount to:
:attr:`~AnnotationEditor.quantizer` (a Quantizer that reproduces them anywhere),
:meth:`~AnnotationEditor.to_code` (the Python that builds it) and
:meth:`~AnnotationEditor.prepare` (the prepared model, with its plan).

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> gm = qviz.export(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), (torch.randn(2, 4),))
    >>> ed = AnnotationEditor(gm)
    >>> ed.edit("relu", dtype="uint8").overrides
    {'relu': {'dtype': 'uint8'}}
    >>> ed.plan.group_of("relu").spec.quant_max, ed.error
    (255, None)
    >>> ed.edit("relu", quant_min=-5).error  # refused: uint8 cannot hold -5; nothing changes
    "overrides['relu']: QuantizationSpec: quant_min=-5 does not fit torch.uint8 (range 0..255); choose a range inside it, or a wider dtype"
    >>> ed.undo().overrides
    {}
"""  # noqa: E501

from __future__ import annotations

import copy
import json
from typing import Any

from torch.fx import GraphModule

from qviz.engine.graph.stage import Stage, check_stage
from qviz.engine.pt2e.prepare import prepare_pt2e
from qviz.engine.quantizers.override import OverrideQuantizer, normalize_overrides
from qviz.errors import ConfigError, QvizError
from qviz.widgets.editor.view import EditorView
from qviz.widgets.kit.folding import Folding
from qviz.widgets.kit.view_owner import ViewOwner


def _dynamic_batch(gm: GraphModule) -> bool:
    """Whether the graph was exported with a symbolic first dimension (``dynamic_batch=True``)."""
    for node in gm.graph.nodes:
        shape = getattr(node.meta.get("val"), "shape", None)
        if node.op == "placeholder" and shape is not None and len(shape):
            return not isinstance(shape[0], int)
    return False


def _default_quantizer() -> Any:
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


def _check_quantizer(quantizer: Any) -> None:
    """``quantizer`` is None or a quantizer object (one with ``annotate``), not its name or
    its class: a ConfigError naming the argument and showing how to build one."""
    if quantizer is None or (
        not isinstance(quantizer, type) and callable(getattr(quantizer, "annotate", None))
    ):
        return
    what = "a class: build an instance of it" if isinstance(quantizer, type) else "no quantizer"
    raise ConfigError(
        f"AnnotationEditor(quantizer={quantizer!r:.60}): {what}. quantizer takes a quantizer "
        f"object, e.g. XNNPACKQuantizer().set_global(get_symmetric_quantization_config()) "
        f"(from qviz.engine.quantizers import XNNPACKQuantizer, "
        f"get_symmetric_quantization_config), or None for that with per-channel weights"
    )


class AnnotationEditor(ViewOwner):
    """Edit a quantizer's annotations node by node and watch the plan change.

    Args:
        exported_model: the float graph module from :func:`qviz.export` (never changed).
        quantizer: the base quantizer object, e.g.
            ``XNNPACKQuantizer().set_global(get_symmetric_quantization_config())`` (default:
            XNNPACK, int8, per-channel weights); a name such as ``"xnnpack"`` is refused.
        example_inputs: optional; only used by :meth:`to_code` to show the export call.
        graph: build the graph widget (False for headless use).

    Attributes:
        overrides: the edits, ``{key: {change: value}}`` (see
            :mod:`qviz.engine.quantizers.override` for keys and changes).
        selection: the selected node, edge (``"a -> b"``) or module (``"module/<path>"``).
        error: the last refused edit's message, or None.
        prepared: the prepared model of the current edits (its ``.plan`` is the plan shown).
        view: its :class:`~qviz.widgets.editor.view.EditorView` (the ipywidgets).
        widget: the ipywidgets box (the editor also renders itself in Jupyter).
    """

    def __init__(
        self,
        exported_model: GraphModule,
        quantizer: Any = None,
        *,
        example_inputs: tuple[Any, ...] | None = None,
        graph: bool = True,
    ) -> None:
        check_stage(
            exported_model, Stage.FLOAT, where="AnnotationEditor", arg="exported_model",
            exported=True,
        )  # fmt: skip
        _check_quantizer(quantizer)
        self.model = exported_model
        self.base = quantizer if quantizer is not None else _default_quantizer()
        self.example_inputs = example_inputs
        self.overrides: dict[str, dict[str, Any]] = {}
        self._undo: list[dict[str, dict[str, Any]]] = []
        self._redo: list[dict[str, dict[str, Any]]] = []
        self.selection = ""
        self.error: str | None = None
        self.prepared = prepare_pt2e(exported_model, self.quantizer)
        self._folding = Folding(exported_model)
        self.view = EditorView(self, with_graph=graph)
        self.view.refresh()

    # -- what the edits amount to ----------------------------------------------------------------
    @property
    def quantizer(self) -> OverrideQuantizer:
        """The base quantizer with the edits: use it anywhere ``prepare_pt2e`` takes one."""
        return OverrideQuantizer(self.base, copy.deepcopy(self.overrides))

    @property
    def plan(self) -> Any:
        """The current QuantPlan."""
        return self.prepared.plan

    def prepare(self) -> GraphModule:
        """A fresh prepared model of the current edits (calibrate and convert it as usual)."""
        return prepare_pt2e(self.model, self.quantizer)

    def to_code(self) -> str:
        """Python that rebuilds :attr:`quantizer` (and prepares the model with it)."""
        base = getattr(self.base, "to_code", lambda: None)()
        lines = [
            "import qviz",
            "from qviz.engine.quantizers import (",
            "    OverrideQuantizer,",
            "    XNNPACKQuantizer,",
            "    get_symmetric_quantization_config,",
            ")",
            "",
        ]
        if self.example_inputs is not None:
            dynamic = ", dynamic_batch=True" if _dynamic_batch(self.model) else ""
            lines.append(f"exported = qviz.export(model.eval(), example_inputs{dynamic})")
        if base is None:
            lines.append(f"base = ...  # your quantizer: {type(self.base).__name__}")
        else:
            lines.append(f"base = {base}")
        text = json.dumps(self.overrides, indent=4)
        lines.append(f"overrides = {text.replace('true', 'True').replace('false', 'False')}")
        lines.append("quantizer = OverrideQuantizer(base, overrides)")
        lines.append("prepared = qviz.prepare_pt2e(exported, quantizer)")
        return "\n".join(lines) + "\n"

    # -- Python equivalents of the controls ----------------------------------------------------
    def select(self, name: str) -> AnnotationEditor:
        """Select a node, an edge ``"producer -> consumer"`` or a module (its path)."""
        try:
            selection = self._check_name(name)
            self.error = None
        except QvizError as exc:
            self.error = str(exc)
        else:
            self.selection = selection
        self.view.refresh(redraw=False)
        return self

    def edit(self, name: str, **changes: Any) -> AnnotationEditor:
        """Apply ``changes`` to ``name`` (node, edge, module path or ``"op:<type>"``).

        Changes are named as in QuantizationSpec (``dtype``, ``quant_min``, ``quant_max``,
        ``qscheme``, ``ch_axis``, ``observer``) plus ``method``, ``quantize``, ``share_with``,
        ``scale`` / ``zero_point``. The engine re-plans at once; a refusal keeps the previous
        state and sets :attr:`error`.
        """
        candidate = copy.deepcopy(self.overrides)
        candidate[name] = {**candidate.get(name, {}), **changes}
        return self._apply(candidate)

    def reset(self, name: str) -> AnnotationEditor:
        """Drop every edit of ``name``."""
        candidate = {k: v for k, v in self.overrides.items() if k != name}
        return self._apply(candidate)

    @property
    def can_undo(self) -> bool:
        """Whether :meth:`undo` has an edit to take back."""
        return bool(self._undo)

    @property
    def can_redo(self) -> bool:
        """Whether :meth:`redo` has an edit to re-apply."""
        return bool(self._redo)

    def undo(self) -> AnnotationEditor:
        """Go back one edit (nothing happens when there is none)."""
        if self._undo:
            self._redo.append(self.overrides)
            self._replan(self._undo.pop())
        return self

    def redo(self) -> AnnotationEditor:
        """Re-apply the edit :meth:`undo` took back."""
        if self._redo:
            self._undo.append(self.overrides)
            self._replan(self._redo.pop())
        return self

    def toggle_module(self, path: str) -> AnnotationEditor:
        """Collapse a module drawn expanded, or expand one drawn collapsed (one level: its
        submodules that have submodules of their own stay collapsed)."""
        self.error = None
        self._folding.toggle(path)
        self.view.refresh()
        return self

    @property
    def collapsed(self) -> list[str]:
        """The module paths drawn as one box."""
        return self._folding.collapsed

    @collapsed.setter
    def collapsed(self, paths: list[str]) -> None:
        self._folding.collapsed = list(paths)

    def describe(self, name: str | None = None) -> dict[str, Any]:
        """What the panel shows for ``name`` (default: the selection), as plain data."""
        from qviz.widgets.editor.panel import describe

        return describe(self, self.selection if name is None else name)

    # -- internals -------------------------------------------------------------------------------
    def _apply(self, candidate: dict[str, dict[str, Any]]) -> AnnotationEditor:
        try:
            candidate = normalize_overrides(candidate)
            prepared = prepare_pt2e(self.model, OverrideQuantizer(self.base, candidate))
        except QvizError as exc:
            self.error = str(exc)
            self.view.refresh(redraw=False)
            return self
        self._undo.append(self.overrides)
        self._redo.clear()
        self.overrides, self.prepared, self.error = candidate, prepared, None
        self.view.refresh()
        return self

    def _replan(self, overrides: dict[str, dict[str, Any]]) -> None:
        self.overrides = overrides
        self.prepared = prepare_pt2e(self.model, self.quantizer)  # was valid before
        self.error = None
        self.view.refresh()

    def _check_name(self, name: str) -> str:
        name = name.strip()
        if name.startswith("module/"):
            name = name.removeprefix("module/")
        nodes = {n.name for n in self.model.graph.nodes}
        if "->" in name:
            producer, _, consumer = (s.strip() for s in name.partition("->"))
            if producer in nodes and consumer in nodes:
                return f"{producer} -> {consumer}"
        if name in nodes or name in self._folding.modules or name.startswith("op:"):
            return name
        raise ConfigError(
            f"{name!r} is not a node, edge ('producer -> consumer') or module of this model"
        )

    def __repr__(self) -> str:
        return (
            f"AnnotationEditor({len(self.plan.groups)} groups, {len(self.overrides)} edits, "
            f"selection={self.selection!r})"
        )
