"""The layout of qviz.viz: one folder per view that takes several modules, imports one way.

{graph, ranges} <- report: the graph and the ranges never import each other or the report; the
report draws both. The views of one module each (capabilities, folded, history_plot,
model_explorer) sit at the root and import no other view. Function-level imports count.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import qviz.viz

VIZ = Path(qviz.viz.__file__).parent
ROOT = VIZ.parent.parent

#: What each topic folder may import of the other topics.
TOPICS = {"graph": set(), "ranges": set(), "report": {"graph", "ranges"}}
#: The views of one module each, beside the folders.
SINGLE = {"capabilities", "folded", "history_plot", "model_explorer"}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in the file; ``from m import a`` gives ``m`` and
    ``m.a`` (a submodule or a name: the rules read only the first parts)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.relative_to(ROOT)}: a relative import"
            names.add(node.module or "")
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _part(name: str) -> str | None:
    """The topic folder or root module of qviz.viz a dotted name points into, else None."""
    parts = name.split(".")
    return parts[2] if parts[:2] == ["qviz", "viz"] and len(parts) > 2 else None


def test_topics_are_the_folders_and_single_views_the_root_modules():
    folders = {p.name for p in VIZ.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(TOPICS)
    assert {p.stem for p in VIZ.glob("*.py")} == SINGLE | {"__init__"}


@pytest.mark.parametrize("topic", sorted(TOPICS))
def test_topics_point_one_way(topic):
    """graph never imports ranges or report; ranges never imports graph or report; report
    imports both; no topic imports a root view or qviz.viz itself."""
    files = sorted((VIZ / topic).rglob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            where = f"{path.relative_to(ROOT)} imports {name}"
            assert _part(name) in TOPICS[topic] | {topic, None}, where
            assert name != "qviz.viz", where


@pytest.mark.parametrize("module", sorted(SINGLE))
def test_single_views_import_no_other_view(module):
    path = VIZ / f"{module}.py"
    for name in _imports(path):
        assert _part(name) is None and name != "qviz.viz", f"{path.name} imports {name}"


def test_the_rule_sees_a_wrong_import():
    assert _part("qviz.viz.report.guide.glossary") == "report"
    assert _part("qviz.viz.graph") == "graph" and _part("qviz.vizz.graph") is None
    assert {"qviz.viz.graph.dot", "qviz.viz.graph.dot.to_digraph"} <= _imports(
        VIZ / "graph" / "graphs.py"
    )
    assert _part("qviz.viz.ranges.histograms") not in TOPICS["graph"] | {"graph", None}


def test_each_topic_exports_what_qviz_viz_exports():
    """qviz.viz's public names are the topics' and the single views', the same objects."""
    names = set()
    for topic in TOPICS:
        package = importlib.import_module(f"qviz.viz.{topic}")
        assert package.__all__ and set(package.__all__) <= set(qviz.viz.__all__), topic
        assert all(getattr(qviz.viz, n) is getattr(package, n) for n in package.__all__)
        names.update(package.__all__)
    singles = {n for n in qviz.viz.__all__ if getattr(qviz.viz, n).__module__.count(".") == 2}
    assert names | singles == set(qviz.viz.__all__)
    assert {getattr(qviz.viz, n).__module__.rpartition(".")[2] for n in singles} == SINGLE


def test_graph_ranges_and_report_stay_the_functions_after_every_module_loads():
    """The folders share their names with qviz.viz's headline functions: loading any module of
    a folder later must not put the folder in the function's place."""
    for info in pkgutil.walk_packages(qviz.viz.__path__, "qviz.viz."):
        importlib.import_module(info.name)
    for name in ("graph", "ranges", "report"):
        assert inspect.isfunction(getattr(qviz.viz, name)), name
        assert getattr(qviz.viz, name).__module__.startswith(f"qviz.viz.{name}."), name
