"""``qviz.engine.tensor_quantizer`` before the move: :mod:`qviz.engine.tensor.tensor_quantizer`
(for pickles)."""

from qviz.engine._moved import alias

alias(__name__, "qviz.engine.tensor.tensor_quantizer")
