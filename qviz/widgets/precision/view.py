"""The view of :class:`~qviz.widgets.precision.PrecisionExplorer`: the clickable
Pareto plot (:class:`ParetoWidget`), the selected point's line and per-layer table, "use this",
and the float graph coloured by precision. :class:`PrecisionExplorerView` owns the ipywidgets,
built once and refreshed from the explorer's state (the controls only call its Python methods).

Example:
    >>> from qviz.numeric.precision.result import Evaluation, FrontPoint, PrecisionResult
    >>> front = (FrontPoint(1.0, 28.0, ("w4a8",)), FrontPoint(2.0, 41.0, ("w8a8",)))
    >>> r = PrecisionResult(target="output_sqnr", limit=40.0, float_metric=None, cost_unit="KiB",
    ...     units=(), layers=(), reference=("w8a8",), screened=(), front=front,
    ...                     evaluations=(Evaluation(point=1, cost=2.0, output_sqnr=40.5,
    ...     metric=None, meets=True),), chosen=1)
    >>> point_labels(r)
    ['point 0: cost 1 KiB, estimate 28', 'point 1: cost 2 KiB, estimate 41 (chosen)']
    >>> plot_svg(r, 0).count('id="qviz-point-')
    2
"""

from __future__ import annotations

import html
import io
import math
from pathlib import Path
from typing import Any, Protocol

import anywidget
import traitlets

from qviz.numeric.precision.plot import pareto_plot
from qviz.numeric.precision.result import PRECISION_COLOURS
from qviz.widgets.kit.graph_panel import FoldedGraph
from qviz.widgets.kit.graph_widget import strip_prolog
from qviz.widgets.kit.layout import row, scrolling, split

_STATIC = Path(__file__).parent / "static"
#: The plot's size in inches: at the CSS min-width of the SVG its legend is still 10 px.
_PLOT_SIZE = (5.6, 3.5)
_GREY = "color:#555;line-height:1.4"


class ParetoWidget(anywidget.AnyWidget):  # type: ignore[misc]
    """A Pareto plot's SVG in the notebook; a click on a front point reports its index.

    The SVG is :func:`~qviz.numeric.precision.plot.pareto_plot`'s, in which front point ``i``
    is the element with id ``qviz-point-<i>``; a click picks the point nearest the pointer
    (``static/pareto_widget.js``, shipped inside qviz: no CDN, no build step).

    Attributes:
        svg: the drawing (an ``<svg>`` element).
        labels: the hover text of each front point, by index.
        picked: ``{"index": front index, "n": click count}``, set by the browser; ``n`` counts
            clicks, so the same point twice fires twice.

    Example:
        >>> w, seen = ParetoWidget(), []
        >>> _ = w.observe(lambda change: seen.append(change["new"]["index"]), "picked")
        >>> w.picked = {"index": 3, "n": 1}
        >>> w.picked = {"index": 3, "n": 2}
        >>> seen
        [3, 3]
    """

    _esm = _STATIC / "pareto_widget.js"
    _css = _STATIC / "pareto_widget.css"

    svg = traitlets.Unicode("").tag(sync=True)
    labels = traitlets.List(traitlets.Unicode(), []).tag(sync=True)
    picked = traitlets.Dict({"index": -1, "n": 0}).tag(sync=True)


def plot_svg(result: Any, selected: int | None) -> str:
    """The Pareto plot of ``result`` with front point ``selected`` ringed, as SVG text (no
    prolog; matplotlib's clip-path ids are random, so two plots on a page do not collide).

    Example:
        >>> from qviz.numeric.precision.result import FrontPoint, PrecisionResult
        >>> r = PrecisionResult(target="output_sqnr", limit=40.0, float_metric=None,
        ...     cost_unit="KiB", units=(), layers=(), reference=(), screened=(),
        ...                     front=(FrontPoint(1.0, 28.0,
        ...     ("w4a8",)),), evaluations=(), chosen=None)
        >>> svg = plot_svg(r, 0)
        >>> svg.startswith("<svg"), 'id="qviz-point-0"' in svg
        (True, True)
    """
    fig = pareto_plot(result, selected=selected, size=_PLOT_SIZE)
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    return strip_prolog(buffer.getvalue())


def point_labels(result: Any) -> list[str]:
    """The hover text of each front point: its index, cost and estimated figure.

    Example:
        >>> from types import SimpleNamespace
        >>> from qviz.numeric.precision.result import FrontPoint
        >>> r = SimpleNamespace(front=(FrontPoint(0.5, 0.97, ("w8a8",)),), cost_unit="GBOP",
        ...                     chosen=0)
        >>> point_labels(r)
        ['point 0: cost 0.5 GBOP, estimate 0.97 (chosen)']
    """
    return [
        f"point {i}: cost {p.cost:.4g} {result.cost_unit}, estimate {p.estimate:.4g}"
        + (" (chosen)" if i == result.chosen else "")
        for i, p in enumerate(result.front)
    ]


def evaluation_of(result: Any, point: int) -> Any:
    """The last full evaluation of front point ``point`` (None: it was not evaluated).

    Example:
        >>> from types import SimpleNamespace
        >>> evaluation_of(SimpleNamespace(evaluations=()), 0) is None
        True
    """
    found = [e for e in result.evaluations if e.point == point]
    return found[-1] if found else None


def mix_text(choice: tuple[str, ...]) -> str:
    """How many units take each precision: ``"2 w8a8, 1 w4a8"``.

    Example:
        >>> mix_text(("w8a8", "w4a8", "w8a8"))
        '2 w8a8, 1 w4a8'
    """
    counts: dict[str, int] = {}
    for precision in choice:
        counts[precision] = counts.get(precision, 0) + 1
    return ", ".join(f"{n} {p}" for p, n in counts.items())


def point_html(result: Any, point: int) -> str:
    """The selected point's line: its cost, estimate, precisions and, if it was evaluated, the
    figure measured and whether it meets the target.

    Example:
        >>> from qviz.numeric.precision.result import FrontPoint, PrecisionResult
        >>> r = PrecisionResult(target="output_sqnr", limit=40.0, float_metric=None,
        ...     cost_unit="KiB", units=(), layers=(), reference=(), screened=(),
        ...                     front=(FrontPoint(1.0, 28.0,
        ...     ("w4a8",)),), evaluations=(), chosen=None)
        >>> "not evaluated" in point_html(r, 0)
        True
    """
    p = result.front[point]
    chosen = " (the search's choice)" if point == result.chosen else ""
    head = (
        f"<b>point {point}</b>{chosen}: cost <b>{p.cost:.4g} {html.escape(result.cost_unit)}"
        f"</b>, estimated {_figure(result, p.estimate)}; {html.escape(mix_text(p.choice))}"
    )
    e = evaluation_of(result, point)
    if e is None:
        measured = f'<span style="{_GREY}">not evaluated (estimate only)</span>'
    else:
        verdict, colour = ("meets", "#1a7f37") if e.meets else ("misses", "#b00020")
        measured = (
            f"measured <b>{_figure(result, result.figure_of(e))}</b>: "
            f'<b style="color:{colour}">{verdict}</b> {html.escape(result.target_text())}'
        )
    return f'<div class="qviz-precision-point" style="line-height:1.4">{head}<br>{measured}</div>'


def _figure(result: Any, value: float) -> str:
    """A figure of the target's kind: ``"output SQNR 45.6 dB"`` or ``"metric 0.97"``."""
    if result.target == "metric":
        return f"metric {value:.4g}"
    return f"output SQNR {value:.4g} dB"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return html.escape(str(value))


def table_html(table: Any) -> str:
    """``result.table(i)`` as an HTML table, each precision cell in its graph colour.

    Example:
        >>> import pandas as pd
        >>> t = table_html(pd.DataFrame([{"node": "linear", "precision": "w8a8", "cost": 0.5}]))
        >>> "<td>linear</td>" in t and "#a6d96a" in t and "<td>0.5</td>" in t
        True
    """
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = []
    for record in table.to_dict("records"):
        cells = []
        for column, value in record.items():
            style = ""
            if column == "precision":
                style = f' style="background:{PRECISION_COLOURS.get(value, "#74add1")}"'
            cells.append(f"<td{style}>{_cell(value)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return scrolling(
        '<table class="qviz-precision-table" style="border-collapse:collapse;font-size:12px">'
        f"<tr>{head}</tr>{''.join(body)}</table>"
    )


def table_note(result: Any, point: int) -> str:
    """What the per-layer table shows, above it.

    Example:
        >>> from types import SimpleNamespace
        >>> "the output SQNR (dB)" in table_note(SimpleNamespace(target="output_sqnr"), 2)
        True
    """
    figure = "the metric" if result.target == "metric" else "the output SQNR (dB)"
    return (
        f'<div style="{_GREY}"><b>point {point}, layer by layer</b>: each layer\'s precision '
        f"and its unit's cost there; <b>screened P</b>: {figure} with that unit alone at "
        f"precision P</div>"
    )


class Explorer(Protocol):
    """What :class:`PrecisionExplorerView` reads and calls: a PrecisionExplorer's surface."""

    result: Any
    float_model: Any
    selected: int
    point: int | None
    quantizer: Any
    error: str | None

    def select(self, point: int) -> Any: ...

    def use(self, point: int | None = None) -> Any: ...


class PrecisionExplorerView:
    """The explorer's Pareto plot, point line, "use this" button, table and graph.

    Args:
        explorer: the explorer shown (its public methods are what the controls call).
        with_graph: draw the float graph coloured by precision beside the panel.

    Attributes:
        widget: the ipywidgets box shown in Jupyter.
        plot: the :class:`ParetoWidget`; ``point``, ``table``, ``summary``, ``used``,
            ``status``, ``table_note``: HTML outputs; ``use``: the "use this" button.
        graph: the :class:`~qviz.widgets.kit.graph_widget.GraphWidget` (None without a graph).

    Example:
        >>> import torch, qviz
        >>> from qviz.numeric.precision.result import FrontPoint, PrecisionResult
        >>> from qviz.widgets.precision import PrecisionExplorer
        >>> r = PrecisionResult(target="output_sqnr", limit=40.0, float_metric=None,
        ...     cost_unit="KiB", units=(), layers=(), reference=(), screened=(),
        ...     front=(FrontPoint(1.0, 30.0, ()), FrontPoint(2.0, 45.0,
        ...     ())), evaluations=(), chosen=None)
        >>> gm = qviz.export(torch.nn.ReLU(), (torch.randn(2),))
        >>> view = PrecisionExplorer(r, gm, graph=False).view
        >>> view.plot.picked = {"index": 0, "n": 1}   # a click on point 0
        >>> "<b>point 0</b>" in view.point.value
        True
    """

    def __init__(self, explorer: Explorer, *, with_graph: bool) -> None:
        import ipywidgets as w

        self._explorer = explorer
        self._svgs: dict[int, str] = {}
        self._drawn: int | None = None
        result = explorer.result
        self.summary = w.HTML(f'<div style="{_GREY}">{html.escape(result.summary())}</div>')
        self.plot = ParetoWidget(labels=point_labels(result))
        self.point, self.table, self.used, self.status = w.HTML(), w.HTML(), w.HTML(), w.HTML()
        self.use = w.Button(
            description="use this",
            icon="check",
            button_style="primary",
            tooltip="hand back this point's quantizer (explorer.quantizer)",
        )
        self._pane = FoldedGraph() if with_graph else None
        self.graph = self._pane.widget if self._pane is not None else None
        self.plot.observe(self._picked, "picked")
        self.use.on_click(lambda _: explorer.use())
        caption = (
            f'<div style="{_GREY}">click a point: the estimate of each assignment on the front '
            "(grey), the full evaluations (green: meets the target, red: misses)</div>"
        )
        panel = w.VBox([self.summary, w.HTML(caption), self.plot, self.point,
                        row([self.use, self.used]), self.status])  # fmt: skip
        self.table_note = w.HTML()
        table = w.VBox([self.table_note, self.table], layout=w.Layout(width="100%"))
        self.widget = w.VBox([split(self.graph, panel, graph_width="45%"), table])

    def refresh(self) -> None:
        """Show the explorer's state: plot, point line, table, graph, use, status."""
        ex = self._explorer
        i = ex.selected
        if i not in self._svgs:
            self._svgs[i] = plot_svg(ex.result, i)
        self.plot.svg = self._svgs[i]
        self.point.value = point_html(ex.result, i)
        self.table.value = table_html(ex.result.table(i))
        self.table_note.value = table_note(ex.result, i)
        if self._pane is not None and self._drawn != i:
            self._drawn = i
            self._pane.draw(ex.float_model, metrics=ex.result.at(i), metric_column="precision")
        self.use.description = "in use" if ex.point == i else "use this"
        self.used.value = (
            f'<div style="{_GREY}">using point {ex.point}: <code>explorer.quantizer</code></div>'
            if ex.point is not None
            else ""
        )
        self.status.value = (
            f'<div style="color:#b00020">⚠ {html.escape(ex.error)}</div>' if ex.error else ""
        )

    def _picked(self, change: dict[str, Any]) -> None:
        index = (change["new"] or {}).get("index", -1)
        if isinstance(index, int) and index >= 0:
            self._explorer.select(index)
