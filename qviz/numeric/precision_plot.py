"""The trade-off a mixed-precision search chose from, drawn: cost against the target's figure.

Example:
    >>> from qviz.numeric.precision_result import Evaluation, FrontPoint, PrecisionResult
    >>> front = (FrontPoint(1.0, 28.0, ("w4a8",)), FrontPoint(2.0, 41.0, ("w8a8",)))
    >>> evaluations = (Evaluation(1, 2.0, 40.5, None, True),)
    >>> r = PrecisionResult("output_sqnr", 30.0, None, "KiB", (), (), ("w8a8",), (), front,
    ...                     evaluations, 1)
    >>> fig = pareto_plot(r)
    >>> fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()
    ('cost (KiB)', 'output SQNR (dB)')
"""

from __future__ import annotations

import math
from typing import Any

from qviz.numeric.figure import new_figure

_PASS, _FAIL, _FRONT, _CHOSEN = "#1a9850", "#d73027", "#7f7f7f", "#fdb863"
#: The SVG id of front point ``i``'s element is ``POINT_ID + str(i)`` (what a widget clicks).
POINT_ID = "qviz-point-"


def pareto_plot(result: Any, *, selected: int | None = None, size: tuple = (7.0, 4.2)) -> Any:
    """The Pareto front of ``result`` (a :class:`~qviz.numeric.PrecisionResult`): each point's
    estimated figure against its cost (grey), the full evaluations measured (green: meets the
    target, red: does not), the target (dashed), the chosen point (a star) and ``selected`` (a
    front index, ringed). Returns a matplotlib Figure; saved as SVG, front point ``i`` is the
    element with id ``qviz-point-<i>`` (an invisible marker over it, see :data:`POINT_ID`).

    Example:
        >>> from qviz.numeric.precision_result import FrontPoint, PrecisionResult
        >>> r = PrecisionResult("metric", 0.01, 0.98, "GBOP", (), (), (), (),
        ...                     (FrontPoint(1.0, 0.95, ()), FrontPoint(3.0, 0.975, ())), (), None)
        >>> pareto_plot(r, selected=0).axes[0].get_ylabel()
        'metric'
    """
    fig = new_figure(figsize=size, layout="constrained")
    ax = fig.subplots()
    costs = [p.cost for p in result.front]
    figures = _drawable([p.estimate for p in result.front])
    ax.plot(
        costs, figures, "-o", color=_FRONT, markersize=3, linewidth=1, label="front (estimated)"
    )
    for i, (cost, figure) in enumerate(zip(costs, figures, strict=True)):  # one element each
        ax.plot([cost], [figure], "o", markersize=12, alpha=0.0, zorder=6, gid=f"{POINT_ID}{i}")
    _draw_measured(ax, result)
    if selected is not None and result.front:
        ax.scatter(
            [costs[selected]],
            [figures[selected]],
            s=220,
            facecolor="none",
            edgecolor="black",
            linewidth=1.5,
            zorder=5,
            label=f"point {selected}",
        )
    ax.axhline(
        _target_line(result), color="black", linestyle="--", linewidth=1, label=result.target_text()
    )
    if costs and max(costs) > 20 * max(min(costs), 1e-12):
        _log_costs(ax)
    ax.set_xlabel(f"cost ({result.cost_unit})")
    ax.set_ylabel("metric" if result.target == "metric" else "output SQNR (dB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="lower right")
    return fig


def _draw_measured(ax: Any, result: Any) -> None:
    """The full evaluations (green: meets, red: misses) and the chosen one (a star)."""
    full = result.full_evaluations
    for meets, colour, marker, name in ((True, _PASS, "o", "meets"), (False, _FAIL, "X", "misses")):
        shown = [e for e in full if e.meets == meets]
        if not shown:
            continue
        ax.scatter(
            [e.cost for e in shown],
            _drawable([result.figure_of(e) for e in shown]),
            color=colour,
            marker=marker,
            s=45,
            zorder=3,
            label=f"measured: {name}",
        )
    chosen = [e for e in full if e.point == result.chosen and e.meets]
    if chosen:  # where it was measured
        ax.scatter([chosen[-1].cost], _drawable([result.figure_of(chosen[-1])]), marker="*",
                   s=260, color=_CHOSEN, edgecolor="black", zorder=4, label="chosen")  # fmt: skip


def _log_costs(ax: Any) -> None:
    """Costs on a log axis, labelled 0.002, 0.005, 0.01 ... (minor labels included)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)


def _target_line(result: Any) -> float:
    if result.target == "metric":
        return float(result.float_metric or 0.0) - result.limit
    return result.limit


def _drawable(values: list[float]) -> list[float]:
    """Infinite SQNR (no error at all) drawn at the top of the finite ones."""
    finite = [v for v in values if math.isfinite(v)]
    top = max(finite, default=0.0) + 3.0
    return [v if math.isfinite(v) else top for v in values]
