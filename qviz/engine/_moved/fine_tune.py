"""``qviz.engine.fine_tune`` before the move: :mod:`qviz.engine.tensor.fine_tune` (its imports,
and pickles of its EpochRecord / FineTuneHistory)."""

from qviz.engine._moved import alias

alias(__name__, "qviz.engine.tensor.fine_tune")
