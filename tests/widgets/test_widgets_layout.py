"""The layout of qviz.widgets: the kit, and one folder per widget, imports one way.

kit <- {dashboard, editor, explorer, precision, qat}: a widget folder imports the kit and its
own modules, never another widget (nor ``qviz.widgets`` itself, which loads them all); the kit
imports no widget. In each widget folder ``state.py`` holds the widget (its state as plain data
and the methods every control calls) and imports no ipywidgets, ``view.py`` the View that owns
them; the state imports its view, the view never its state. Function-level imports count.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import qviz.widgets

WIDGETS = Path(qviz.widgets.__file__).parent
ROOT = WIDGETS.parent.parent

#: The folders that hold one widget each, and the widget's class.
WIDGET_FOLDERS = {
    "dashboard": "NumericDashboard",
    "editor": "AnnotationEditor",
    "explorer": "CalibrationExplorer",
    "precision": "PrecisionExplorer",
    "qat": "QATDashboard",
}
KIT = "kit"
#: What a state module must not import, anywhere in it: the ipywidgets belong to the view.
WIDGET_LIBRARIES = ("ipywidgets", "anywidget", "traitlets")


def _walk(node: ast.AST, *, into_functions: bool):
    """``node`` and everything under it; without ``into_functions``, not the bodies of
    functions (what runs at import: module level, class bodies, ``if`` / ``try`` blocks)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if into_functions or not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _walk(child, into_functions=into_functions)


def _imports(path: Path, *, module_level_only: bool = False) -> set[str]:
    """Every module ``path`` imports (anywhere in the file, or only what runs at import);
    ``from m import a`` gives ``m`` and ``m.a`` (a submodule or a name: the rules read only the
    first parts)."""
    names = set()
    for node in _walk(ast.parse(path.read_text()), into_functions=not module_level_only):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.relative_to(ROOT)}: a relative import"
            names.add(node.module or "")
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _part(name: str) -> str | None:
    """The folder of qviz.widgets a dotted name points into (``""`` for qviz.widgets itself or a
    name it exports), else None."""
    parts = name.split(".")
    if parts[:2] != ["qviz", "widgets"]:
        return None
    return parts[2] if len(parts) > 2 and parts[2] in {*WIDGET_FOLDERS, KIT} else ""


def test_the_folders_are_the_kit_and_one_per_widget():
    folders = {p.name for p in WIDGETS.iterdir() if (p / "__init__.py").is_file()}
    assert folders == {*WIDGET_FOLDERS, KIT}
    assert [p.name for p in WIDGETS.glob("*.py")] == ["__init__.py"]
    for folder in WIDGET_FOLDERS:
        assert (WIDGETS / folder / "state.py").is_file(), folder
        assert (WIDGETS / folder / "view.py").is_file(), folder


def test_the_kit_imports_no_widget():
    files = sorted((WIDGETS / KIT).rglob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            assert _part(name) in {KIT, None}, f"{path.relative_to(ROOT)} imports {name}"


@pytest.mark.parametrize("folder", sorted(WIDGET_FOLDERS))
def test_a_widget_imports_the_kit_and_itself_only(folder):
    files = sorted((WIDGETS / folder).rglob("*.py"))
    for path in files:
        for name in _imports(path):
            where = f"{path.relative_to(ROOT)} imports {name}"
            assert _part(name) in {folder, KIT, None}, where


@pytest.mark.parametrize("folder", sorted(WIDGET_FOLDERS))
def test_the_state_imports_no_ipywidgets_and_the_view_not_the_state(folder):
    state = WIDGETS / folder / "state.py"
    top = {n.split(".")[0] for n in _imports(state, module_level_only=True)}
    anywhere = {n.split(".")[0] for n in _imports(state)}
    assert not top & set(WIDGET_LIBRARIES), f"{folder}/state.py imports {top & {*WIDGET_LIBRARIES}}"
    assert not anywhere & set(WIDGET_LIBRARIES), f"{folder}/state.py: {anywhere}"
    assert f"qviz.widgets.{folder}.view" in _imports(state, module_level_only=True)
    view = _imports(WIDGETS / folder / "view.py")
    assert not {n for n in view if n.startswith(f"qviz.widgets.{folder}.state")}, folder
    assert f"qviz.widgets.{folder}" not in view, f"{folder}/view.py imports its package"


def test_the_rule_sees_a_wrong_import():
    assert _part("qviz.widgets.dashboard.table.Run") == "dashboard"
    assert _part("qviz.widgets.kit.layout") == KIT and _part("qviz.widgetsx.kit") is None
    assert _part("qviz.widgets") == "" and _part("qviz.widgets.NumericDashboard") == ""
    assert {"qviz.widgets.kit.layout", "qviz.widgets.kit.layout.row"} <= _imports(
        WIDGETS / "qat" / "view.py"
    )
    assert "qviz.widgets.editor.panel" in _imports(WIDGETS / "editor" / "state.py")  # in a def
    assert "qviz.widgets.editor.panel" not in _imports(
        WIDGETS / "editor" / "state.py", module_level_only=True
    )


def test_each_folder_exports_what_qviz_widgets_exports():
    """qviz.widgets' public names are its folders' (one widget each, the GraphWidget from the
    kit), the same objects."""
    names = []
    for folder in [*WIDGET_FOLDERS, KIT]:
        package = importlib.import_module(f"qviz.widgets.{folder}")
        assert package.__all__ and set(package.__all__) <= set(qviz.widgets.__all__), folder
        assert all(getattr(qviz.widgets, n) is getattr(package, n) for n in package.__all__)
        names.extend(package.__all__)
    assert sorted(names) == sorted(qviz.widgets.__all__)
    for folder, cls in WIDGET_FOLDERS.items():
        assert getattr(qviz.widgets, cls).__module__ == f"qviz.widgets.{folder}.state", cls


def test_the_shipped_assets_sit_beside_the_widget_that_loads_them():
    from qviz.widgets.kit.graph_widget import GraphWidget
    from qviz.widgets.precision.view import ParetoWidget

    for widget, folder in ((GraphWidget, WIDGETS / KIT), (ParetoWidget, WIDGETS / "precision")):
        for key in ("_esm", "_css"):
            path = Path(getattr(widget, key)._path)
            assert path.parent == folder / "static" and path.is_file(), (widget, key)
