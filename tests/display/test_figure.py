"""qviz's figures render themselves in a notebook without pyplot or ``%matplotlib inline``."""

from __future__ import annotations

import pytest

from qviz.display.figure import new_figure

PNG = b"\x89PNG\r\n\x1a\n"


def test_a_new_figure_renders_itself_as_png() -> None:
    pytest.importorskip("IPython")
    from IPython.core.formatters import DisplayFormatter

    fig = new_figure(figsize=(2, 1))
    fig.add_subplot().plot([0, 1], [1, 0])
    data, _ = DisplayFormatter().format(fig)
    assert data["image/png"].startswith(PNG)
    assert fig._repr_png_().startswith(PNG)


def test_the_views_figures_render_themselves() -> None:
    """Issue 25: ``monitor.plot()`` showed ``<Figure size 1000x572 with 4 Axes>``."""
    from qviz.numeric.compare import plots
    from qviz.viz.ranges import histograms, range_view

    for make in (plots._figure, histograms.new_figure, range_view._new_figure):
        assert make(figsize=(1, 1))._repr_png_().startswith(PNG), make
