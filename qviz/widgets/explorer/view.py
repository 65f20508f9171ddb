"""The view of :class:`~qviz.widgets.explorer.CalibrationExplorer`: :class:`ExplorerView` owns
its ipywidgets, built once and refreshed from the explorer's state after every change (the
controls only call the explorer's Python methods).

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> from qviz.widgets.explorer import CalibrationExplorer
    >>> gm = qviz.export(torch.nn.Linear(4, 4).eval(), (torch.randn(64, 4),))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(switchable=True))
    >>> prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), [torch.randn(64, 4)], progress=False)
    >>> view = CalibrationExplorer(prepared, graph=False).view
    >>> view.method.value = "mse"   # a click on a method button
    >>> "<svg" in view.histogram.value, "font-weight:bold" in view.table.value
    (True, True)
"""

from __future__ import annotations

import html
import math
from typing import Any, Protocol

from qviz.viz.ranges.histogram_svg import FONT_SIZE, histogram_svg, rows_html
from qviz.widgets.kit.graph_panel import FoldedGraph
from qviz.widgets.kit.layout import MIN_TEXT_PX, row, scrolling, split

#: The histogram's drawn size; it grows with the panel up to 1.25 times that, and shrinks only
#: as far as its smallest text stays at MIN_TEXT_PX (a narrower panel scrolls it sideways).
_HISTOGRAM_WIDTH = 560
_HISTOGRAM_SIZE = {"width": _HISTOGRAM_WIDTH, "height": 320, "min_text_px": MIN_TEXT_PX}
#: The panel's width beside the graph: the histogram at its narrowest, and the panel's margins
#: (the graph pane widens to show its whole graph only as far as the panel keeps this).
_PANEL_WIDTH = math.ceil(_HISTOGRAM_WIDTH * MIN_TEXT_PX / FONT_SIZE) + 24


class Explorer(Protocol):
    """What :class:`ExplorerView` reads and calls: the public surface of a CalibrationExplorer."""

    state: Any
    error: str | None
    source: Any

    @property
    def data(self) -> Any: ...

    @property
    def rows(self) -> list[dict[str, Any]]: ...

    @property
    def choices(self) -> dict[str, str]: ...

    def select(self, observer_or_tensor: str) -> Any: ...

    def set(self, **changes: Any) -> Any: ...

    def use_range(self) -> Any: ...

    def apply_to_all(self) -> Any: ...


class ExplorerView:
    """The explorer's controls, histogram, table, status and (optionally) the model's graph.

    Args:
        explorer: the explorer shown (its public methods are what the controls call).
        with_graph: draw the model's graph beside the panel (a click on a marker picks it).

    Attributes:
        widget: the ipywidgets box shown in Jupyter.
        graph: the :class:`~qviz.widgets.kit.graph_widget.GraphWidget` (None without a graph, or
            for a quant_nn model given no example inputs).
        observer, method, percentile, bits, log, histogram, table, status: the controls and
            outputs.
    """

    def __init__(self, explorer: Explorer, *, with_graph: bool) -> None:
        import ipywidgets as w

        self._explorer = explorer
        self._syncing = False
        source, st = explorer.source, explorer.state
        self.observer = w.Dropdown(
            options=source.options(), value=st.observer, description="observer"
        )
        self.method = w.ToggleButtons(
            options=list(source.methods), value=st.method, description="method",
            style={"button_width": "92px"},
        )  # fmt: skip
        self.percentile = w.FloatSlider(
            value=st.percentile, min=99.0, max=100.0, step=0.001, readout_format=".3f",
            description="percentile", continuous_update=False,
            layout=w.Layout(width="380px", max_width="100%"),
        )  # fmt: skip
        self.bits = w.IntSlider(
            value=st.num_bits, min=2, max=16, description="num_bits", continuous_update=False
        )
        self.log = w.Checkbox(value=st.log, description="log counts")
        self.histogram, self.table, self.status = w.HTML(), w.HTML(), w.HTML()
        use = w.Button(description="Use this range", button_style="primary")
        everywhere = w.Button(description="Apply to all")
        use.on_click(lambda _: explorer.use_range())
        everywhere.on_click(lambda _: explorer.apply_to_all())
        self._wire()
        panel = w.VBox(
            [
                self.observer,
                self.method,
                row([self.percentile, self.bits, self.log]),
                self.histogram,
                self.table,
                row([use, everywhere]),
                self.status,
            ]
        )
        drawn = source.graph_model() if with_graph else None
        self._pane = FoldedGraph(on_select=explorer.select) if drawn is not None else None
        self.graph = self._pane.draw(drawn).widget if self._pane is not None else None
        self._graph_note = (
            "pass example_inputs=(x,) to CalibrationExplorer to draw the model's graph"
            if with_graph and drawn is None
            else ""
        )
        self.widget = split(self.graph, panel, graph_width="40%", panel_width=_PANEL_WIDTH)

    def refresh(self) -> None:
        """Show the explorer's state: controls, histogram, table, status."""
        ex = self._explorer
        st = ex.state
        self._syncing = True
        try:
            self.observer.value = st.observer
            self.method.value = st.method
            self.percentile.value = st.percentile
            self.bits.value = st.num_bits
            self.log.value = st.log
        finally:
            self._syncing = False
        self.percentile.disabled = st.method != "percentile"
        self.histogram.value = scrolling(  # fluid, but never so narrow its text drops under 10 px
            histogram_svg(ex.data, log=st.log, highlight=st.method, **_HISTOGRAM_SIZE)
        )
        chosen = ex.choices.get(st.observer)
        self.table.value = scrolling(rows_html(ex.rows, highlight=st.method, chosen=chosen))
        self.status.value = self._status(chosen)

    def redraw(self) -> None:
        """Draw the graph again after a choice that changes what it shows (a quant_nn model's
        markers carry the amax: the model is exported afresh)."""
        source = self._explorer.source
        if self._pane is not None and source.redraw_after_choice:
            self._pane.draw(source.graph_model())

    def _wire(self) -> None:
        ex = self._explorer

        def on(control: Any, action: Any) -> None:
            def handler(change: dict[str, Any]) -> None:
                if not self._syncing:
                    action(change["new"])

            control.observe(handler, "value")

        on(self.observer, ex.select)
        on(self.method, lambda v: ex.set(method=v))
        on(self.percentile, lambda v: ex.set(percentile=v))
        on(self.bits, lambda v: ex.set(num_bits=v))
        on(self.log, lambda v: ex.set(log=v))

    def _status(self, chosen: str | None) -> str:
        ex = self._explorer
        if ex.error:
            return f'<div style="color:#b00020">⚠ {html.escape(ex.error)}</div>'
        note = ex.data.note
        label = ex.source.choice_label
        parts = [
            f"{label}: <b>{html.escape(chosen)}</b>" if chosen else html.escape(ex.source.no_choice)
        ]
        if note:
            parts.append(html.escape(note))
        if self._graph_note:
            parts.append(html.escape(self._graph_note))
        return f'<div style="color:#555">{" · ".join(parts)}</div>'
