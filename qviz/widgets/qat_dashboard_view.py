"""The ipywidgets of :class:`~qviz.widgets.qat_dashboard.QATDashboard`: built once, refreshed
from the monitor's latest records (pure functions turn records into HTML).

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
from typing import Any

from qviz.widgets.layout import scrolling

__all__ = ["build_view", "refresh_view", "status_text", "table_html"]

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


def build_view(dash: Any) -> None:
    """Create the status line, the table and the figure (an Image)."""
    import ipywidgets as w

    from qviz.widgets.layout import split

    dash._status = w.HTML()
    dash._status.add_class("qviz-qat-status")
    dash._cost = w.HTML()
    dash._table = w.HTML()
    dash._figure = w.Image(format="png", layout=w.Layout(max_width="100%"))
    dash._figure.add_class("qviz-qat-figure")
    dash._figure_note = w.HTML()
    panel = w.VBox([dash._status, dash._cost, dash._table, dash._figure_note, dash._figure])
    dash.widget = split(None, panel)


def refresh_view(dash: Any) -> None:
    """Show the monitor's latest step: status, table and (unless ``figure=False``) the figure."""
    monitor, records = dash.monitor, dash.records
    status = status_text(monitor.steps, records)
    if not monitor.steps:
        status += " · waiting for the first monitor.step()"
    dash._status.value = f"<b style='font-size:14px'>{html.escape(status)}</b>"
    dash._table.value = table_html(records, monitor.changes) if records else ""
    dash._cost.value = _cost_html(dash)
    if dash.figure:
        _refresh_figure(dash)


def _refresh_figure(dash: Any) -> None:
    from qviz.errors import QvizError
    from qviz.widgets.layout import figure_png

    if not dash.monitor.steps:
        dash._figure_note.value = "<i>the figure appears after the first step</i>"
        return
    try:
        fig = dash.monitor.plot()
    except QvizError as exc:
        dash._figure_note.value = f'<div style="color:#b00020">⚠ {html.escape(str(exc))}</div>'
        return
    dash._figure.value = figure_png(fig, dpi=72)
    dash._figure_note.value = ""


def _cost_html(dash: Any) -> str:
    throttle = f"redrawn every {dash.every} steps, at least {dash.min_interval_s:g} s apart"
    if dash.renders:
        throttle += (
            f"; last redraw {dash.last_render_s * 1000:.0f} ms, "
            f"{dash.render_share:.1%} of the time so far"
        )
    return f'<div style="color:#555;font-size:12px">{html.escape(throttle)}</div>'
