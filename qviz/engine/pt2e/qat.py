"""prepare_qat_pt2e: prepare a model for quantization-aware training (QAT).

Like :func:`qviz.prepare_pt2e`, on a copy, with three differences (as torchao's
``prepare_qat_pt2e``):

1. the model is exported in train mode (``model.train()`` before :func:`qviz.export`): its
   BatchNorms are training BatchNorms, and are not folded;
2. after the quantizer annotates, each conv + BatchNorm pair is rewritten so that the conv's
   weight is fake-quantized as it will be once the BatchNorm is folded, while the BatchNorm
   keeps training (:mod:`qviz.engine.pt2e.passes.qat_conv_bn`); :func:`qviz.convert_pt2e` folds it;
3. the specs' constructors are fake-quantize modules (:mod:`qviz.engine.observers.fake_quantize`, from
   ``get_symmetric_quantization_config(is_qat=True)``): one per sharing group, inserted where
   PTQ puts observers, under the same names (``activation_post_process_<n>``), so
   ``prepared.plan`` records them exactly as it records observers.

Train the result with any optimizer (its parameters are the model's); ``qviz.convert_pt2e``
then gives the same quantize / dequantize format as after calibration.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU()).train()
    >>> gm = qviz.export(model, (torch.randn(2, 1, 5, 5),))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_qat=True))
    >>> prepared = qviz.prepare_qat_pt2e(gm, q)
    >>> [g.spec.observer for g in prepared.plan.groups]
    ['FusedMovingAvgObsFakeQuantize', 'FusedMovingAvgObsFakeQuantize', 'FusedMovingAvgObsFakeQuantize']
    >>> prepared(torch.randn(2, 1, 5, 5)).shape
    torch.Size([2, 2, 3, 3])
"""  # noqa: E501

from __future__ import annotations

import dataclasses
from typing import Any

from torch.fx import GraphModule

from qviz.engine.graph.control_flow import loop_bodies, replace_submodule
from qviz.engine.graph.debug_handles import assign_handles
from qviz.engine.graph.fingerprint import derived_copy
from qviz.engine.graph.train_eval import disallow_train_eval
from qviz.engine.observers.fake_quantize import is_fake_quantize
from qviz.engine.pt2e.annotations import collect_specs
from qviz.engine.pt2e.passes.observer_to_qdq import FLOAT_DTYPES
from qviz.engine.pt2e.passes.qat_conv_bn import fuse_conv_bn_for_qat
from qviz.engine.pt2e.plan import require_plan, set_plan
from qviz.engine.pt2e.prepare import check_inputs, observe_annotated
from qviz.engine.pt2e.qat_undo import ForwardUndo
from qviz.errors import ConfigError


def prepare_qat_pt2e(model: GraphModule, quantizer: Any) -> GraphModule:
    """Insert fake-quantize modules as ``quantizer`` annotates ``model``; return the copy.

    Args:
        model: a graph module from :func:`qviz.export` of a model in train mode.
        quantizer: a qviz Quantizer with a QAT config
            (``get_symmetric_quantization_config(is_qat=True)``), or any object with
            ``annotate`` and ``validate`` (torchao's quantizers included).

    Returns:
        A prepared copy of ``model`` with ``.plan``: train it, then :func:`qviz.convert_pt2e`.
        A fake-quantize module that observes a NaN or Inf raises a CalibrationError naming
        it and the tensor it observes, and a forward that raises puts every buffer back
        (fake-quantize state, BatchNorm statistics: :mod:`qviz.engine.pt2e.qat_undo`).

    Raises:
        ConfigError: ``model`` is not a float graph module, the quantizer cannot annotate, or a
            conv feeds a BatchNorm exported in eval mode.
        AnnotationError: annotations that cannot be executed, naming the node.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2)).train()
        >>> gm = qviz.export(model, (torch.randn(4, 1, 6, 6),))
        >>> config = get_symmetric_quantization_config(is_qat=True)
        >>> prepared = qviz.prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(config))
        >>> loss = prepared(torch.randn(4, 1, 6, 6)).square().mean()
        >>> loss.backward()                  # gradients flow through the fake quantizers
        >>> type(prepared.activation_post_process_0).__name__
        'FusedMovingAvgObsFakeQuantize'
    """
    check_inputs(model, quantizer, "prepare_qat_pt2e")
    gm = assign_handles(derived_copy(model))  # keeps the float model's origin
    transform = getattr(quantizer, "transform_for_annotation", None)
    gm = transform(gm) if transform is not None else gm
    quantizer.annotate(gm)
    quantizer.validate(gm)
    collect_specs(gm)  # checks the annotations (they keep the quantizer's classes)
    fuse_conv_bn_for_qat(gm)  # after annotating: the new ops are not quantized
    observe_annotated(gm, quantizer, {}, is_qat=True)
    _check_fake_quantized(gm, quantizer)
    paths = [path for _, path in loop_bodies(gm)]
    for path in paths:
        replace_submodule(gm, path, prepare_qat_pt2e(gm.get_submodule(path), quantizer))
    plan = dataclasses.replace(require_plan(gm), loop_bodies=tuple(paths))
    set_plan(gm, plan)
    ForwardUndo.attach(gm)  # a forward that raises leaves every buffer as it was
    return disallow_train_eval(gm)


def _check_fake_quantized(gm: GraphModule, quantizer: Any) -> None:
    """Refuse specs that build observers where QAT needs fake quantizers: with an observer the
    forward stays float, and the model would "train for quantization" without ever seeing it.
    (Float dtypes, dynamic placeholders, fixed and derived qparams are not trained ranges.)"""
    plain = []
    for g in require_plan(gm).groups:
        module = gm.get_submodule(g.observer)
        if g.spec.kind != "observed" or is_fake_quantize(module) or g.spec.is_dynamic:
            continue
        if getattr(module, "dtype", None) in FLOAT_DTYPES:
            continue
        members = ", ".join(str(m) for m in g.members[:2])
        plain.append(f"  {g.observer}: {type(module).__name__} observing {members}")
    if plain:
        raise ConfigError(
            f"prepare_qat_pt2e: {type(quantizer).__name__}'s specs build {len(plain)} "
            f"observer(s), not fake quantizers, so training would never see quantization:\n"
            + "\n".join(plain)
            + "\nuse a QAT config, e.g. XNNPACKQuantizer().set_global("
            "get_symmetric_quantization_config(is_qat=True)), or specs whose "
            "observer_or_fake_quant_ctr is a FakeQuantize; for post-training quantization use "
            "qviz.prepare_pt2e on a model exported in eval mode"
        )
