"""The exceptions qviz raises.

Every error a user can reach is a :class:`QvizError`, so one ``except QvizError`` catches them
all; each subclass also derives from the matching built-in (``ValueError``, ``RuntimeError``,
``ImportError``) so code written against the built-ins keeps working. Messages name the thing
that is wrong (the tensor, the argument) and say how to fix it.

A caller that wants to tell apart a wrong stage or another model catches
:class:`StageError` or :class:`ModelMismatchError`; both are :class:`ConfigError` too, so an
``except ConfigError`` written before them still catches them.

Example:
    >>> from qviz.errors import ConfigError, QvizError, StageError
    >>> issubclass(ConfigError, QvizError) and issubclass(ConfigError, ValueError)
    True
    >>> issubclass(StageError, ConfigError)
    True
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

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
]


class QvizError(Exception):
    """Base class of every error qviz raises on purpose."""


class ConfigError(QvizError, ValueError):
    """An argument or configuration value is invalid (unknown method, bad num_bits, ...)."""


class StageError(ConfigError):
    """A model at the wrong stage for this step: a prepared model where a converted one is
    needed, an eager module where the graph qviz.export returned is, ... (the message names the
    stage it got and the call that makes the one it needs)."""


class ModelMismatchError(ConfigError):
    """A record (a report, a diagnosis, a lowered program, a reference model) read against a
    model it was not made from: other operators, other weights, or other qparams or statistics
    (the message says which part differs)."""


class QuantizationError(QvizError, ValueError):
    """A tensor cannot be quantized as asked (negative values for unsigned, negative amax, ...)."""


class AnnotationError(QvizError, ValueError):
    """Quantization annotations cannot be executed (unresolvable sharing, a wrong edge, ...)."""


class CalibrationError(QvizError, RuntimeError):
    """Calibration data is missing or unusable (nothing collected, NaN or Inf values, ...)."""


class ExportedModeError(QvizError, NotImplementedError):
    """``train()`` / ``eval()`` on an exported graph, where they would switch nothing."""


class OnnxExportError(QvizError, ValueError):
    """A quantized model cannot be written as ONNX as asked (a range no integer type of the
    opset holds, an operator ONNX has no QuantizeLinear form for, ...)."""


class LoweringError(QvizError, RuntimeError):
    """A converted model cannot be put on a backend's kernels as asked: the backend's compiler
    failed, or this machine's kernels would not compute the model's integer format exactly (the
    message names the operator or the machine class, and the other way to lower it)."""


class MeasurementError(QvizError, ValueError):
    """A figure the numeric suite measured is not a number to decide on (NaN, or infinite
    without an exact match behind it): ranking, the precision search and repair refuse it,
    naming the figure, the model it was measured on, why it is not a number and the fix."""


class MissingDependencyError(QvizError, ImportError):
    """An optional package or system program is needed for this feature and is not installed."""


def closest_names(name: str, known: Iterable[str], n: int = 3) -> str:
    """The hint for a name that matches nothing: the closest known names, or that none is close.

    Every place that takes a node or module name from the user says the same when it is a typo.

    Example:
        >>> closest_names("featurez", ["features", "classifier"])
        "closest: ['features']"
        >>> closest_names("zzz", ["features"])
        'no close match'
    """
    close = difflib.get_close_matches(str(name), sorted(set(known)), n=n)
    return f"closest: {close}" if close else "no close match"
