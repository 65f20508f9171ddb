"""ONNX QDQ export: the only part of qviz that imports ``onnx`` (lazily, inside the functions).

:func:`~qviz.engine.onnx.export.export_onnx` (re-exported as ``qviz.export_onnx``) writes a
converted PT2E graph or a quant_nn model as QuantizeLinear / DequantizeLinear pairs.

Example:
    >>> import qviz
    >>> qviz.export_onnx.__module__
    'qviz.engine.onnx.export'
"""
