"""The public surface: layering, import hygiene, and a docstring on everything public."""

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import qviz

OPTIONAL = ("matplotlib", "pandas", "graphviz", "ipywidgets", "IPython", "sklearn")


def _modules():
    return [m.name for m in pkgutil.walk_packages(qviz.__path__, "qviz.") if m.name != "qviz.cli"]


@pytest.mark.parametrize("module", ["qviz", "qviz.engine", "qviz.engine.tensor_quant"])
def test_engine_imports_nothing_optional(module):
    code = f"import sys, {module}; print([m for m in {OPTIONAL!r} if m in sys.modules])"
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
    from qviz.engine.calib import HistogramCalibrator, MaxCalibrator  # noqa: F401
    from qviz.engine.tensor_quant import (  # noqa: F401
        QUANT_DESC_8BIT_PER_TENSOR,
        QuantDescriptor,
        TensorQuantizer,
        fake_tensor_quant,
        tensor_quant,
    )

    assert issubclass(qviz.ConfigError, ValueError)
