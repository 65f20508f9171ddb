"""What the lowering tests share: a float model quantized for XNNPACK's int8 kernels."""

from __future__ import annotations

from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config


def xnnpack_converted(model: nn.Module, batches: list, dynamic: bool = True,
                      per_channel: bool = True):  # fmt: skip
    """``model`` exported (a dynamic batch unless ``dynamic=False``), quantized with
    XNNPACKQuantizer's symmetric configuration, calibrated on ``batches`` and converted."""
    gm = qviz.export(model.eval(), (batches[0],), dynamic_batch=dynamic)
    config = get_symmetric_quantization_config(is_per_channel=per_channel)
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    qviz.calibrate(prepared, batches, progress=False)
    return qviz.convert_pt2e(prepared)
