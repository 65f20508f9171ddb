"""The trade-off a mixed-precision search chose from, drawn: cost against the target's figure.

Example:
    >>> from qviz.numeric.precision.result import Evaluation, FrontPoint, PrecisionResult
    >>> front = (FrontPoint(1.0, 28.0, ("w4a8",)), FrontPoint(2.0, 41.0, ("w8a8",)))
    >>> evaluations = (Evaluation(point=1, cost=2.0, output_sqnr=40.5, metric=None, meets=True),)
    >>> r = PrecisionResult(target="output_sqnr", limit=30.0, float_metric=None, cost_unit="KiB",
    ...     units=(), layers=(), reference=("w8a8",), screened=(), front=front,
    ...                     evaluations=evaluations, chosen=1)
    >>> fig = pareto_plot(r)
    >>> fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()
    ('cost (KiB)', 'output SQNR (dB)')
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from qviz.display.figure import new_figure

_PASS, _FAIL, _FRONT, _CHOSEN = "#1a9850", "#d73027", "#7f7f7f", "#fdb863"
#: The SVG id of front point ``i``'s element is ``POINT_ID + str(i)`` (what a widget clicks).
POINT_ID = "qviz-point-"


def pareto_plot(result: Any, *, selected: int | None = None, size: tuple = (7.0, 4.2)) -> Any:
    """The Pareto front of ``result`` (a :class:`~qviz.numeric.PrecisionResult`): each point's
    estimated figure against its cost (grey), the full evaluations measured (green: meets the
    target, red: does not), the target (dashed), the chosen point (a star) and ``selected`` (a
    front index, ringed). The axes fit the front, the target and the evaluations
    (:func:`plot_range`); a figure far below the target sits on the bottom edge as a triangle
    with its value written. Returns a matplotlib Figure; saved as SVG, front point ``i`` is the
    element with id ``qviz-point-<i>`` (an invisible marker over it, see :data:`POINT_ID`).

    Example:
        >>> from qviz.numeric.precision.result import FrontPoint, PrecisionResult
        >>> r = PrecisionResult(target="metric", limit=0.01, float_metric=0.98, cost_unit="GBOP",
        ...     units=(), layers=(), reference=(), screened=(),
        ...                     front=(FrontPoint(1.0, 0.95, ()), FrontPoint(3.0, 0.975,
        ...     ())), evaluations=(), chosen=None)
        >>> pareto_plot(r, selected=0).axes[0].get_ylabel()
        'metric'
    """
    fig = new_figure(figsize=size, layout="constrained")
    ax = fig.subplots()
    view = plot_range(result)
    costs = [p.cost for p in result.front]
    figures = [view.place(v) for v in _drawable([p.estimate for p in result.front])]
    ax.plot(
        costs, figures, "-o", color=_FRONT, markersize=3, linewidth=1, label="front (estimated)"
    )
    for i, (cost, figure) in enumerate(zip(costs, figures, strict=True)):  # one element each
        ax.plot([cost], [figure], "o", markersize=12, alpha=0.0, zorder=6, gid=f"{POINT_ID}{i}")
    _draw_measured(ax, result, view)
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
    _draw_off_scale(ax, result, view)
    ax.set_ylim(view.low, view.high)
    if costs and max(costs) > 8 * max(min(costs), 1e-12):
        _log_costs(ax)
    if costs:  # the front and every full evaluation, nothing else
        spent = costs + [e.cost for e in result.full_evaluations]
        ax.set_xlim(*_cost_range(spent, ax.get_xscale() == "log"))
    ax.set_xlabel(f"cost ({result.cost_unit})")
    ax.set_ylabel("metric" if result.target == "metric" else "output SQNR (dB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="lower right")
    return fig


def _draw_measured(ax: Any, result: Any, view: PlotRange) -> None:
    """The full evaluations (green: meets, red: misses) and the chosen one (a star); one
    below the plot's range sits on its bottom edge (see :func:`_draw_off_scale`)."""
    full = result.full_evaluations
    for meets, colour, marker, name in ((True, _PASS, "o", "meets"), (False, _FAIL, "X", "misses")):
        shown = [e for e in full if e.meets == meets]
        if not shown:
            continue
        ax.scatter(
            [e.cost for e in shown],
            [view.place(v) for v in _drawable([result.figure_of(e) for e in shown])],
            color=colour,
            marker=marker,
            s=45,
            zorder=3,
            label=f"measured: {name}",
        )
    chosen = [e for e in full if e.point == result.chosen and e.meets]
    if chosen:  # where it was measured
        at = view.place(_drawable([result.figure_of(chosen[-1])])[0])
        ax.scatter([chosen[-1].cost], [at], marker="*", s=260, color=_CHOSEN,
                   edgecolor="black", zorder=4, label="chosen")  # fmt: skip


@dataclass(frozen=True)
class PlotRange:
    """The figure axis of a Pareto plot: ``low`` to ``high`` drawn; a value below ``floor``
    is off the scale, drawn at ``edge`` (just inside the bottom) with its value written."""

    low: float
    high: float
    floor: float
    edge: float

    def off_scale(self, value: float) -> bool:
        """Whether ``value`` lies below what the plot shows."""
        return value < self.floor

    def place(self, value: float) -> float:
        """Where ``value`` is drawn: itself, or the bottom edge when off the scale."""
        return self.edge if self.off_scale(value) else value


def plot_range(result: Any) -> PlotRange:
    """The figure axis that shows the front and the target legibly: from the top of the
    front (or the target) down to three times as far below the target as the top is above
    it, or to the lowest figure when that is nearer. A far miss (a cheap assignment measured
    at 0.70 against a 0.99 target) would otherwise squash the front into a flat line.

    Example:
        >>> from qviz.numeric.precision.result import Evaluation, FrontPoint, PrecisionResult
        >>> front = (FrontPoint(18.0, 0.96, ()), FrontPoint(22.0, 0.995, ()))
        >>> r = PrecisionResult(target="metric", limit=0.01, float_metric=0.997, cost_unit="KiB",
        ...     units=(), layers=(), reference=(), screened=(), front=front,
        ...                     evaluations=(Evaluation(point=None, cost=17.0, output_sqnr=20.0,
        ...     metric=0.70, meets=False),), chosen=None)
        >>> view = plot_range(r)
        >>> view.low < 0.96 < 0.995 < view.high, view.off_scale(0.70), view.place(0.70) > 0.9
        (True, True, True)
    """
    target = _target_line(result)
    front = _drawable([p.estimate for p in result.front])
    measured = _drawable([result.figure_of(e) for e in result.full_evaluations])
    values = [v for v in (*front, *measured, target) if math.isfinite(v)]
    top = max(values, default=target)
    span = top - target
    if span <= 0:  # nothing above the target: show the whole front below it
        span = (target - min((v for v in front if math.isfinite(v)), default=target)) / 3
    span = max(span, 1e-3 * max(abs(target), 1.0))
    floor = max(min(values, default=target), target - 3 * span)
    pad = 0.06 * (top - floor)
    off = any(v < floor for v in measured + front)
    low = floor - (2.5 if off else 1) * pad
    return PlotRange(low, top + pad, floor, floor - 1.6 * pad)


def _draw_off_scale(ax: Any, result: Any, view: PlotRange) -> None:
    """Each value below the plot's range: a downward triangle on the bottom edge, its value
    written beside it."""
    points = [(p.cost, p.estimate, "estimate") for p in result.front]
    points += [(e.cost, result.figure_of(e), "measured") for e in result.full_evaluations]
    off = [(c, v, what) for c, v, what in points if view.off_scale(v)]
    for i, (cost, value, what) in enumerate(off):
        ax.scatter([cost], [view.edge], marker="v", s=70, facecolor="white", edgecolor=_FAIL,
                   linewidth=1.5, zorder=5, label="off scale (value written)" if i == 0 else None,
                   gid=f"qviz-off-scale-{i}")  # fmt: skip
        ax.annotate(f"{what} {value:.4g} ↓", (cost, view.edge), xytext=(8, 0),
                    textcoords="offset points", va="center", fontsize=8, color=_FAIL)  # fmt: skip


def _cost_range(costs: list[float], log: bool) -> tuple[float, float]:
    """From the cheapest front point to the most expensive, with a margin."""
    lo, hi = min(costs), max(costs)
    if log:
        return lo / 1.15, hi * 1.15
    pad = 0.05 * (hi - lo) or 0.05 * max(abs(hi), 1.0)
    return lo - pad, hi + pad


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
