"""The public surface: layering, import hygiene, and a docstring on everything public."""

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import qviz

OPTIONAL = ("matplotlib", "pandas", "graphviz", "ipywidgets", "IPython", "sklearn")
ONNX = ("onnx", "onnxscript", "onnx_ir", "onnxruntime")  # imported inside export_onnx only


def _modules():
    return [m.name for m in pkgutil.walk_packages(qviz.__path__, "qviz.") if m.name != "qviz.cli"]


@pytest.mark.parametrize("module", ["qviz", "qviz.engine", "qviz.engine.tensor.tensor_quant"])
def test_engine_imports_nothing_optional(module):
    code = f"import sys, {module}; print([m for m in {OPTIONAL + ONNX!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("module", _modules())
def test_every_public_name_has_a_docstring(module):
    """Every module, and every function and class it defines without a leading underscore
    (listed in ``__all__`` or not), has a docstring."""
    mod = importlib.import_module(module)
    assert mod.__doc__ and "Example" in mod.__doc__, f"{module} needs a docstring with an Example"
    for name, obj in vars(mod).items():
        defined_here = getattr(obj, "__module__", None) == mod.__name__
        if name[0] != "_" and defined_here and (inspect.isclass(obj) or inspect.isfunction(obj)):
            assert inspect.getdoc(obj), f"{module}.{name} has no docstring"


#: The modules whose ``__all__`` is qviz's public surface; every other module is internal and
#: lists nothing (its names are reached through these, or by their module path in tests).
PUBLIC_MODULES = {
    "qviz",
    "qviz.errors",
    "qviz.data",
    "qviz.engine.specs",
    "qviz.engine.qparams",
    "qviz.engine.quantizers",
    "qviz.engine.observers",
    "qviz.engine.observers.fake_quantize",
    "qviz.engine.backend_config",
    "qviz.engine.distributed",
    "qviz.engine.lower",
    "qviz.engine.repair",
    "qviz.engine.tensor.tensor_quant",
    "qviz.engine.tensor.calib",
    "qviz.engine.tensor.quant_nn",
    "qviz.engine.tensor.quant_modules",
    "qviz.engine.tensor.fine_tune",
    "qviz.display",
    "qviz.numeric",
    "qviz.numeric.measure",
    "qviz.numeric.compare",
    "qviz.numeric.variants",
    "qviz.numeric.lowering",
    "qviz.numeric.diagnose",
    "qviz.numeric.repair",
    "qviz.numeric.precision",
    "qviz.numeric.qat",
    "qviz.viz",
    "qviz.viz.graph",
    "qviz.viz.ranges",
    "qviz.viz.report",
    "qviz.widgets",
    "qviz.widgets.kit",
    "qviz.widgets.dashboard",
    "qviz.widgets.editor",
    "qviz.widgets.explorer",
    "qviz.widgets.precision",
    "qviz.widgets.qat",
}


def test_only_public_modules_list_names_in_all():
    import ast
    from pathlib import Path

    root = Path(qviz.__file__).parent.parent
    listing = set()
    for path in sorted((root / "qviz").rglob("*.py")):
        tree = ast.parse(path.read_text())
        if any(
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "__all__" for t in node.targets)
            for node in tree.body
        ):
            parts = path.relative_to(root).with_suffix("").parts
            listing.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert listing == PUBLIC_MODULES
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(module)
        assert all(hasattr(mod, name) for name in mod.__all__), module


def test_names_users_know_from_pytorch_quantization():
    from qviz.engine.tensor.calib import HistogramCalibrator, MaxCalibrator  # noqa: F401
    from qviz.engine.tensor.tensor_quant import (  # noqa: F401
        QUANT_DESC_8BIT_PER_TENSOR,
        QuantDescriptor,
        TensorQuantizer,
        fake_tensor_quant,
        tensor_quant,
    )

    assert issubclass(qviz.ConfigError, ValueError)
    assert callable(qviz.export_onnx) and "export_onnx" in qviz.__all__


LAYERS = ["qviz.engine", "qviz.display", "qviz.numeric", "qviz.viz", "qviz.widgets", "qviz.apps"]


def _imports(path) -> set[str]:
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _folder(layer: str):
    from pathlib import Path

    return Path(qviz.__file__).parent / layer.split(".")[1]


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if _folder(layer).is_dir()])
def test_dependencies_point_one_way(layer):
    """engine <- display <- numeric <- viz <- widgets <- apps: a layer never imports the layers
    above it; display imports nothing of qviz but its errors."""
    above = LAYERS[LAYERS.index(layer) + 1 :]
    folder = _folder(layer)
    assert any(folder.rglob("*.py"))
    for path in sorted(folder.rglob("*.py")):
        for name in _imports(path):
            assert not name.startswith(tuple(above)), f"{path} imports {name}"
            if layer == "qviz.engine":
                assert name.split(".")[0] not in OPTIONAL, f"{path} imports {name}"
            if layer == "qviz.display" and name.split(".")[0] == "qviz":
                assert name == "qviz.errors" or name.startswith("qviz.display"), f"{path}: {name}"


def test_subpackages_load_on_first_attribute_access_after_a_plain_import():
    code = (
        "import sys, qviz\n"
        "heavy = ('pandas', 'matplotlib', 'graphviz', 'ipywidgets')\n"
        "print([m for m in heavy if m in sys.modules])\n"
        "print(qviz.numeric.compare.__module__, qviz.viz.graph.__module__)\n"
        "print(qviz.widgets.AnnotationEditor.__name__, 'viz' in dir(qviz))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:3] == [
        "[]",
        "qviz.numeric.compare.compare qviz.viz.graph.graphs",
        "AnnotationEditor True",
    ]
    with pytest.raises(AttributeError, match="no attribute 'vizz'"):
        _ = qviz.vizz


def test_every_error_class_is_exported_from_qviz():
    import qviz.errors

    classes = {
        name
        for name, obj in vars(qviz.errors).items()
        if inspect.isclass(obj) and issubclass(obj, qviz.errors.QvizError)
    }
    assert classes <= set(qviz.__all__)
    assert all(getattr(qviz, name) is getattr(qviz.errors, name) for name in classes)


# Records mirroring a PyTorch quantization class keep its signature, positional arguments
# included, so code written against torchao / torch.ao / NVIDIA's toolkit runs unchanged.
SIGNATURE_OF_THE_ORIGINAL = {
    "qviz.engine.specs.QuantizationSpec",  # torchao.quantization.pt2e.quantizer
    "qviz.engine.specs.FixedQParamsQuantizationSpec",
    "qviz.engine.specs.DerivedQuantizationSpec",
    "qviz.engine.backend_config.dtypes.DTypeWithConstraints",  # torch.ao backend_config
    "qviz.engine.tensor.descriptor.QuantDescriptor",  # pytorch_quantization.tensor_quant
}


def test_records_with_more_than_five_fields_are_keyword_only():
    """House rule 5: a record of six fields or more is built by keyword, so adding or reordering
    a field never silently shifts a caller's positional arguments."""
    import dataclasses

    positional = []
    for module in _modules():
        for name, obj in vars(importlib.import_module(module)).items():
            if not (inspect.isclass(obj) and dataclasses.is_dataclass(obj)):
                continue
            if obj.__module__ != module or f"{module}.{name}" in SIGNATURE_OF_THE_ORIGINAL:
                continue
            fields = [f for f in dataclasses.fields(obj) if f.init]
            if len(fields) > 5 and any(not f.kw_only for f in fields):
                positional.append(f"{module}.{name} ({len(fields)} fields)")
    assert positional == []


def test_a_tutorial_quantizer_ports_with_one_import_line():
    """torchao's quantizer package re-exports the specs beside Quantizer; so does qviz's."""
    from qviz.engine import quantizers, specs

    for name in (
        "QuantizationSpec",
        "SharedQuantizationSpec",
        "FixedQParamsQuantizationSpec",
        "DerivedQuantizationSpec",
        "QuantizationAnnotation",
        "QuantizationConfig",
    ):
        assert getattr(quantizers, name) is getattr(specs, name)
        assert name in quantizers.__all__


#: Inside the engine, a subpackage imports only those before it: graph <- pt2e.passes <- pt2e.
ENGINE_ORDER = ["qviz.engine.graph", "qviz.engine.pt2e.passes", "qviz.engine.pt2e"]


def _all_imports(path) -> set[str]:
    """Every module a file imports, at module level or inside functions, relative ones resolved."""
    import ast
    from pathlib import Path

    root = Path(qviz.__file__).parent.parent
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts[:-1]  # a module's package; for __init__.py, the package itself
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("layer", ENGINE_ORDER)
def test_engine_subpackages_point_one_way(layer):
    """graph never imports the passes or the flow; the passes never import the flow."""
    from pathlib import Path

    root = Path(qviz.__file__).parent.parent
    above = ENGINE_ORDER[ENGINE_ORDER.index(layer) + 1 :]
    folder = root.joinpath(*layer.split("."))
    files = sorted(folder.rglob("*.py"))
    if layer == "qviz.engine.pt2e":
        return  # the top of the chain: nothing above it
    assert files
    for path in files:
        if layer == "qviz.engine.graph" or "passes" in path.parts:
            for name in _all_imports(path):
                for upper in above:
                    hit = name == upper or name.startswith(upper + ".")
                    if upper == "qviz.engine.pt2e":  # its passes are below it, not above
                        hit = hit and not name.startswith("qviz.engine.pt2e.passes")
                    assert not hit, f"{path.relative_to(root)} imports {name}"


#: Inside the numeric suite, a topic imports only the topics of lower rank (and itself):
#: measure <- compare <- {variants, lowering, diagnose} <- {repair, precision}; qat builds on
#: measure and compare only.
NUMERIC_ORDER = {
    "measure": 0,
    "compare": 1,
    "variants": 2,
    "lowering": 2,
    "diagnose": 2,
    "repair": 3,
    "precision": 3,
    "qat": 2,
}
NUMERIC_ALLOWED = {"qat": {"measure", "compare"}}


def _numeric_topic(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if parts[:2] == ["qviz", "numeric"] and len(parts) > 2 else None


def test_numeric_topics_are_the_folders():
    from pathlib import Path

    folder = Path(qviz.__file__).parent / "numeric"
    assert {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()} == set(NUMERIC_ORDER)
    assert [p.name for p in folder.glob("*.py")] == ["__init__.py"]  # no flat module left


@pytest.mark.parametrize("topic", sorted(NUMERIC_ORDER))
def test_numeric_topics_point_one_way(topic):
    """measure never imports compare; compare never imports variants, lowering or diagnose, which
    never import each other, repair or precision (function-level imports included)."""
    from pathlib import Path

    root = Path(qviz.__file__).parent.parent
    allowed = NUMERIC_ALLOWED.get(topic) or {
        t for t, rank in NUMERIC_ORDER.items() if rank < NUMERIC_ORDER[topic]
    }
    files = sorted((root / "qviz" / "numeric" / topic).rglob("*.py"))
    assert files
    for path in files:
        for name in _all_imports(path):
            other = _numeric_topic(name)
            if other in NUMERIC_ORDER and other != topic:
                assert other in allowed, f"{path.relative_to(root)} imports {name}"
            assert name != "qviz.numeric", f"{path.relative_to(root)} imports the suite's root"


def test_only_views_and_plots_of_numeric_import_matplotlib():
    """A numeric topic's records and computation never draw: matplotlib and qviz.display (the
    figure factory, the HTML tables, the bands) are imported only by the topic's view / plot
    module, lazily where the records call it."""
    from pathlib import Path

    root = Path(qviz.__file__).parent.parent
    drawing = []
    for path in sorted((root / "qviz" / "numeric").rglob("*.py")):
        names = _all_imports(path)
        if any(n.split(".")[0] == "matplotlib" or n.startswith("qviz.display") for n in names):
            drawing.append(path.relative_to(root).as_posix())
            assert path.stem.endswith(("view", "plot", "plots")), f"{path} draws"
        if not path.stem.endswith(("view", "plot", "plots")):  # no hand-written HTML table
            import ast

            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    assert "<table" not in node.value and "<td" not in node.value, (
                        f"{path}:{node.lineno} writes an HTML table: draw it in the topic's view"
                    )
    assert drawing  # the test sees the plots at all


HEADLINE = [
    "export",
    "prepare_pt2e",
    "prepare_qat_pt2e",
    "calibrate",
    "convert_pt2e",
    "calibrate_quantizers",
    "export_onnx",
    "numeric.compare",
    "numeric.sensitivity",
    "numeric.compare_lowered",
    "numeric.bisect_lowering",
    "numeric.diagnose",
    "numeric.RepairSession",
    "numeric.search_precision",
    "lower",
    "viz.graph",
    "viz.report",
    "viz.ranges",
]


@pytest.mark.parametrize("name", HEADLINE)
def test_headline_functions_carry_their_own_example(name):
    """Jupyter's ``?`` shows the function's docstring, not its module's."""
    obj = qviz
    for part in name.split("."):
        obj = getattr(obj, part)
    doc = inspect.getdoc(obj) or ""
    assert "Example" in doc and ">>> " in doc, f"qviz.{name} needs an Example in its docstring"


def _module_graph() -> dict[str, set[str]]:
    """Every module of qviz and the qviz modules it imports anywhere in its file (at module
    level, inside functions or ``if TYPE_CHECKING``), relative imports resolved; ``from m import
    name`` counts as importing ``m.name`` when that is a module, else ``m``."""
    from pathlib import Path

    root = Path(qviz.__file__).parent.parent
    files = {}
    for path in sorted(Path(qviz.__file__).parent.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def module_of(name: str) -> str:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in files.items():
        targets = {module_of(n) for n in _all_imports(path) if n.split(".")[0] == "qviz"}
        graph[module] = targets - {module, ""}
    return graph


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the chain of modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_cycles():
    """No module of qviz imports itself back through others, function-level imports included
    (a view and the widget it shows, a renderer and the records it reads: one way only)."""
    graph = _module_graph()
    assert "qviz.widgets.dashboard.view" in graph and "qviz.engine.pt2e.plan" in graph
    cycle = _a_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # it finds one
