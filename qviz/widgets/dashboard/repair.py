"""The repair side of :class:`~qviz.widgets.dashboard.NumericDashboard` (``from_session``): apply a
remedy to the session and undo it, and the selected layer's diagnosis and before / after as HTML.

:func:`apply_remedy` and :func:`undo_remedy` change the session and return the :class:`Run` they
made; the dashboard records it in its own state (:meth:`NumericDashboard.apply
<qviz.widgets.dashboard.NumericDashboard.apply>`): which build of the session it shows
(``state.builds``, one id per applied remedy) and the layer still selected
(:func:`kept_selection`). The graph, the details and the table are keyed by the build, so an
undo shows the model before the remedy again without recomputing it.

Example:
    >>> from qviz.numeric.diagnose.rules import Cause, Prescription
    >>> from qviz.numeric.diagnose.diagnose import Finding
    >>> f = Finding(node="conv2d", op="aten.conv2d.default", cause=Cause.ROUNDING,
    ...     evidence=(("local_sqnr", 12.5),),
    ...             prescription=Prescription("learn the rounding",
    ...     "qviz.engine.repair.adaround"), sqnr=12.5,
    ...             figure="local_sqnr", severity=12.5)
    >>> "learn the rounding" in finding_html("conv2d", f, None)
    True
"""

from __future__ import annotations

import html
import math
from typing import Any

from qviz.errors import ConfigError
from qviz.numeric.diagnose.rules import CAUSE_COLOURS
from qviz.widgets.dashboard.table import Run

#: The dashboard's "colour by" choice that draws each poor layer's cause.
CAUSE_COLUMN = "cause"
#: What the remedy menu offers: the selected layer's prescription, then every remedy by name.
REMEDY_CHOICES = ("prescription", "per_channel", "fallback", "cross_layer_equalization",
                  "smooth_quant", "bias_correction", "adaround")  # fmt: skip
#: The remedies that act on named layers (the selected one unless ``nodes=`` is given).
_LAYER_REMEDIES = ("per_channel", "fallback")


def _session(dash: Any, what: str) -> Any:
    if dash.session is None:
        raise ConfigError(
            f"{what} needs a repair session: NumericDashboard.from_session("
            f"qviz.numeric.RepairSession(float_gm, quantizer, calibration_data, data))"
        )
    return dash.session


def kept_selection(report: Any, selected: str | None) -> str | None:
    """``selected`` if ``report`` (the new model's) still has that layer, else its worst layer."""
    nodes = [str(n) for n in report.df["node"]]
    if selected in nodes:
        return selected
    worst = report.worst(1)["node"].tolist() if nodes else []
    return str(worst[0]) if worst else None


def apply_remedy(dash: Any, remedy: Any, kwargs: dict[str, Any]) -> Run:
    """Apply ``remedy`` (see :meth:`NumericDashboard.apply`) to the session: the run it made."""
    session, node = _session(dash, "apply"), dash.state.selected
    if remedy is None or remedy == "prescription":
        remedy = dash.finding(node)
        if remedy is None:
            raise ConfigError(
                f"apply: {node!r} has no diagnosis (it is not below "
                f"{dash.diagnosis.threshold_db:g} dB); choose a remedy by name: "
                f"{list(REMEDY_CHOICES[1:])}"
            )
    elif remedy in _LAYER_REMEDIES and "nodes" not in kwargs:
        if node is None:
            raise ConfigError(f"apply({remedy!r}): select a layer or pass nodes=")
        kwargs = {**kwargs, "nodes": node}
    step = session.apply(remedy, **kwargs)
    return Run((), float(step.output_sqnr_after), step.metric_after, remedy=step.remedy)


def undo_remedy(dash: Any) -> Run:
    """Undo the session's last remedy: the run it made (the model before the remedy)."""
    session = _session(dash, "undo")
    if not session.history:
        raise ConfigError("undo: no remedy has been applied in this session")
    name = session.history[-1].remedy
    session.undo()
    report = session.report
    return Run((), float(report.output_sqnr), report.metric, remedy=f"undo {name}")


def _db(value: Any) -> str:
    v = float(value) if isinstance(value, int | float) else math.nan
    return "–" if math.isnan(v) else f"{v:.2f} dB"


def _fact(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def finding_html(node: str | None, finding: Any, step: Any) -> str:
    """The selected layer's diagnosis (cause, evidence, prescription) and, after a remedy, its
    local and cumulative SQNR before and after."""
    if node is None:
        return ""
    name = html.escape(node)
    if finding is None:
        parts = [f"<div><b>{name}</b>: no diagnosis (not below the threshold)</div>"]
    else:
        colour = CAUSE_COLOURS.get(finding.cause, "#eeeeee")
        evidence = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fact(v))}</td></tr>"
            for k, v in finding.evidence
            if not (isinstance(v, float) and math.isnan(v))  # a figure this layer has not
        )
        parts = [
            f'<div><b>{name}</b>: <span style="background:{colour};padding:1px 6px">'
            f"{html.escape(finding.cause.value)}</span> at {_db(finding.sqnr)} "
            f"({html.escape(finding.figure)})</div>",
            f'<table style="font-size:12px">{evidence}</table>',
            f"<div>prescription: {html.escape(finding.prescription.action)} "
            f"(<code>{html.escape(finding.prescription.function)}</code>)</div>",
        ]
        if finding.verdict:  # what measuring the remedies on this layer alone found
            parts.append(f"<div>measured: {html.escape(finding.verdict)}</div>")
    row = _step_row(step, node)
    if row is not None:
        local, cumulative = (f"{_db(row[a])} → {_db(row[b])}" for a, b in ((1, 2), (3, 4)))
        parts.append(
            f"<div>after <b>{html.escape(step.remedy)}</b>: local {local}, cumulative "
            f"{cumulative}</div>"
        )
    return '<div class="qviz-dash-diagnosis" style="font-size:12px">' + "".join(parts) + "</div>"


def _step_row(step: Any, node: str) -> tuple | None:
    if step is None:
        return None
    return next((r for r in step.layers if r[0] == node), None)
