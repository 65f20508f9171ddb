"""The quantization engine: torch and the standard library only.

The root holds the foundations: :mod:`~qviz.engine.specs` (QuantizationSpec and friends),
:mod:`~qviz.engine.qparams` (pure qparam arithmetic) and :mod:`~qviz.engine.compat` (torch's
private APIs, in one place). The subpackages follow the flow: :mod:`~qviz.engine.graph` (facts
about a captured graph), :mod:`~qviz.engine.pt2e` (prepare / calibrate / convert, with its graph
passes), :mod:`~qviz.engine.quantizers`, :mod:`~qviz.engine.observers`,
:mod:`~qviz.engine.backend_config`, :mod:`~qviz.engine.tensor` (the tensor-level toolkit),
:mod:`~qviz.engine.onnx` and :mod:`~qviz.engine.distributed`.

``qviz.engine.tensor_quant``, ``quant_nn``, ``quant_modules`` and ``calib`` are the tensor
toolkit's modules under seed 004's import paths.

Example:
    >>> from qviz.engine.qparams import quant_range
    >>> quant_range(8)
    (-128, 127)
"""

from pathlib import Path as _Path

# old paths of moved modules (torch.load of a model saved before the move): see _moved/__init__.py
__path__.append(str(_Path(__file__).with_name("_moved")))
