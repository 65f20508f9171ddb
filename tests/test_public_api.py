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
    mod = importlib.import_module(module)
    assert mod.__doc__ and "Example" in mod.__doc__, f"{module} needs a docstring with an Example"
    for name in getattr(mod, "__all__", []):
        obj = getattr(mod, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{module}.{name} has no docstring"


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


LAYERS = ["qviz.engine", "qviz.numeric", "qviz.viz", "qviz.widgets"]


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
    """engine <- numeric <- viz <- widgets: a layer never imports the layers above it."""
    above = LAYERS[LAYERS.index(layer) + 1 :]
    folder = _folder(layer)
    assert any(folder.rglob("*.py"))
    for path in sorted(folder.rglob("*.py")):
        for name in _imports(path):
            assert not name.startswith(tuple(above)), f"{path} imports {name}"
            if layer == "qviz.engine":
                assert name.split(".")[0] not in OPTIONAL, f"{path} imports {name}"
