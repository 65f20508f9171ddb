"""The tensor-level toolkit, with the semantics of NVIDIA's pytorch-quantization.

:class:`~qviz.engine.tensor.descriptor.QuantDescriptor` describes how a tensor is quantized,
:mod:`~qviz.engine.tensor.fake_quant` holds the arithmetic, :class:`TensorQuantizer` calibrates
and applies it, :mod:`~qviz.engine.tensor.calib` picks ranges, :mod:`~qviz.engine.tensor.quant_nn`
holds the quantized drop-in layers, :mod:`~qviz.engine.tensor.quant_modules` swaps them in,
:func:`~qviz.engine.tensor.calibrate_quantizers.calibrate_quantizers` and
:func:`~qviz.engine.tensor.fine_tune.fine_tune` run the calibration and the short fine-tuning.

A ported tutorial keeps its imports: ``from qviz.engine import quant_nn, quant_modules, calib``
and ``from qviz.engine.tensor_quant import QuantDescriptor`` name these same modules.

Example:
    >>> import torch
    >>> from qviz.engine.tensor.tensor_quant import fake_tensor_quant
    >>> fake_tensor_quant(torch.tensor([0.5, 1.0]), 1.0)
    tensor([0.5039, 1.0000])
"""
