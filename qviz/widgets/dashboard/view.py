"""The view of :class:`~qviz.widgets.dashboard.NumericDashboard`: :class:`DashboardView` owns its
ipywidgets, built once and refreshed from the dashboard's state after every change (the controls
only call the dashboard's Python methods).

Example:
    >>> row_label({"node": "conv2d_1", "op": "conv2d", "local_sqnr": 2.5, "cumulative_sqnr": 1.25,
    ...            "weight_sqnr": float("nan"), "fallback": False})
    'conv2d_1             conv2d          2.50    1.25       -'
    >>> runs = [{"fallback": [], "output_sqnr": 12.0, "metric": None},
    ...         {"fallback": ["conv2d_1"], "output_sqnr": 40.0, "metric": None}]
    >>> "12.00 → 40.00 dB" in history_html(runs)
    True
"""

from __future__ import annotations

import html
import math
from typing import Any, Protocol

from torch.fx import GraphModule

from qviz.errors import QvizError
from qviz.widgets.dashboard.repair import CAUSE_COLUMN, REMEDY_CHOICES, finding_html
from qviz.widgets.dashboard.table import HIGHER_IS_BETTER, LOWERING_COLUMN, SORT_COLUMNS
from qviz.widgets.kit.graph_panel import FoldedGraph
from qviz.widgets.kit.layout import FigureImage, figure_image, row, scrolling, show_figure, split

_STYLE = (
    "<style>.qviz-dash-rows select, .qviz-dash-mono {font-family: monospace; font-size: 12px; "
    "white-space: pre}</style>"
)
#: The table of layers grows with the browser window, as the graph beside it does.
_ROWS_HEIGHT = "clamp(200px, 34vh, 560px)"


def _num(value: Any) -> str:
    v = float(value) if isinstance(value, int | float) else math.nan
    return "-" if math.isnan(v) else f"{v:.2f}"


def _line(node: str, op: str, numbers: list[str], delta: bool) -> str:
    """A table line; with the change column a repair session adds after a remedy, every
    column is narrower so the line still fits the pane."""
    name, kind, num = (18, 10, 7) if delta else (20, 12, 8)
    return f"{node[:name]:<{name}} {op[:kind]:<{kind}}" + "".join(f"{n:>{num}}" for n in numbers)


def row_label(row: dict[str, Any]) -> str:
    """One line of the table: node, op, local, cumulative and weight SQNR (dB), and in a
    repair session after a remedy the change of cumulative SQNR by it."""
    delta = "cumulative_delta" in row
    node, op = str(row["node"]), str(row.get("op", ""))
    if row.get("fallback"):
        return f"{_line(node, op, [], delta)}  in float (fallback)"
    cols = [_num(row.get(k)) for k in ("local_sqnr", "cumulative_sqnr", "weight_sqnr")]
    if delta:
        v = row["cumulative_delta"]
        cols.append("-" if not isinstance(v, float) or math.isnan(v) else f"{v:+.2f}")
    return _line(node, op, cols, delta)


_HEADER = _line("node", "op", ["local", "cumul.", "weight"], delta=False)
#: The header with the change column a repair session's table adds after a remedy.
_HEADER_DELTA = _line("node", "op", ["local", "cumul.", "weight", "Δcumul"], delta=True)
_CAPTION = (
    "SQNR in dB (higher is better): <b>local</b> with this layer alone quantized, "
    "<b>cumul.</b> with every layer up to it quantized, <b>weight</b> of its weight"
)
_CAPTION_DELTA = _CAPTION + ", <b>Δcumul</b> the change of cumul. by the last remedy"
#: The colour scale of SQNR columns, dB.
_SQNR_SCALE = (0.0, 50.0)


def _header(delta: bool) -> str:
    caption, header = (_CAPTION_DELTA, _HEADER_DELTA) if delta else (_CAPTION, _HEADER)
    return (
        f'{_STYLE}<div style="color:#555;font-size:12px">{caption}</div>'
        f'<div class="qviz-dash-mono">{html.escape(header)}</div>'
    )


def history_html(history: list[dict[str, Any]]) -> str:
    """The runs as a table: layers in float (or the remedy), output SQNR and metric, and each
    one's change against the run before it (as a RepairSession's Δ: what that run changed);
    the line above the table gives the first and the last run's output SQNR."""
    if not history:
        return ""
    first = history[0]
    repair = any(run.get("remedy") for run in history)
    body = []
    for i, run in enumerate(history):
        style = ' style="font-weight:bold;background:#eef6ee"' if i == len(history) - 1 else ""
        names = (run.get("remedy") if repair else ", ".join(run["fallback"])) or "none (as given)"
        previous = history[i - 1] if i else None
        d_sqnr = f"{run['output_sqnr'] - previous['output_sqnr']:+.2f}" if previous else ""
        metric, d_metric = "", ""
        if run["metric"] is not None:
            metric = f"{run['metric']:.4g}"
            if previous is not None and previous["metric"] is not None:
                d_metric = f"{run['metric'] - previous['metric']:+.4g}"
        body.append(
            f"<tr{style}><td>{i}</td><td>{html.escape(names)}</td>"
            f"<td>{run['output_sqnr']:.2f}</td><td>{d_sqnr}</td>"
            f"<td>{metric}</td><td>{d_metric}</td></tr>"
        )
    change = "remedy" if repair else "layers in float (fallback)"
    delta = '<th title="change against the run before (the row above)">Δ vs prev.</th>'
    head = "".join(f"<th>{h}</th>" for h in ("run", change, "output SQNR dB")) + delta
    head += "<th>metric</th>" + delta
    last = history[-1]
    summary = (
        f"<div>before → after: output SQNR <b>{first['output_sqnr']:.2f} → "
        f"{last['output_sqnr']:.2f} dB</b></div>"
    )
    return summary + scrolling(
        '<table class="qviz-dash-history" style="border-collapse:collapse;'
        f'font-size:12px"><tr>{head}</tr>{"".join(body)}</table>'
    )


class Dashboard(Protocol):
    """What :class:`DashboardView` reads and calls: the public surface of a NumericDashboard."""

    state: Any
    error: str | None
    quantizer: Any
    lowered: Any
    lowering: Any
    session: Any

    @property
    def diagnosis(self) -> Any: ...

    @property
    def color_options(self) -> tuple[str, ...]: ...

    @property
    def rows(self) -> list[dict[str, Any]]: ...

    @property
    def history(self) -> list[dict[str, Any]]: ...

    @property
    def report(self) -> Any: ...

    @property
    def quantized_model(self) -> GraphModule | None: ...

    def detail(self, node: str | None = None) -> Any: ...

    def select(self, node: str) -> Any: ...

    def sort(self, by: str) -> Any: ...

    def color_by(self, column: str) -> Any: ...

    def toggle_fallback(self, node: str | None = None) -> Any: ...

    def finding(self, node: str | None = None) -> Any: ...

    def apply(self, remedy: Any = None, **kwargs: Any) -> Any: ...

    def undo(self) -> Any: ...


class DashboardView:
    """The dashboard's controls, table, heatmap graph, layer detail and run history.

    Args:
        dash: the dashboard shown (its public methods are what the controls call).
        with_graph: draw the quantized model as a heatmap beside the table.

    Attributes:
        widget: the ipywidgets box shown in Jupyter.
        graph: the :class:`~qviz.widgets.kit.graph_widget.GraphWidget` (None without a graph).
        sort_by, color_by, rows, fallback, progress, history, status, detail, detail_note: the
            controls and outputs (``rows`` is the table, a Select of ``(label, node)``).
        remedy, apply, undo, diagnosis: in a repair session (shown in place of the fallback
            toggle): the remedy menu, its buttons, and the selected layer's diagnosis.

    Example:
        >>> from qviz.numeric import NumericReport
        >>> from qviz.widgets.dashboard import NumericDashboard
        >>> r = NumericReport.from_table([{"node": "a", "local_sqnr": 4.0}], output_sqnr=4.0)
        >>> view = NumericDashboard(r).view
        >>> view.rows.value, view.graph is None
        ('a', True)
    """

    def __init__(self, dash: Dashboard, *, with_graph: bool) -> None:
        import ipywidgets as w

        self._dash = dash
        self._syncing = False
        self._row_options: tuple = ()
        self._graph_key: tuple | None = None
        self._pngs: dict[tuple, FigureImage] = {}
        st = dash.state
        self.sort_by = w.Dropdown(
            options=list(SORT_COLUMNS), value=st.sort_by, description="sort by"
        )
        self.color_by = w.Dropdown(
            options=list(dash.color_options), value=st.color_by, description="colour by"
        )
        self.header = w.HTML(_header(delta=False))
        self.rows = w.Select(
            options=[], rows=12, layout=w.Layout(width="100%", height=_ROWS_HEIGHT)
        )
        self.rows.add_class("qviz-dash-rows")
        self.fallback = w.ToggleButton(
            description="fallback this layer", icon="undo", layout=w.Layout(width="200px")
        )
        self.progress = w.IntProgress(value=0, min=0, max=1, description="re-run")
        self.history, self.status = w.HTML(), w.HTML()
        self.detail = w.Image(format="png")  # shown at its CSS size by show_figure
        self.detail_note = w.HTML()
        self.remedy = w.Dropdown(options=list(REMEDY_CHOICES), description="remedy")
        self.apply = w.Button(description="apply", icon="wrench", button_style="primary")
        self.undo = w.Button(description="undo", icon="undo")
        self.diagnosis = w.HTML()
        self._pane = FoldedGraph(on_select=self._clicked) if with_graph else None
        self.graph = self._pane.widget if self._pane is not None else None
        self._wire()
        actions = (
            [row([self.remedy, self.apply, self.undo]), self.diagnosis]
            if dash.session is not None
            else [row([self.fallback, self.progress])]
        )
        panel = w.VBox(
            [
                row([self.sort_by, self.color_by]),
                self.header,
                self.rows,
                *actions,
                self.history,
                self.status,
            ]
        )
        top = split(self.graph, panel, graph_width="45%", panel_width=440)
        self.widget = w.VBox([top, self.detail_note, self.detail])

    def on_batch(self, done: int, total: int) -> None:
        """Show a re-run's progress: ``done`` of ``total`` batches."""
        self.progress.max = max(total, 1)
        self.progress.value = done
        self.progress.description = f"{done}/{total}"

    def refresh(self) -> None:
        """Show the dashboard's state: controls, table, graph, detail, history, status."""
        dash = self._dash
        st = dash.state
        options = tuple((row_label(r), str(r["node"])) for r in dash.rows)
        self._syncing = True
        try:
            self.sort_by.value, self.color_by.value = st.sort_by, st.color_by
            if options != self._row_options:
                self.rows.options, self._row_options = options, options
            self.rows.value = st.selected
            self.fallback.value = st.selected in st.fallback
            self._refresh_graph()
        finally:
            self._syncing = False
        self.fallback.disabled = st.selected is None
        self.fallback.tooltip = "" if dash.quantizer else "fallback needs quantizer= (from_models)"
        if dash.session is not None:
            steps = dash.session.history
            step = steps[-1] if steps else None
            self.header.value = _header(delta=step is not None)
            self.diagnosis.value = finding_html(st.selected, dash.finding(), step)
            self.undo.disabled = not steps
            self.undo.tooltip = f"undo {step.remedy}" if step else "no remedy applied"
        self._refresh_detail()
        self.history.value = history_html(dash.history)
        self.status.value = self._status()

    # -- internals -------------------------------------------------------------------------------
    def _wire(self) -> None:
        dash = self._dash

        def on(control: Any, action: Any) -> None:
            def handler(change: dict[str, Any]) -> None:
                if not self._syncing and change["new"] is not None:
                    action(change["new"])

            control.observe(handler, "value")

        on(self.sort_by, dash.sort)
        on(self.color_by, dash.color_by)
        on(self.rows, dash.select)
        on(self.fallback, lambda _: dash.toggle_fallback())
        self.apply.on_click(lambda _: self._apply())
        self.undo.on_click(lambda _: dash.undo())

    def _apply(self) -> None:
        """Say what runs (a rebuild takes seconds), then apply the chosen remedy."""
        what = self.remedy.value
        self.status.value = f'<div style="color:#555">applying {html.escape(what)} …</div>'
        self._dash.apply(what)

    def _clicked(self, name: str) -> None:
        if not self._syncing:
            self._dash.select(self._row_of(name))

    def _row_of(self, name: str) -> str:
        """The table row a graph click stands for: an edge's consumer (or producer); for a
        quantize/dequantize node, the operator whose output it quantizes, or else (a weight's)
        the operator it feeds; otherwise the name itself."""
        from qviz.numeric.compare.runs import qdq_ops

        quantize, dequantize = qdq_ops()

        def _is_qdq(node: Any) -> bool:
            return node.op == "call_function" and node.target in quantize | dequantize

        rows = {str(r["node"]) for r in self._dash.rows}
        if "->" in name:
            producer, _, consumer = (s.strip() for s in name.partition("->"))
            return consumer if consumer in rows else producer
        model = self._dash.quantized_model
        start = next((n for n in model.graph.nodes if n.name == name), None) if model else None
        if start is None or not _is_qdq(start):
            return name
        node = start
        while _is_qdq(node) and isinstance(node.args[0], type(node)):
            node = node.args[0]
        if node.name in rows:
            return str(node.name)
        node = start
        while _is_qdq(node) and len(node.users) == 1:
            node = next(iter(node.users))
        return str(node.name) if node.name in rows else name

    def _refresh_graph(self) -> None:
        if self._pane is None:
            return
        st = self._dash.state
        key = (st.fallback, st.builds, st.color_by)
        if key != self._graph_key:  # redraw (Graphviz) only when the model or the colours change
            self._graph_key = key
            self._pane.draw(self._dash.quantized_model, **graph_colours(self._dash, st))
        self._pane.select(st.selected or "")

    def _refresh_detail(self) -> None:
        st = self._dash.state
        key = (st.fallback, st.builds, st.selected)
        if st.selected is None:
            self.detail_note.value = "<i>select a layer</i>"
            show_figure(self.detail, None)
            return
        if key not in self._pngs:
            try:
                self._pngs[key] = figure_image(self._dash.detail(st.selected).plot())
            except QvizError as exc:
                note = f'<div style="color:#555">detail: {html.escape(str(exc))}</div>'
                self.detail_note.value = note
                show_figure(self.detail, None)
                return
        self.detail_note.value = (
            f"<b>{html.escape(st.selected)}</b>: quantized against float outputs on the first batch"
        )
        show_figure(self.detail, self._pngs[key])

    def _status(self) -> str:
        if self._dash.error:
            return f'<div style="color:#b00020">⚠ {html.escape(self._dash.error)}</div>'
        return f'<div style="color:#555">{html.escape(self._dash.report.summary())}</div>'


def graph_colours(dash: Any, st: Any) -> dict[str, Any]:
    """``qviz.viz.graph``'s colouring arguments for the dashboard's state: a report column, SQNR
    on an absolute scale (0 dB red .. 50 dB green: after a fix, healthy layers stay green), or
    the lowering comparison's steps; the lowered program's kernels are marked on the model as
    given (a fallback run is another model, which was not lowered)."""
    as_given = not st.fallback and not st.builds
    lowered = dash.lowered if as_given else None
    if st.color_by == LOWERING_COLUMN:
        return {"metrics": dash.lowering if as_given else None, "lowered": lowered}
    if st.color_by == CAUSE_COLUMN:
        return {"metrics": dash.diagnosis, "metric_column": CAUSE_COLUMN, "lowered": lowered}
    return {
        "metrics": dash.report,
        "metric_column": st.color_by,
        "higher_is_better": st.color_by in HIGHER_IS_BETTER,
        "metric_range": _SQNR_SCALE if st.color_by.endswith("sqnr") else None,
        "lowered": lowered,
    }
