"""Measurement arithmetic, no model runs: metrics, streaming sums, slices, totals, batches.

:mod:`~qviz.numeric.measure.metrics` (SQNR, clipped share), exact streaming sums
(:mod:`~qviz.numeric.measure.streaming`), per-slice statistics
(:mod:`~qviz.numeric.measure.slices`), whole-output totals
(:mod:`~qviz.numeric.measure.totals`), binding a batch to a model's outputs
(:mod:`~qviz.numeric.measure.batches`) and the progress bar
(:mod:`~qviz.numeric.measure.progress`). Every other topic of the numeric suite builds on these;
nothing here imports another topic.

Example:
    >>> import torch
    >>> from qviz.numeric.measure import sqnr
    >>> round(sqnr(torch.ones(4), torch.full((4,), 1.1)), 1)
    20.0
"""

from qviz.numeric.measure.metrics import clipped_fraction, sqnr

__all__ = ["clipped_fraction", "sqnr"]
