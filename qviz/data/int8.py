"""The embedded default's int8 recipe: the PT2E flow ``make run`` applies to DigitsNet.

XNNPACKQuantizer with symmetric int8 (per-channel weights unless asked otherwise), calibrated
on the calibration split. ``make run``, ``qviz train-digits`` (which records the int8 accuracy
beside the float one) and the reproducibility tests all use this one function.

Example:
    >>> from qviz.data import digits_loaders, digits_model
    >>> loaders = digits_loaders(batch_size=64)
    >>> exported, prepared, quantized = quantize_digits(digits_model(), loaders)
    >>> len(prepared.plan.groups) > 0
    True
"""

from __future__ import annotations

from typing import Any

from torch import nn

from qviz.data.digits import DigitsLoaders
from qviz.data.train import evaluate


def quantize_digits(
    model: nn.Module,
    loaders: DigitsLoaders,
    *,
    per_channel: bool = True,
    switchable: bool = False,
) -> tuple[Any, Any, Any]:
    """Export, prepare, calibrate and convert ``model``; return all three graphs.

    Args:
        model: a DigitsNet (or any model taking ``(N, 1, 8, 8)`` images), in eval mode.
        loaders: :func:`~qviz.data.digits_loaders`; its calibration split is used.
        per_channel: per-channel int8 weights (else per-tensor).
        switchable: activation observers keep an |x| histogram too, so every calibration
            method's range can be shown (the HTML report) and chosen after calibration.

    Returns:
        ``(exported, prepared, quantized)``: the captured float graph (any batch size), the
        calibrated prepared model (with ``.plan``) and the converted int8 model.
    """
    import qviz
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    from qviz.numeric.variants.variants import prepare_variant

    calib = [images for images, _ in loaders.calibration]
    exported = qviz.export(model, (calib[0],), dynamic_batch=True)  # the short last batch too
    config = get_symmetric_quantization_config(is_per_channel=per_channel, switchable=switchable)
    quantizer = XNNPACKQuantizer().set_global(config)
    prepared = prepare_variant(exported, quantizer, calib, where="quantize_digits")
    return exported, prepared, qviz.convert_pt2e(prepared)


def int8_accuracy(model: nn.Module, loaders: DigitsLoaders) -> float:
    """Test accuracy of ``model`` after :func:`quantize_digits` (per-channel weights)."""
    return evaluate(quantize_digits(model, loaders)[2], loaders.test)
