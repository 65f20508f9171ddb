"""The annotation editor: click a node, change how it is quantized, see the new plan at once.

:class:`AnnotationEditor` (:mod:`~qviz.widgets.editor.state`) keeps the edits as plain data;
:mod:`~qviz.widgets.editor.panel` reads what the panel shows for a selection from the plan, and
:class:`~qviz.widgets.editor.view.EditorView` (:mod:`~qviz.widgets.editor.view`) owns the
ipywidgets.

Example:
    >>> import torch, qviz
    >>> from qviz.widgets.editor import AnnotationEditor
    >>> gm = qviz.export(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    >>> AnnotationEditor(gm, graph=False).edit("linear", dtype="uint8").overrides
    {'linear': {'dtype': 'uint8'}}
"""

from qviz.widgets.editor.state import AnnotationEditor

__all__ = ["AnnotationEditor"]
