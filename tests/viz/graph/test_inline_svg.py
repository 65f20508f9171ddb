"""A QGraph in a notebook: inline SVG in HTML (tooltips work), fitted to the width, folded when
tall; no kernel or browser needed (tests/widgets/e2e/test_inline_graph_e2e.py checks a browser)."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

import qviz
from qviz.errors import ConfigError
from qviz.viz import graph
from qviz.viz.graph.inline_svg import InlineLayout, inline_html, should_fold, svg_size, text_px

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs graphviz's dot")


def _chain(depth: int) -> torch.fx.GraphModule:
    layers = [m for _ in range(depth) for m in (torch.nn.Linear(4, 4), torch.nn.ReLU())]
    return qviz.export(torch.nn.Sequential(*layers).eval(), (torch.randn(1, 4),))


def _svg(width_pt: float, height_pt: float, font: float = 11.0) -> str:
    return (
        f'<?xml version="1.0"?>\n<svg width="{width_pt}pt" height="{height_pt}pt" '
        f'viewBox="0.00 0.00 {width_pt:.2f} {height_pt:.2f}"><g id="node1">'
        f'<text font-size="{font:.2f}">x</text></g></svg>'
    )


@needs_dot
def test_small_graph_is_inline_svg_with_tooltips_and_prefixed_ids():
    g = graph(_chain(1))
    bundle = g._repr_mimebundle_()
    assert set(bundle) == {"text/html", "image/svg+xml", "text/plain"}
    html = bundle["text/html"]
    assert html.count("<svg") == 1 and "<?xml" not in html and "<!DOCTYPE" not in html
    assert "<details" not in html  # 3 boxes: shown as is
    assert "max-width:100%" in html and "height:auto" in html
    assert 'viewBox="' in html  # the aspect ratio comes from the viewBox
    # every tooltip Graphviz writes as a link title is also a <title> child, the hover text
    links = re.findall(r'<a xlink:title="([^"]*)"><title>([^<]*)</title>', html)
    assert len(links) == html.count("<a ") >= 3
    assert all(a == t for a, t in links)
    assert any("aten.linear" in t for _, t in links)
    # ids are prefixed, and what points at an id still finds it
    ids = re.findall(r'\sid="([^"]+)"', html)
    prefix = ids[0].split("-")[0] + "-"
    assert ids and all(i.startswith(prefix) for i in ids) and f'id="{prefix}node1"' in html
    assert 'id="node1"' not in html
    # the other front-ends keep the plain SVG document, and the text form
    assert bundle["image/svg+xml"].lstrip().startswith("<?xml")
    assert bundle["text/plain"].startswith("QGraph(stage='float'")


@needs_dot
def test_two_drawings_on_one_page_do_not_share_ids():
    g = graph(_chain(1))
    first, second = (set(re.findall(r'\sid="([^"]+)"', g.html())) for _ in range(2))
    assert first and second and not first & second


@needs_dot
def test_tall_graph_folds_under_a_summary_and_fold_chooses():
    g = graph(_chain(30))
    html = g.html()
    assert html.startswith('<details class="qviz-graph-fold">')
    summary = re.search(r"<summary[^>]*>(.*?)</summary>", html).group(1)
    assert f"float graph, {len(g)} nodes" in summary
    width, height = svg_size(g.svg()[g.svg().find("<svg") :])
    assert f"{width:.0f} × {height:.0f} px" in summary and height > 2200
    assert "qviz.widgets.GraphWidget.from_model(model)" in summary
    assert html.count("<svg") == 1 and html.endswith("</details>")
    assert "<details" not in graph(_chain(30), fold=False).html()
    assert "<details" in graph(_chain(1), fold=True).html()
    assert "<details" not in g.with_layout(max_height=height + 1).html()


def test_wide_graph_shrinks_until_its_text_is_10px_then_scrolls():
    layout = InlineLayout()
    # 11 pt text is 14.7 px: a 3000 pt (4000 px) graph may shrink to 10/14.7 of its width
    html = inline_html(_svg(3000, 300), layout, "float graph, 1 node")
    style = re.search(r'<svg[^>]*style="([^"]*)"', html).group(1)
    assert "width:4000px" in style and "max-width:100%" in style
    assert "min-width:2727px" in style  # 4000 * 10 / 14.67
    # past that, the graph's own box scrolls, no taller than the window: its scrollbars show
    assert 'class="qviz-graph-box" style="max-width:100%;max-height:90vh;overflow:auto"' in html
    assert "<details" not in html  # 300 pt tall at 2727 px wide: 545 px
    # 8 pt text (10.7 px) barely shrinks; a narrow graph is drawn at its own size, and in a
    # narrower output still stops shrinking at the same legible scale
    assert "min-width:3750px" in inline_html(_svg(3000, 300, font=8), layout, "g")
    narrow = inline_html(_svg(300, 300), layout, "g")
    assert "width:400px;" in narrow and "min-width:273px" in narrow
    assert "max-height" not in narrow and "overflow-x:auto" in narrow


def test_folding_counts_the_height_at_the_fitted_width():
    # 1500 pt wide, 900 pt tall: 2000 x 1200 px, fitted to 1000 px wide it is 600 px tall
    assert not should_fold(_svg(1500, 900, font=30)[22:], InlineLayout())
    # with 11 pt text it cannot shrink below 1364 px wide: 818 px tall, still under 1000
    assert not should_fold(_svg(1500, 900)[22:], InlineLayout())
    assert should_fold(_svg(1500, 900)[22:], InlineLayout(max_height=800))
    assert svg_size(_svg(75, 30)[22:]) == (100.0, 40.0)
    assert text_px(_svg(75, 30, font=9)[22:]) == 12.0
    mixed = _svg(75, 30, font=9)[22:].replace("</g>", '<text font-size="6.00">y</text></g>')
    assert text_px(mixed) == 8.0  # the smallest text decides how far the graph may shrink


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"fold": "yes"}, r"fold='yes'.*True"),
        ({"max_height": -5}, "max_height=-5"),
        ({"page_width": True}, "page_width=True"),
        ({"min_text_px": "10"}, "min_text_px='10'"),
    ],
)
def test_bad_layout_names_the_choice(changes, match):
    with pytest.raises(ConfigError, match=match):
        InlineLayout(**changes)


def test_with_layout_and_graph_fold_validate():
    g = graph(_chain(1))
    with pytest.raises(ConfigError, match=r"unknown \['height'\]"):
        g.with_layout(height=3)
    with pytest.raises(ConfigError, match="fold=1"):
        graph(_chain(1), fold=1)
    assert g.with_layout(max_height=50).layout.max_height == 50 and g.layout.max_height == 2200
    assert g.with_layout(fold=True).dot == g.dot  # the drawing itself is the same


def test_text_without_an_svg_is_refused():
    with pytest.raises(ConfigError, match="expected an SVG document"):
        inline_html("<html></html>", InlineLayout(), "g")
