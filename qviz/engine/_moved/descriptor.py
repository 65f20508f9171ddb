"""``qviz.engine.descriptor`` before the move: :mod:`qviz.engine.tensor.descriptor` (for
pickles)."""

from qviz.engine._moved import alias

alias(__name__, "qviz.engine.tensor.descriptor")
