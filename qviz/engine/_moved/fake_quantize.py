"""``qviz.engine.fake_quantize`` before the move: :mod:`qviz.engine.observers.fake_quantize` (for
pickles)."""

from qviz.engine._moved import alias

alias(__name__, "qviz.engine.observers.fake_quantize")
