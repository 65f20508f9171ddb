"""The ipywidgets and figures of :class:`~qviz.widgets.dashboard.NumericDashboard`: built once,
refreshed from its state after every change (the controls only call its Python methods).

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
import io
import math
from typing import Any

from qviz.widgets.layout import scrolling

__all__ = ["build_view", "figure_png", "history_html", "refresh_view", "row_label"]

_STYLE = (
    "<style>.qviz-dash-rows select, .qviz-dash-mono {font-family: monospace; font-size: 12px; "
    "white-space: pre}</style>"
)


def _num(value: Any) -> str:
    v = float(value) if isinstance(value, int | float) else math.nan
    return "-" if math.isnan(v) else f"{v:.2f}"


def row_label(row: dict[str, Any]) -> str:
    """One line of the table: node, op, local, cumulative and weight SQNR (dB)."""
    head = f"{str(row['node'])[:20]:<20} {str(row.get('op', ''))[:12]:<12}"
    if row.get("fallback"):
        return f"{head}  in float (fallback)"
    cols = (row.get("local_sqnr"), row.get("cumulative_sqnr"), row.get("weight_sqnr"))
    return head + "".join(f"{_num(v):>8}" for v in cols)


_HEADER = f"{'node':<20} {'op':<12}{'local':>8}{'cumul.':>8}{'weight':>8}"
_CAPTION = (
    "SQNR in dB (higher is better): <b>local</b> with this layer alone quantized, "
    "<b>cumul.</b> with every layer up to it quantized, <b>weight</b> of its weight"
)


def history_html(history: list[dict[str, Any]]) -> str:
    """The runs as a table: layers in float, output SQNR and metric, each against the first."""
    if not history:
        return ""
    first = history[0]
    body = []
    for i, run in enumerate(history):
        style = ' style="font-weight:bold;background:#eef6ee"' if i == len(history) - 1 else ""
        names = ", ".join(run["fallback"]) or "none (as given)"
        d_sqnr = run["output_sqnr"] - first["output_sqnr"]
        metric, d_metric = "", ""
        if run["metric"] is not None:
            metric = f"{run['metric']:.4g}"
            if first["metric"] is not None:
                d_metric = f"{run['metric'] - first['metric']:+.4g}"
        body.append(
            f"<tr{style}><td>{i}</td><td>{html.escape(names)}</td>"
            f"<td>{run['output_sqnr']:.2f}</td><td>{d_sqnr:+.2f}</td>"
            f"<td>{metric}</td><td>{d_metric}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("run", "layers in float (fallback)", "output SQNR dB", "Δ", "metric", "Δ")
    )
    last = history[-1]
    summary = (
        f"<div>before → after: output SQNR <b>{first['output_sqnr']:.2f} → "
        f"{last['output_sqnr']:.2f} dB</b></div>"
    )
    return summary + scrolling(
        '<table class="qviz-dash-history" style="border-collapse:collapse;'
        f'font-size:12px"><tr>{head}</tr>{"".join(body)}</table>'
    )


def figure_png(fig: Any, dpi: int = 80) -> bytes:
    """A matplotlib Figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def build_view(dash: Any, with_graph: bool) -> None:
    """Create the controls and wire each to the dashboard's Python equivalent."""
    import ipywidgets as w

    from qviz.widgets.dashboard import COLOR_COLUMNS, SORT_COLUMNS
    from qviz.widgets.layout import row, split

    st = dash.state
    dash._sort = w.Dropdown(options=list(SORT_COLUMNS), value=st.sort_by, description="sort by")
    dash._color = w.Dropdown(
        options=list(COLOR_COLUMNS), value=st.color_by, description="colour by"
    )
    dash._header = w.HTML(
        f'{_STYLE}<div style="color:#555;font-size:12px">{_CAPTION}</div>'
        f'<div class="qviz-dash-mono">{html.escape(_HEADER)}</div>'
    )
    dash._rows = w.Select(options=[], rows=12, layout=w.Layout(width="100%"))
    dash._rows.add_class("qviz-dash-rows")
    dash._fallback = w.ToggleButton(
        description="fallback this layer", icon="undo", layout=w.Layout(width="200px")
    )
    dash._progress = w.IntProgress(value=0, min=0, max=1, description="re-run")
    dash._history = w.HTML()
    dash._status = w.HTML()
    dash._detail = w.Image(format="png", layout=w.Layout(max_width="100%"))
    dash._detail_note = w.HTML()
    dash._row_options: tuple = ()
    dash._graph_key: tuple | None = None
    dash._pngs: dict[tuple, bytes] = {}
    dash._on_batch = lambda done, total: _progress(dash, done, total)
    _wire(dash)
    panel = w.VBox(
        [
            row([dash._sort, dash._color]),
            dash._header,
            dash._rows,
            row([dash._fallback, dash._progress]),
            dash._history,
            dash._status,
        ]
    )
    dash._graph = _graph(dash) if with_graph else None
    top = split(dash._graph, panel, graph_width="45%")
    dash.widget = w.VBox([top, dash._detail_note, dash._detail])


def _progress(dash: Any, done: int, total: int) -> None:
    dash._progress.max = max(total, 1)
    dash._progress.value = done
    dash._progress.description = f"{done}/{total}"


def _wire(dash: Any) -> None:
    def on(control: Any, action: Any) -> None:
        def handler(change: dict[str, Any]) -> None:
            if not dash._syncing and change["new"] is not None:
                action(change["new"])

        control.observe(handler, "value")

    on(dash._sort, dash.sort)
    on(dash._color, dash.color_by)
    on(dash._rows, dash.select)
    on(dash._fallback, lambda _: dash.toggle_fallback())


def _graph(dash: Any) -> Any:
    from qviz.widgets.graph_widget import GraphWidget

    widget = GraphWidget()

    def on_select(change: dict[str, Any]) -> None:
        name = change["new"]
        if dash._syncing or not name or name.startswith("module/"):
            return
        dash.select(_row_of(dash, name))

    def on_module(change: dict[str, Any]) -> None:
        path = (change["new"] or {}).get("path")
        if path:
            dash._folding.toggle(path)
            dash._graph_key = None  # redraw with the new folding
            _refresh_graph(dash)

    widget.observe(on_select, "selected")
    widget.observe(on_module, "module_click")
    return widget


def _row_of(dash: Any, name: str) -> str:
    """The table row a graph click stands for: an edge's consumer (or producer); for a
    quantize/dequantize node, the operator whose output it quantizes, or else (a weight's) the
    operator it feeds; otherwise the name itself."""
    from qviz.numeric.compare import qdq_ops

    quantize, dequantize = qdq_ops()

    def _is_qdq(node: Any) -> bool:
        return node.op == "call_function" and node.target in quantize | dequantize

    rows = set(dash._nodes())
    if "->" in name:
        producer, _, consumer = (s.strip() for s in name.partition("->"))
        return consumer if consumer in rows else producer
    model = dash.quantized_model
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


#: The colour scale of SQNR columns, dB.
_SQNR_SCALE = (0.0, 50.0)


def _drawing(dash: Any) -> Any:
    from qviz.viz import graph

    st = dash.state
    model, report = dash.quantized_model, dash.report
    from qviz.widgets.dashboard import _HIGHER_IS_BETTER

    higher = st.color_by in _HIGHER_IS_BETTER
    # SQNR on an absolute scale (0 dB red .. 50 dB green): after a fix, healthy layers stay green
    span = _SQNR_SCALE if st.color_by.endswith("sqnr") else None
    kwargs = {"metric_column": st.color_by, "higher_is_better": higher, "metric_range": span}
    if getattr(dash, "_folding", None) is None:
        from qviz.widgets.folding import Folding

        dash._folding = Folding(model)  # big models open collapsed; a click expands a module
    return graph(model, metrics=report, collapse=dash._folding.collapse, **kwargs)


def refresh_view(dash: Any) -> None:
    """Show the dashboard's state: controls, table, graph, detail, history, status."""
    st = dash.state
    rows = dash.rows
    options = tuple((row_label(r), str(r["node"])) for r in rows)
    dash._syncing = True
    try:
        dash._sort.value, dash._color.value = st.sort_by, st.color_by
        if options != dash._row_options:
            dash._rows.options, dash._row_options = options, options
        dash._rows.value = st.selected
        dash._fallback.value = st.selected in st.fallback
        if dash._graph is not None:
            _refresh_graph(dash)
    finally:
        dash._syncing = False
    dash._fallback.disabled = st.selected is None
    dash._fallback.tooltip = "" if dash.quantizer else "fallback needs quantizer= (from_models)"
    _refresh_detail(dash)
    dash._history.value = history_html(dash.history)
    dash._status.value = _status(dash)


def _refresh_graph(dash: Any) -> None:
    from qviz.errors import QvizError

    key = (dash.state.fallback, dash.state.color_by)
    if key != dash._graph_key:  # redraw (Graphviz) only when the model or the colours change
        dash._graph_key = key
        try:
            dash._graph.show(_drawing(dash))
        except QvizError as exc:  # no dot program: the table still works
            dash._graph.show(f"<svg><text y='20'>{html.escape(str(exc))}</text></svg>")
    dash._graph.selected = dash.state.selected or ""


def _refresh_detail(dash: Any) -> None:
    from qviz.errors import QvizError

    st = dash.state
    key = (st.fallback, st.selected)
    if st.selected is None:
        dash._detail_note.value, dash._detail.value = "<i>select a layer</i>", b""
        return
    if key not in dash._pngs:
        try:
            dash._pngs[key] = figure_png(dash.detail(st.selected).plot())
        except QvizError as exc:
            note = f'<div style="color:#555">detail: {html.escape(str(exc))}</div>'
            dash._detail_note.value, dash._detail.value = note, b""
            return
    dash._detail_note.value = (
        f"<b>{html.escape(st.selected)}</b>: quantized against float outputs on the first batch"
    )
    dash._detail.value = dash._pngs[key]


def _status(dash: Any) -> str:
    if dash.error:
        return f'<div style="color:#b00020">⚠ {html.escape(dash.error)}</div>'
    return f'<div style="color:#555">{html.escape(dash.report.summary())}</div>'
