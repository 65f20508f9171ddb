"""The widgets' layout rules without a kernel: panes that share the cell's width and follow the
window's height, and figures shown at a size where no text is under 10 CSS pixels."""

from __future__ import annotations

import struct

import ipywidgets as w
import numpy as np
import pytest

from qviz.display.figure import new_figure
from qviz.errors import ConfigError
from qviz.numeric.compare.detail import LayerDetail
from qviz.widgets.kit.graph_widget import GraphWidget
from qviz.widgets.kit.layout import (
    FIGURE_CSS_DPI,
    MIN_TEXT_PX,
    PANE_HEIGHT,
    PIXEL_DENSITY,
    figure_image,
    legible,
    show_figure,
    split,
    text_px,
)


def _png_size(png: bytes) -> tuple[int, int]:
    """The pixel size a PNG declares in its IHDR chunk."""
    return struct.unpack(">II", png[16:24])


def _detail() -> LayerDetail:
    x = np.linspace(-1, 1, 200, dtype=np.float32)
    return LayerDetail(
        node="conv2d",
        sqnr=35.0,
        numel=200,
        float_values=x,
        quantized_values=x + 0.01,
        error_counts=np.ones(4),
        error_edges=np.linspace(0, 0.02, 5),
    )


def test_split_gives_both_panes_a_flex_share_of_the_cell():
    graph, panel = GraphWidget(), w.VBox([w.HTML("controls")])
    box = split(graph, panel, graph_width="45%")
    assert graph.layout.width is None  # no fixed width: the share follows the cell
    assert graph.layout.flex == "0 1 45%" and graph.layout.min_width == "200px"
    assert panel.layout.flex == "1 1 0%" and panel.layout.min_width == "0"
    assert box.layout.width == "100%" and list(box.children) == [graph, panel]


def test_the_graph_pane_height_follows_the_window():
    assert GraphWidget().height == PANE_HEIGHT
    assert PANE_HEIGHT.startswith("clamp(") and "vh" in PANE_HEIGHT
    low, _, high = PANE_HEIGHT.removeprefix("clamp(").removesuffix(")").split(", ")
    assert 300 <= int(low.removesuffix("px")) < int(high.removesuffix("px")) <= 1200
    assert GraphWidget(height="600px").height == "600px"  # a caller's height still wins


def test_the_dashboard_detail_is_legible_and_drawn_at_twice_its_display_size():
    fig = _detail().plot()
    picture = figure_image(fig)
    assert text_px(fig) >= MIN_TEXT_PX
    inches = fig.get_size_inches()
    assert (picture.width, picture.height) == tuple(round(v * FIGURE_CSS_DPI) for v in inches)
    natural = _png_size(picture.png)
    assert natural == (PIXEL_DENSITY * picture.width, PIXEL_DENSITY * picture.height)


def test_legible_raises_small_text_and_tick_labels_and_keeps_larger_text():
    fig = new_figure(figsize=(4, 3))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="line")
    ax.legend(fontsize=5)
    ax.tick_params(labelsize=6)
    title = ax.set_title("kept", fontsize=14)
    assert text_px(fig) == pytest.approx(5 * FIGURE_CSS_DPI / 72)
    legible(fig)
    assert text_px(fig) == pytest.approx(MIN_TEXT_PX)
    assert title.get_fontsize() == 14
    assert all(t.get_fontsize() >= 9 for t in ax.get_xticklabels())


def test_show_figure_keeps_the_aspect_ratio_and_never_stretches():
    image = w.Image(format="png")
    picture = figure_image(new_figure(figsize=(5, 2)))
    show_figure(image, picture)
    assert image.value == picture.png
    assert image.layout.width == "400px" and image.layout.max_width == "100%"
    assert image.layout.height == "auto" and image.layout.align_self == "flex-start"
    show_figure(image, None)
    assert image.value == b"" and image.layout.width is None


def test_figure_image_refuses_a_density_that_is_not_a_whole_number():
    with pytest.raises(ConfigError, match="density"):
        figure_image(new_figure(figsize=(1, 1)), density=0)
