"""The Pareto plot's axes show the front and the target legibly: one far miss does not squash
the front into a line; it sits on the bottom edge with its value written."""

from __future__ import annotations

import io

from qviz.numeric.precision.plot import pareto_plot, plot_range
from qviz.numeric.precision.result import Evaluation, FrontPoint, PrecisionResult

# notebook 11's shape: a front from 18 to 292 KiB, flat past ~25 KiB, and the first guess (every
# layer at w4a8, off the front) measured at 0.70 accuracy against a 0.987 target
COSTS = [18, 18.5, 19, 19.5, 20, 21, 22, 24, 30, 40, 57, 75, 103, 130, 184, 292]
ESTIMATES = [0.96, 0.966, 0.967, 0.98, 0.988, 0.992, 0.995] + [0.997] * 9


def _result(evaluations=None, estimates=ESTIMATES, target="metric", limit=0.01, top=0.997):
    front = tuple(FrontPoint(c, e, ()) for c, e in zip(COSTS, estimates, strict=True))
    if evaluations is None:
        evaluations = (
            Evaluation(point=None, cost=17.5, output_sqnr=20.0, metric=0.70, meets=False),
            Evaluation(point=4, cost=20.0, output_sqnr=28.0, metric=0.985, meets=False),
            Evaluation(point=6, cost=22.0, output_sqnr=30.0, metric=0.994, meets=True),
        )
    return PrecisionResult(
        target=target,
        limit=limit,
        float_metric=top,
        cost_unit="KiB",
        units=(),
        layers=(),
        reference=(),
        screened=(),
        front=front,
        evaluations=evaluations,
        chosen=6,
    )


def test_the_front_spreads_over_most_of_the_height():
    result = _result()
    ax = pareto_plot(result).axes[0]
    low, high = ax.get_ylim()
    assert low > 0.9  # the 0.70 miss does not set the range
    spread = (max(ESTIMATES) - min(ESTIMATES)) / (high - low)
    assert spread > 0.75, (low, high)
    assert low < 0.987 < high  # the target line is inside


def test_a_far_miss_sits_on_the_bottom_edge_with_its_value_written():
    result = _result()
    view = plot_range(result)
    assert view.off_scale(0.70) and not view.off_scale(min(ESTIMATES))
    ax = pareto_plot(result).axes[0]
    low, _ = ax.get_ylim()
    assert low < view.edge < min(ESTIMATES)
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["measured 0.7 ↓"]
    edge = [c for c in ax.collections if c.get_gid() == "qviz-off-scale-0"]
    assert len(edge) == 1 and edge[0].get_offsets()[0][1] == view.edge


def test_the_cost_axis_ends_at_the_front_and_the_evaluations():
    ax = pareto_plot(_result()).axes[0]
    lo, hi = ax.get_xlim()
    assert 15 < lo < 17.5 and 292 < hi < 350
    assert ax.get_xscale() == "log"  # 18 to 292 KiB: the cheap end gets room


def test_without_far_values_everything_is_on_the_scale():
    result = _result(
        evaluations=(Evaluation(point=6, cost=22.0, output_sqnr=30.0, metric=0.994, meets=True),)
    )
    ax = pareto_plot(result).axes[0]
    assert len(ax.texts) == 0 and min(ESTIMATES) > ax.get_ylim()[0]


def test_nothing_meeting_the_target_shows_the_whole_front():
    low_front = [e - 0.05 for e in ESTIMATES]
    result = _result(evaluations=(), estimates=low_front)
    view = plot_range(result)
    assert not any(view.off_scale(e) for e in low_front)
    assert view.low < min(low_front) and view.high > 0.987


def test_sqnr_plots_keep_their_clickable_ids():
    estimates = [20.0 + 2 * i for i in range(len(COSTS))]
    result = _result(
        evaluations=(Evaluation(point=6, cost=22.0, output_sqnr=5.0, metric=None, meets=False),),
        estimates=estimates,
        target="output_sqnr",
        limit=40.0,
        top=None,
    )
    fig = pareto_plot(result, selected=3)
    assert [t.get_text() for t in fig.axes[0].texts] == ["measured 5 ↓"]
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    svg = buffer.getvalue()
    assert all(f'id="qviz-point-{i}"' in svg for i in range(len(COSTS)))
    assert 'id="qviz-off-scale-0"' in svg
