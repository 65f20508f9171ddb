"""THE quantized model of the tests: a float model (or its exported graph) prepared, calibrated
and converted the way qviz builds every variant, through
:func:`qviz.numeric.variants.variants.prepare_variant` and then :func:`qviz.convert_pt2e`.

A test that needs a converted model calls :func:`quantize` rather than writing the
export / prepare / calibrate / convert steps again; one that tests those steps themselves (or
builds an oracle with torchao) writes them out.

Example:
    >>> import torch
    >>> q = quantize(torch.nn.Linear(4, 2), [torch.randn(8, 4)], per_channel=False)
    >>> q.prepared.plan is not None, q.converted.plan is not None
    (True, True)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn
from torch.fx import GraphModule

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.specs import QuantizationConfig
from qviz.numeric.variants.variants import prepare_variant


class Quantized(NamedTuple):
    """One model at three stages."""

    exported: GraphModule  #: the float graph (the argument itself when it was one)
    prepared: GraphModule  #: prepared and calibrated (convert works on a copy: still usable)
    converted: GraphModule  #: the reference quantized model


def xnnpack(config: QuantizationConfig | None = None, *, per_channel: bool = True) -> Any:
    """An XNNPACKQuantizer with ``config`` globally, or the symmetric configuration (weights
    per channel unless ``per_channel=False``)."""
    if config is None:
        config = get_symmetric_quantization_config(is_per_channel=per_channel)
    return XNNPACKQuantizer().set_global(config)


def quantize(
    model: nn.Module,
    data: Any,
    quantizer: Any = None,
    *,
    config: QuantizationConfig | None = None,
    per_channel: bool | None = None,
    example: tuple[Any, ...] | None = None,
    dynamic_batch: bool = False,
) -> Quantized:
    """``model`` exported (unless it is a GraphModule already), prepared with ``quantizer``,
    calibrated on ``data`` and converted.

    Args:
        model: an eager model (put in eval mode, then exported with ``qviz.export``) or an
            exported graph, taken as it is.
        data: the calibration data, as :func:`qviz.calibrate` takes it (a single tensor is one
            batch, a list is a list of batches).
        quantizer: the quantizer; by default :func:`xnnpack` of ``config`` / ``per_channel``.
        config: a QuantizationConfig for the default XNNPACKQuantizer.
        per_channel: the default symmetric configuration's weights (default True).
        example: the example inputs of the export (default: the first batch, a tensor).
        dynamic_batch: export with a dynamic batch dimension.

    Raises:
        TypeError: arguments that would be ignored (``config`` or ``per_channel`` with a
            quantizer, ``per_channel`` with a config, export arguments with a graph) or an
            example that cannot be read off ``data``.
    """
    if quantizer is not None and (config is not None or per_channel is not None):
        raise TypeError("quantize: give a quantizer, or a config / per_channel, not both")
    if config is not None and per_channel is not None:
        raise TypeError("quantize: per_channel is the default config's; give one of the two")
    if quantizer is None:
        quantizer = xnnpack(config, per_channel=True if per_channel is None else per_channel)
    gm = model if isinstance(model, GraphModule) else _exported(model, data, example, dynamic_batch)
    if gm is model and (example is not None or dynamic_batch):
        raise TypeError("quantize: example / dynamic_batch export a model; this one is a graph")
    prepared = prepare_variant(gm, quantizer, data, where="tests.helpers.quantize.quantize")
    return Quantized(gm, prepared, qviz.convert_pt2e(prepared))


def _exported(model: nn.Module, data: Any, example: Any, dynamic_batch: bool) -> GraphModule:
    if example is None:
        first = data if isinstance(data, torch.Tensor) else next(iter(data))
        if not isinstance(first, torch.Tensor):
            raise TypeError("quantize: the first batch is not a tensor; give example=(...)")
        example = (first,)
    return qviz.export(model.eval(), example, dynamic_batch=dynamic_batch)
