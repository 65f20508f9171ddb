"""Which stage a model is at: float, prepared (observers), converted (q/dq) or quant_nn.

Every public entry point states the stages it takes and calls :func:`check_stage` first, before
it touches the model: handing it the wrong one is a ConfigError that says which stage the model
is at and what to pass instead, and the model is left exactly as it was (a prepared model's
observers see no data, a quant_nn model's calibrators none either). The stages each entry
point takes:

=================================  ===========================================================
``qviz.calibrate``                 prepared (calibrated or not)
``qviz.calibrate_quantizers``      quant_nn
``qviz.numeric.compare``           float (``float_model``); converted or quant_nn (``quantized``)
``sensitivity``, ``compare_configs``  float, the graph module ``qviz.export`` returned
``NumericDashboard.from_models``   float; converted
``fine_tune``                      quant_nn, calibrated
``qviz.data.evaluate``             float, converted or quant_nn (never prepared: its observers
                                   would see the evaluation data)
=================================  ===========================================================

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> model_stage(gm), model_stage(prepared)
    (<Stage.FLOAT: 'float'>, <Stage.PREPARED: 'prepared'>)
    >>> check_stage(gm, Stage.PREPARED, where="calibrate")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    qviz.errors.StageError: calibrate takes the model qviz.prepare_pt2e returned as model, but \
got a float GraphModule (never prepared: no observers, no quantize/dequantize ops); prepare it \
first: ...
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from torch import nn
from torch.fx import GraphModule

from qviz.engine.compat import OpOverload
from qviz.errors import ConfigError, StageError

_QDQ_NAMESPACES = ("quantized_decomposed", "torchao")


class Stage(enum.Enum):
    """Where a model is in the flow."""

    FLOAT = "float"  #: no observers, no quantize/dequantize ops: what prepare_pt2e takes
    PREPARED = "prepared"  #: has observers: calibrate it, then convert it
    CONVERTED = "converted"  #: quantize/dequantize ops and no observers: the result
    QUANT_NN = "quant_nn"  #: an eager module holding TensorQuantizers (quant_modules)


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
    """The stage of ``model``: observers make it PREPARED, q/dq ops without them CONVERTED,
    TensorQuantizers in an eager module QUANT_NN; anything else is FLOAT.

    A converted model quantized again (a second ``prepare_pt2e``) has both and is PREPARED.
    """
    from qviz.engine.tensor.tensor_quantizer import TensorQuantizer  # tensor/ imports graph/

    if any(is_observer(m) for m in model.modules()):
        return Stage.PREPARED
    if isinstance(model, GraphModule) and any(
        isinstance(n.target, OpOverload) and n.target.namespace in _QDQ_NAMESPACES
        for gm in model.modules()  # loop bodies included
        if isinstance(gm, GraphModule)
        for n in gm.graph.nodes
        if n.op == "call_function"
    ):
        return Stage.CONVERTED
    if not isinstance(model, GraphModule) and any(
        isinstance(m, TensorQuantizer) for m in model.modules()
    ):
        return Stage.QUANT_NN
    return Stage.FLOAT


#: What a model at each stage is, as an error message says it.
_IS = {
    Stage.FLOAT: "never prepared: no observers, no quantize/dequantize ops",
    Stage.PREPARED: "it holds observers: data run through it changes their statistics",
    Stage.CONVERTED: "already converted: quantize/dequantize ops, no observers",
    Stage.QUANT_NN: "an eager module holding TensorQuantizers",
}
#: What an entry point that takes a stage asks for.
_WANTED = {
    Stage.FLOAT: "the float model",
    Stage.PREPARED: "the model qviz.prepare_pt2e returned",
    Stage.CONVERTED: "the model qviz.convert_pt2e returned",
    Stage.QUANT_NN: "a quant_nn model (quant_modules.quantize_model(model))",
}
#: How to get from the stage a model is at to the one wanted.
_FIX = {
    (Stage.FLOAT, Stage.PREPARED): "prepare it first: prepared = qviz.prepare_pt2e(qviz.export("
    "model, example_inputs), quantizer), then pass `prepared`",
    (Stage.FLOAT, Stage.CONVERTED): "quantize it first: qviz.convert_pt2e(qviz.calibrate("
    "qviz.prepare_pt2e(exported, quantizer), data))",
    (Stage.FLOAT, Stage.QUANT_NN): "swap its layers with quant_modules.quantize_model(model) "
    "and calibrate them with qviz.calibrate_quantizers",
    (Stage.PREPARED, Stage.CONVERTED): "calibrate and convert it first: quantized = "
    "qviz.convert_pt2e(qviz.calibrate(prepared, data))",
    (Stage.CONVERTED, Stage.PREPARED): "there is nothing left to calibrate; calibrate the model "
    "qviz.prepare_pt2e returned, before qviz.convert_pt2e",
    (Stage.QUANT_NN, Stage.PREPARED): "a quant_nn model calibrates with "
    "qviz.calibrate_quantizers(model, data)",
    (Stage.QUANT_NN, Stage.FLOAT): "pass the float model, not its quant_nn copy (that one is "
    "the quantized_model)",
    (Stage.PREPARED, Stage.FLOAT): "pass the float model it was prepared from (what qviz.export "
    "returned)",
    (Stage.CONVERTED, Stage.FLOAT): "pass the float model it was prepared from (what "
    "qviz.export returned)",
}


def check_stage(
    model: object,
    stages: Stage | Iterable[Stage],
    *,
    where: str,
    arg: str = "model",
    exported: bool = False,
) -> Stage:
    """Raise a ConfigError unless ``model`` is at one of ``stages``; return its stage.

    Call it first, before the model runs: the error leaves the model as it was.

    Args:
        model: what the user passed.
        stages: the stage(s) the entry point takes.
        where: the entry point, as the message starts (``"compare"``).
        arg: the argument's name (``"quantized_model"``).
        exported: a float model must be the graph module ``qviz.export`` returned.

    Example:
        >>> check_stage(nn.Linear(2, 2), [Stage.FLOAT, Stage.CONVERTED], where="evaluate")
        <Stage.FLOAT: 'float'>
    """
    wanted = (stages,) if isinstance(stages, Stage) else tuple(stages)
    if not isinstance(model, nn.Module):
        names = " or ".join(_WANTED[s] for s in wanted)
        raise ConfigError(f"{where} takes {names} as {arg}, got a {type(model).__name__}")
    stage = model_stage(model)
    if stage in wanted and not (exported and not isinstance(model, GraphModule)):
        return stage
    kind = "GraphModule" if isinstance(model, GraphModule) else type(model).__name__
    if stage in wanted:  # a float eager module where the exported graph is needed
        raise StageError(
            f"{where} takes the graph module qviz.export returns as {arg} (it quantizes it), "
            f"got a {kind}: call qviz.export(model.eval(), example_inputs) first"
        )
    names = " or ".join(
        "the graph module qviz.export returned" if s is Stage.FLOAT and exported else _WANTED[s]
        for s in wanted
    )
    fix = _FIX.get((stage, wanted[0]), f"pass {names}")
    raise StageError(
        f"{where} takes {names} as {arg}, but got a {stage.value} {kind} ({_IS[stage]}); {fix}"
    )
