"""Quantizers: decide which tensors of an exported graph are quantized, and how.

* :class:`Quantizer`: the contract (annotate, validate, optional transform and callback).
* :class:`ComposableQuantizer`: several quantizers on one graph, each claiming its own nodes.
* :class:`XNNPACKQuantizer` with :func:`get_symmetric_quantization_config`: int8 for XNNPACK.

Example:
    >>> import torch
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),)).module()
    >>> quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> gm = quantizer.annotate(quantizer.transform_for_annotation(gm))
    >>> [n.name for n in gm.graph.nodes if "quantization_annotation" in n.meta]
    ['weight', 'bias', 'linear']
"""

from qviz.engine.quantizers.base import ComposableQuantizer, Quantizer
from qviz.engine.quantizers.config import get_symmetric_quantization_config
from qviz.engine.quantizers.fallback import FallbackQuantizer
from qviz.engine.quantizers.override import OverrideQuantizer
from qviz.engine.quantizers.xnnpack import XNNPACKQuantizer

__all__ = [
    "ComposableQuantizer",
    "FallbackQuantizer",
    "OverrideQuantizer",
    "Quantizer",
    "XNNPACKQuantizer",
    "get_symmetric_quantization_config",
]
