"""The ipywidgets of :class:`~qviz.widgets.explorer.CalibrationExplorer`: built once, refreshed
from its state after every change (the controls only call the explorer's Python methods).

Example:
    >>> label_of("activation_post_process_3", ["relu_2", "relu_2 -> max_pool2d"])
    'activation_post_process_3: relu_2 (+1)'
"""

from __future__ import annotations

import html
from typing import Any

from qviz.widgets.layout import scrolling

__all__ = ["build_view", "label_of", "refresh_view"]


def label_of(observer: str, members: list[str]) -> str:
    """Dropdown text: the observer and the first tensor it observes."""
    more = f" (+{len(members) - 1})" if len(members) > 1 else ""
    return f"{observer}: {members[0]}{more}" if members else observer


def build_view(explorer: Any, with_graph: bool) -> None:
    """Create the controls and wire each to the explorer's Python equivalent."""
    import ipywidgets as w

    from qviz.widgets.layout import row, split

    st = explorer.state
    explorer._observer = w.Dropdown(
        options=explorer._source.options(), value=st.observer, description="observer"
    )
    explorer._method = w.ToggleButtons(
        options=list(explorer._source.methods), value=st.method, description="method",
        style={"button_width": "92px"},
    )  # fmt: skip
    explorer._percentile = w.FloatSlider(
        value=st.percentile, min=99.0, max=100.0, step=0.001, readout_format=".3f",
        description="percentile", continuous_update=False,
        layout=w.Layout(width="380px", max_width="100%"),
    )  # fmt: skip
    explorer._bits = w.IntSlider(
        value=st.num_bits, min=2, max=16, description="num_bits", continuous_update=False
    )
    explorer._log = w.Checkbox(value=st.log, description="log counts")
    explorer._histogram = w.HTML()
    explorer._table = w.HTML()
    explorer._status = w.HTML()
    use = w.Button(description="Use this range", button_style="primary")
    everywhere = w.Button(description="Apply to all")
    use.on_click(lambda _: explorer.use_range())
    everywhere.on_click(lambda _: explorer.apply_to_all())
    _wire(explorer)
    panel = w.VBox(
        [
            explorer._observer,
            explorer._method,
            row([explorer._percentile, explorer._bits, explorer._log]),
            explorer._histogram,
            explorer._table,
            row([use, everywhere]),
            explorer._status,
        ]
    )
    drawn = explorer._source.graph_model() if with_graph else None
    explorer._graph = _graph(explorer, drawn) if drawn is not None else None
    explorer._graph_note = (
        "pass example_inputs=(x,) to CalibrationExplorer to draw the model's graph"
        if with_graph and drawn is None
        else ""
    )
    explorer.widget = split(explorer._graph, panel, graph_width="45%")


def _wire(explorer: Any) -> None:
    def on(control: Any, action: Any) -> None:
        def handler(change: dict[str, Any]) -> None:
            if not explorer._syncing:
                action(change["new"])

        control.observe(handler, "value")

    on(explorer._observer, explorer.select)
    on(explorer._method, lambda v: explorer.set(method=v))
    on(explorer._percentile, lambda v: explorer.set(percentile=v))
    on(explorer._bits, lambda v: explorer.set(num_bits=v))
    on(explorer._log, lambda v: explorer.set(log=v))


def _graph(explorer: Any, drawn: Any) -> Any:
    from qviz.viz import graph
    from qviz.widgets.folding import Folding
    from qviz.widgets.graph_widget import GraphWidget

    folding = Folding(drawn)  # big models open collapsed; a click expands a module
    widget = GraphWidget().show(graph(drawn, collapse=folding.collapse))

    def on_select(change: dict[str, Any]) -> None:
        name = change["new"]
        if name and not name.startswith("module/"):
            explorer.select(name)

    def on_module(change: dict[str, Any]) -> None:
        path = (change["new"] or {}).get("path")
        if path:
            folding.toggle(path)
            widget.show(graph(explorer._drawn, collapse=folding.collapse))

    widget.observe(on_select, "selected")
    widget.observe(on_module, "module_click")
    explorer._folding = folding
    explorer._drawn = drawn
    return widget


def redraw_graph(explorer: Any) -> None:
    """Draw the graph again after a choice that changes what it shows (a quant_nn model's
    markers carry the amax: the model is exported afresh)."""
    from qviz.viz import graph

    if explorer._graph is None or not explorer._source.redraw_after_choice:
        return
    explorer._drawn = explorer._source.graph_model()
    explorer._graph.show(graph(explorer._drawn, collapse=explorer._folding.collapse))


def refresh_view(explorer: Any) -> None:
    """Show the explorer's state: controls, histogram, table, status."""
    from qviz.viz.histogram_svg import rows_html
    from qviz.widgets.explorer import histogram_of

    st = explorer.state
    explorer._syncing = True
    try:
        explorer._observer.value = st.observer
        explorer._method.value = st.method
        explorer._percentile.value = st.percentile
        explorer._bits.value = st.num_bits
        explorer._log.value = st.log
    finally:
        explorer._syncing = False
    explorer._percentile.disabled = st.method != "percentile"
    explorer._histogram.value = histogram_of(explorer)
    chosen = explorer.choices.get(st.observer)
    explorer._table.value = scrolling(rows_html(explorer.rows, highlight=st.method, chosen=chosen))
    explorer._status.value = _status(explorer, chosen)


def _status(explorer: Any, chosen: str | None) -> str:
    if explorer.error:
        return f'<div style="color:#b00020">⚠ {html.escape(explorer.error)}</div>'
    note = explorer._data().note
    label = explorer._source.choice_label
    parts = [
        f"{label}: <b>{html.escape(chosen)}</b>"
        if chosen
        else html.escape(explorer._source.no_choice)
    ]
    if note:
        parts.append(html.escape(note))
    if explorer._graph_note:
        parts.append(html.escape(explorer._graph_note))
    return f'<div style="color:#555">{" · ".join(parts)}</div>'
