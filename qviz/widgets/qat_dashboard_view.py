"""The view of :class:`~qviz.widgets.qat_dashboard.QATDashboard`: :class:`QATDashboardView` owns
its ipywidgets, built once and refreshed from the monitor's latest records (pure functions turn
records into HTML).

Example:
    >>> from qviz.numeric.qat_monitor import QATRecord
    >>> r = QATRecord(step=3, name="activation_post_process_1", group=None, per_channel=False,
    ...               scale=0.02, scale_min=0.02, scale_max=0.02, zero_point=0.0, changed=True,
    ...               clipped=0.125, mean_abs_over_scale=30.0, loss=0.5, metric=None)
    >>> table = table_html([r], {"activation_post_process_1": 3})
    >>> "12.5%" in table, "<th>group</th>" in table   # no QuantPlan group: no column
    (True, False)
    >>> status_text(3, [r])
    'step 3 · loss 0.5'
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from qviz.errors import QvizError
from qviz.widgets.layout import figure_png, scrolling, split

_PREFIX = "activation_post_process_"
_HEAD = ("module", "group", "scale", "zero_point", "changes", "clipped (last step)", "|x| / scale")


def status_text(step: int, records: Sequence[Any]) -> str:
    """``step N · loss L · metric M`` (loss and metric from the step's records, when given)."""
    parts = [f"step {step}"]
    first = records[0] if records else None
    if first is not None and first.loss is not None:
        parts.append(f"loss {first.loss:.4g}")
    if first is not None and first.metric is not None:
        parts.append(f"metric {first.metric:.4g}")
    return " · ".join(parts)


def _scale(record: Any) -> str:
    if not record.per_channel:
        return f"{record.scale:.4g}"
    return f"{record.scale:.4g} <span style='color:#777'>[{record.scale_min:.3g}, " \
           f"{record.scale_max:.3g}]</span>"  # fmt: skip


def _bar(share: float) -> str:
    width = max(0.0, min(share, 1.0)) * 100
    color = "#c0392b" if share > 0.01 else "#e67e22" if share > 0.001 else "#27ae60"
    return (
        f'<span style="display:inline-block;width:80px;height:8px;background:#eee;'
        f'vertical-align:middle"><span style="display:block;width:{width:.1f}%;'
        f'min-width:{1 if share else 0}px;height:8px;background:{color}"></span></span> '
        f"{share:.1%}"
    )


def table_html(records: Sequence[Any], changes: Mapping[str, int]) -> str:
    """One row per module: its scale now (per channel: mean [min, max]), zero_point, how many
    steps changed its qparams so far, the share it clipped at the last step and mean |x|/scale.
    The QuantPlan group column only when the model has a plan.
    """
    grouped = any(r.group is not None for r in records)
    head = "".join(f"<th>{h}</th>" for h in _HEAD if grouped or h != "group")
    rows = []
    for r in records:
        name = html.escape(r.name.removeprefix(_PREFIX))
        group = f"<td>{'' if r.group is None else r.group}</td>" if grouped else ""
        rows.append(
            f"<tr><td title='{html.escape(r.name)}'>{name}</td>{group}"
            f"<td>{_scale(r)}</td><td>{r.zero_point:.3g}</td>"
            f"<td>{changes.get(r.name, 0)}</td><td>{_bar(r.clipped)}</td>"
            f"<td>{r.mean_abs_over_scale:.3g}</td></tr>"
        )
    return scrolling(
        '<table class="qviz-qat-table" style="border-collapse:collapse;font-size:12px">'
        f"<tr>{head}</tr>{''.join(rows)}</table>"
    )


class QATShown(Protocol):
    """What :class:`QATDashboardView` reads: the public surface of a QATDashboard."""

    monitor: Any
    figure: bool
    every: int
    min_interval_s: float
    renders: int
    last_render_s: float

    @property
    def records(self) -> tuple[Any, ...]: ...

    @property
    def render_share(self) -> float: ...


class QATDashboardView:
    """The status line, the redraw cost, the per-module table and the monitor's figure.

    Args:
        dash: the dashboard shown (its monitor, latest records and throttle settings).

    Attributes:
        widget: the ipywidgets box shown in Jupyter.
        status, cost, table, figure, figure_note: the outputs (``figure`` an Image of PNG).

    Example:
        >>> import torch, qviz
        >>> from qviz.numeric import QATMonitor
        >>> from qviz.widgets.qat_dashboard import QATDashboard
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).train(), (torch.randn(2, 4),))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_qat=True))
        >>> view = QATDashboard(QATMonitor(qviz.prepare_qat_pt2e(gm, q)), figure=False).view
        >>> "waiting for the first monitor.step()" in view.status.value
        True
    """

    def __init__(self, dash: QATShown) -> None:
        import ipywidgets as w

        self._dash = dash
        self.status = w.HTML()
        self.status.add_class("qviz-qat-status")
        self.cost = w.HTML()
        self.table = w.HTML()
        self.figure = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.figure.add_class("qviz-qat-figure")
        self.figure_note = w.HTML()
        panel = w.VBox([self.status, self.cost, self.table, self.figure_note, self.figure])
        self.widget = split(None, panel)

    def refresh(self) -> None:
        """Show the monitor's latest step: status, table and (unless ``figure=False``) the
        figure."""
        dash = self._dash
        monitor, records = dash.monitor, dash.records
        status = status_text(monitor.steps, records)
        if not monitor.steps:
            status += " · waiting for the first monitor.step()"
        self.status.value = f"<b style='font-size:14px'>{html.escape(status)}</b>"
        self.table.value = table_html(records, monitor.changes) if records else ""
        self.cost.value = self._cost_html()
        if dash.figure:
            self._refresh_figure()

    def _refresh_figure(self) -> None:
        monitor = self._dash.monitor
        if not monitor.steps:
            self.figure_note.value = "<i>the figure appears after the first step</i>"
            return
        try:
            fig = monitor.plot()
        except QvizError as exc:
            self.figure_note.value = f'<div style="color:#b00020">⚠ {html.escape(str(exc))}</div>'
            return
        self.figure.value = figure_png(fig, dpi=72)
        self.figure_note.value = ""

    def _cost_html(self) -> str:
        dash = self._dash
        throttle = f"redrawn every {dash.every} steps, at least {dash.min_interval_s:g} s apart"
        if dash.renders:
            throttle += (
                f"; last redraw {dash.last_render_s * 1000:.0f} ms, "
                f"{dash.render_share:.1%} of the time so far"
            )
        return f'<div style="color:#555;font-size:12px">{html.escape(throttle)}</div>'
