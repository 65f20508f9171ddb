"""Quantizers: decide which tensors of an exported graph are quantized, and how.

* :class:`Quantizer`: the contract (annotate, validate, optional transform and callback).
* :class:`ComposableQuantizer`: several quantizers on one graph, each claiming its own nodes.
* :class:`XNNPACKQuantizer` with :func:`get_symmetric_quantization_config`: int8 for XNNPACK.
* :class:`X86InductorQuantizer` with :func:`get_default_x86_inductor_quantization_config`:
  int8 for x86 CPUs through Inductor (``torch.compile``), torchao's recipe.
* :class:`FallbackQuantizer` and :class:`OverrideQuantizer`: keep nodes in float, or override
  what another quantizer decided, node by node.

The specs a quantizer writes (:class:`QuantizationSpec`, :class:`SharedQuantizationSpec`, ...)
are re-exported here, as torchao's quantizer package does, so a tutorial's quantizer ports by
changing one import line.

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
from qviz.engine.quantizers.x86_inductor import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)
from qviz.engine.quantizers.xnnpack import XNNPACKQuantizer
from qviz.engine.specs import (
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationConfig,
    QuantizationSpec,
    QuantizationSpecBase,
    SharedQuantizationSpec,
)

__all__ = [
    "ComposableQuantizer",
    "DerivedQuantizationSpec",
    "FallbackQuantizer",
    "FixedQParamsQuantizationSpec",
    "OverrideQuantizer",
    "QuantizationAnnotation",
    "QuantizationConfig",
    "QuantizationSpec",
    "QuantizationSpecBase",
    "Quantizer",
    "SharedQuantizationSpec",
    "X86InductorQuantizer",
    "XNNPACKQuantizer",
    "get_default_x86_inductor_quantization_config",
    "get_symmetric_quantization_config",
]
