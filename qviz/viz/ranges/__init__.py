"""Ranges and values: what observers and calibrators saw, the range each method picks, the grid.

:func:`histogram` (:mod:`~qviz.viz.ranges.histograms`) draws what a calibrator or observer saw
with the range each calibration method picks, from the same data that
:mod:`~qviz.viz.ranges.histogram_svg` writes as fast SVG for widgets; :func:`ranges`
(:mod:`~qviz.viz.ranges.range_view`) puts every observer group of a prepared model on one axis;
:mod:`~qviz.viz.ranges.tensor_plots` draws what the integer grid does to one tensor
(:func:`ste_plot`, :func:`per_channel_gain_plot`, :func:`clipping_tradeoff_plot`). Each returns a
matplotlib Figure. Nothing here imports :mod:`qviz.viz.graph` or :mod:`qviz.viz.report`.

Example:
    >>> import torch
    >>> from qviz.viz.ranges import histogram
    >>> fig = histogram(torch.randn(10_000), methods=("max", "mse"))
    >>> [row["method"] for row in fig.qviz_rows]
    ['max', 'mse']
"""

from qviz.viz.ranges.histograms import histogram
from qviz.viz.ranges.range_view import ranges
from qviz.viz.ranges.tensor_plots import clipping_tradeoff_plot, per_channel_gain_plot, ste_plot

__all__ = [
    "clipping_tradeoff_plot",
    "histogram",
    "per_channel_gain_plot",
    "ranges",
    "ste_plot",
]
