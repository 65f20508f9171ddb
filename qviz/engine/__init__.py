"""The quantization engine: torch and the standard library only.

``qviz.engine.tensor_quant`` quantizes tensors (NVIDIA pytorch-quantization semantics),
``qviz.engine.calib`` picks clipping ranges, ``qviz.engine.qparams`` holds the pure arithmetic.

Example:
    >>> from qviz.engine.qparams import quant_range
    >>> quant_range(8)
    (-128, 127)
"""
