"""The view of :class:`~qviz.widgets.qat.QATDashboard`: :class:`QATDashboardView` owns
its ipywidgets, built once and refreshed from the monitor's latest records (pure functions turn
records into HTML). Its two toggle buttons call the dashboard's ``freeze_observers`` and
``freeze_bn_stats``. Every text is at least 12 px, the figure's at least 10 px.

Example:
    >>> from dataclasses import replace
    >>> from qviz.numeric.qat.monitor import QATRecord
    >>> r = QATRecord(step=3, name="activation_post_process_1", group=None, per_channel=False,
    ...               scale=0.02, scale_min=0.02, scale_max=0.02, zero_point=0.0, changed=True,
    ...               clipped=0.125, mean_abs_over_scale=30.0, loss=0.5, metric=None)
    >>> r = replace(r, label="relu output")
    >>> table = table_html([r], {"activation_post_process_1": 3})
    >>> "12.5%" in table, "relu output" in table, "<th>group</th>" in table  # no plan: no group
    (True, True, False)
    >>> status_text(3, [r])
    'step 3 · loss 0.5'
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from qviz.errors import QvizError
from qviz.widgets.kit.layout import figure_png, row, scrolling, split

_PREFIX = "activation_post_process_"
#: the figure's resolution in the dashboard: its 10 pt fonts are 11 px
FIGURE_DPI = 80
_HEAD = ("quantizes", "group", "scale", "zero_point", "changes", "clipped (last step)",
         "|x| / scale")  # fmt: skip


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
        name = html.escape(r.label or r.name.removeprefix(_PREFIX))
        group = f"<td>{'' if r.group is None else r.group}</td>" if grouped else ""
        rows.append(
            f"<tr><td title='module {html.escape(r.name)}'>{name}</td>{group}"
            f"<td>{_scale(r)}</td><td>{r.zero_point:.3g}</td>"
            f"<td>{changes.get(r.name, 0)}</td><td>{_bar(r.clipped)}</td>"
            f"<td>{r.mean_abs_over_scale:.3g}</td></tr>"
        )
    return scrolling(
        '<table class="qviz-qat-table" style="border-collapse:collapse;font-size:13px">'
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
    observers_frozen: bool
    bn_frozen: bool
    note: str

    def freeze_observers(self, frozen: bool = True) -> Any: ...

    def freeze_bn_stats(self, frozen: bool = True) -> Any: ...

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
        observers_button, bn_button: the freeze toggles (``value`` True: frozen).

    Example:
        >>> import torch, qviz
        >>> from qviz.numeric import QATMonitor
        >>> from qviz.widgets.qat import QATDashboard
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
        self._syncing = False
        self.observers_button = w.ToggleButton(
            description="freeze observers", icon="snowflake-o",
            tooltip="stop every fake-quantize observer: the scales stop moving from the next step",
            layout=w.Layout(width="auto"),
        )  # fmt: skip
        self.observers_button.add_class("qviz-qat-freeze-observers")
        self.bn_button = w.ToggleButton(
            description="freeze BatchNorm statistics", icon="snowflake-o",
            tooltip="qviz.freeze_bn_stats: BatchNorm uses and keeps its running statistics",
            layout=w.Layout(width="auto"),
        )  # fmt: skip
        self.bn_button.add_class("qviz-qat-freeze-bn")
        self.observers_button.observe(self._on_observers, "value")
        self.bn_button.observe(self._on_bn, "value")
        self.status = w.HTML()
        self.status.add_class("qviz-qat-status")
        self.cost = w.HTML()
        self.table = w.HTML()
        self.figure = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.figure.add_class("qviz-qat-figure")
        self.figure_note = w.HTML()
        controls = row([self.observers_button, self.bn_button])
        panel = w.VBox(
            [controls, self.status, self.cost, self.table, self.figure_note, self.figure]
        )
        self.widget = split(None, panel)

    def refresh(self) -> None:
        """Show the monitor's latest step: status, table and (unless ``figure=False``) the
        figure."""
        dash = self._dash
        monitor, records = dash.monitor, dash.records
        status = status_text(monitor.steps, records)
        if not monitor.steps:
            status += " · waiting for the first monitor.step()"
        self.status.value = f"<b style='font-size:14px'>{html.escape(status)}</b>" + _events(
            monitor.events, dash.note
        )
        self._sync_buttons()
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
        self.figure.value = figure_png(fig, dpi=FIGURE_DPI)
        self.figure_note.value = ""

    def _sync_buttons(self) -> None:
        """The toggles show the dashboard's state (without calling back into it)."""
        self._syncing = True
        try:
            self.observers_button.value = bool(self._dash.observers_frozen)
            self.bn_button.value = bool(self._dash.bn_frozen)
        finally:
            self._syncing = False

    def _on_observers(self, change: Mapping[str, Any]) -> None:
        if not self._syncing:
            self._dash.freeze_observers(bool(change["new"]))

    def _on_bn(self, change: Mapping[str, Any]) -> None:
        if self._syncing:
            return
        try:
            self._dash.freeze_bn_stats(bool(change["new"]))
        except QvizError as exc:  # e.g. no BatchNorm left to freeze: say so, undo the toggle
            self._dash.note = str(exc)
            self.refresh()

    def _cost_html(self) -> str:
        dash = self._dash
        throttle = f"redrawn every {dash.every} steps, at least {dash.min_interval_s:g} s apart"
        if dash.renders:
            throttle += (
                f"; last redraw {dash.last_render_s * 1000:.0f} ms, "
                f"{dash.render_share:.1%} of the time so far"
            )
        return f'<div style="color:#555;font-size:12px">{html.escape(throttle)}</div>'


def _events(events: Sequence[Any], note: str) -> str:
    """The marks so far (``observers frozen after step 40``) and the last control's note.

    Example:
        >>> from qviz.numeric.qat.monitor import QATEvent
        >>> _events([QATEvent(40, "observers frozen")], "")[-36:]
        'observers frozen after step 40</div>'
    """
    texts = [f"{e.text} after step {e.step}" for e in events]
    if note and note not in texts:
        texts.append(note)
    if not texts:
        return ""
    return (
        '<div class="qviz-qat-events" style="font-size:13px;color:#b03a2e">'
        f"{html.escape(' · '.join(texts))}</div>"
    )
