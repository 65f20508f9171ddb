"""Which stage of the PT2E flow a model is at: float, prepared (observers) or converted (q/dq).

Every entry point that needs one stage (prepare wants float, calibrate and convert want
prepared) asks :func:`model_stage` first, so handing it the wrong one gets an error that says
which stage the model is at and what to pass instead, not a failure deep inside the graph.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> model_stage(gm), model_stage(prepared)
    (<Stage.FLOAT: 'float'>, <Stage.PREPARED: 'prepared'>)
"""

from __future__ import annotations

import enum

from torch import nn
from torch.fx import GraphModule

from qviz.engine.compat import OpOverload

__all__ = ["Stage", "is_observer", "model_stage"]

_QDQ_NAMESPACES = ("quantized_decomposed", "torchao")


class Stage(enum.Enum):
    """Where a model is in the flow."""

    FLOAT = "float"  #: no observers, no quantize/dequantize ops: what prepare_pt2e takes
    PREPARED = "prepared"  #: has observers: calibrate it, then convert it
    CONVERTED = "converted"  #: quantize/dequantize ops and no observers: the result


def is_observer(module: nn.Module) -> bool:
    """An observer: an nn.Module with ``calculate_qparams`` and a ``dtype``, or one that
    converts itself (``convert(model, node)``, as torchao's affine observers do).

    Example:
        >>> from qviz.engine.observers import MinMaxObserver
        >>> is_observer(MinMaxObserver()), is_observer(nn.Linear(1, 1))
        (True, False)
    """
    return callable(getattr(module, "calculate_qparams", None)) and (
        hasattr(module, "dtype") or callable(getattr(module, "convert", None))
    )


def model_stage(model: nn.Module) -> Stage:
    """The stage of ``model``: observers make it PREPARED, q/dq ops without them CONVERTED.

    A converted model quantized again (a second ``prepare_pt2e``) has both and is PREPARED.
    """
    if any(is_observer(m) for m in model.modules()):
        return Stage.PREPARED
    if isinstance(model, GraphModule) and any(
        isinstance(n.target, OpOverload) and n.target.namespace in _QDQ_NAMESPACES
        for n in model.graph.nodes
        if n.op == "call_function"
    ):
        return Stage.CONVERTED
    return Stage.FLOAT
