"""qviz: see, steer and trust PyTorch quantization from a notebook.

The engine (``qviz.engine``) quantizes and records its decisions as plain data; the numeric suite
(``qviz.numeric``) measures what quantization did. ``qviz.data`` holds the embedded default: a
small CNN trained on scikit-learn's handwritten digits.

``qviz.numeric``, ``qviz.viz`` and ``qviz.widgets`` load on first attribute access, so
``import qviz`` stays light (no pandas, matplotlib, graphviz or ipywidgets) and
``qviz.viz.graph(...)`` works after it.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.tensor_quant import fake_tensor_quant
    >>> fake_tensor_quant(torch.tensor([0.1, 1.0]), 1.0)
    tensor([0.1024, 1.0000])
    >>> issubclass(qviz.QvizError, Exception)
    True
    >>> qviz.numeric.sqnr(torch.ones(2), torch.ones(2))
    inf
"""

import importlib
from typing import Any

from qviz.engine.graph.capture import export
from qviz.engine.graph.train_eval import (
    allow_exported_model_train_eval,
    freeze_bn_stats,
    move_exported_model_to_eval,
    move_exported_model_to_train,
    update_bn_stats,
)
from qviz.engine.lower import lower
from qviz.engine.onnx.export import export_onnx
from qviz.engine.pt2e.calibrate import calibrate
from qviz.engine.pt2e.convert import convert_pt2e
from qviz.engine.pt2e.prepare import annotate_pt2e, prepare_pt2e
from qviz.engine.pt2e.qat import prepare_qat_pt2e
from qviz.engine.tensor.calibrate_quantizers import calibrate_quantizers
from qviz.errors import (
    AnnotationError,
    CalibrationError,
    ConfigError,
    ExportedModeError,
    LoweringError,
    MeasurementError,
    MissingDependencyError,
    ModelMismatchError,
    OnnxExportError,
    QuantizationError,
    QvizError,
    StageError,
)

__version__ = "0.1.0"

__all__ = [
    "AnnotationError",
    "CalibrationError",
    "ConfigError",
    "ExportedModeError",
    "LoweringError",
    "MeasurementError",
    "MissingDependencyError",
    "ModelMismatchError",
    "OnnxExportError",
    "QuantizationError",
    "QvizError",
    "StageError",
    "__version__",
    "allow_exported_model_train_eval",
    "annotate_pt2e",
    "calibrate",
    "calibrate_quantizers",
    "convert_pt2e",
    "export",
    "export_onnx",
    "freeze_bn_stats",
    "lower",
    "move_exported_model_to_eval",
    "move_exported_model_to_train",
    "prepare_pt2e",
    "prepare_qat_pt2e",
    "update_bn_stats",
]

#: Subpackages loaded on first access (``qviz.viz`` imports graphviz and matplotlib).
_LAZY = ("data", "engine", "numeric", "viz", "widgets")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return importlib.import_module(f"qviz.{name}")
    raise AttributeError(f"module 'qviz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
