"""The arithmetic of a mixed-precision search, pure: the Pareto front of an additive estimate,
and which front point to confirm next.

**The estimate.** Each unit's options were measured one at a time, every other unit at its
reference precision: option ``o`` of unit ``u`` costs ``cost[u][o]`` and adds ``penalty[u][o]``
to the reference's penalty (output noise power over signal power, or the metric's drop). An
assignment's estimate is the reference's penalty plus the sum of its options' (quantization
noise of independent layers adds; so do small drops).

**The front.** :func:`pareto_front` keeps, unit by unit, the (cost, penalty) sums no other
sum beats in both (a multiple-choice knapsack solved for every budget at once); worked example
with two units of options ``[(1, 4), (2, 1)]`` and ``[(1, 2), (3, 0)]``: the sums are (2, 6),
(4, 4), (3, 3), (5, 1); (4, 4) is beaten by (3, 3), so the front is (2, 6), (3, 3), (5, 1).

**Confirming.** The front is ordered by cost, cheapest first, its estimated penalty falling.
:func:`next_probe` picks the next point to evaluate in full, between the most expensive point
seen to fail and the cheapest seen to pass: the cheapest whose estimate, scaled by what the
nearest evaluation measured against its own estimate, meets the target.

Example:
    >>> [(c, p) for c, p, _ in pareto_front([[(1, 4), (2, 1)], [(1, 2), (3, 0)]])]
    [(2, 6), (3, 3), (5, 1)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Option = tuple[float, float]
Point = tuple[float, float, tuple[int, ...]]


def pareto_front(options: Sequence[Sequence[Option]], max_points: int = 2000) -> list[Point]:
    """The non-dominated ``(cost, penalty, choice)`` sums, cheapest first (``choice[u]``: the
    index of unit ``u``'s option). Past ``max_points``, points evenly spread along the front
    are kept (the cheapest and the best always).

    Example:
        >>> pareto_front([[(0, 5), (4, 0)]])
        [(0, 5, (0,)), (4, 0, (1,))]
    """
    front: list[Point] = [(0, 0, ())]
    for unit in options:
        sums = [(c + oc, p + op, (*ch, i)) for c, p, ch in front for i, (oc, op) in
                enumerate(unit)]  # fmt: skip
        front = _thin(_non_dominated(sums), max_points)
    return front


def _non_dominated(points: list[Point]) -> list[Point]:
    """Cheapest first; a point is kept only when its penalty is below every cheaper one's."""
    kept: list[Point] = []
    for point in sorted(points, key=lambda p: (p[0], p[1])):
        if not kept or point[1] < kept[-1][1]:
            kept.append(point)
    return kept


def _thin(front: list[Point], max_points: int) -> list[Point]:
    if len(front) <= max_points:
        return front
    step = (len(front) - 1) / (max_points - 1)
    return [front[round(i * step)] for i in range(max_points)]


def next_probe(
    estimates: Sequence[float],
    target: float,
    passed: Mapping[int, float],
    failed: Mapping[int, float],
) -> int | None:
    """The next front point to evaluate in full, or None when the search is done.

    Args:
        estimates: each front point's estimated penalty, cheapest point first.
        target: the largest penalty that meets the target.
        passed: measured penalty of each evaluated point that met the target.
        failed: the same for points that did not.

    Returns:
        The cheapest point strictly between the most expensive failure and the cheapest pass
        whose estimate, scaled by the nearest evaluated point's measured-over-estimated ratio,
        meets the target; None when there is no point between them, or no such point (then the
        cheapest pass is the answer).

    Example:
        >>> next_probe([9, 6, 4, 2, 1], 3, {}, {})  # no evaluation yet: the estimate alone
        3
        >>> next_probe([9, 6, 4, 2, 1], 3, {3: 1.0}, {})  # measured half its estimate: 6 / 2
        1
        >>> next_probe([9, 6, 4, 2, 1], 3, {3: 1.0}, {1: 4.0})  # 1 failed: 4 * 4 / 6 meets
        2
        >>> next_probe([9, 6, 4, 2, 1], 3, {3: 1.0}, {2: 3.5}) is None  # neighbours: done
        True
    """
    lo = max(failed, default=-1)
    hi = min((i for i in passed if i > lo), default=len(estimates))
    if hi - lo <= 1:
        return None
    seen = {**passed, **failed}
    for i in range(lo + 1, hi):
        if _scaled(estimates, seen, i) <= target:
            return i
    return None if hi < len(estimates) else hi - 1


def _scaled(estimates: Sequence[float], seen: Mapping[int, float], i: int) -> float:
    """Point ``i``'s estimate times the nearest evaluated point's measured / estimated ratio."""
    if not seen:
        return estimates[i]
    near = min(seen, key=lambda j: (abs(j - i), j))
    if estimates[near] <= 0 or seen[near] <= 0:
        return estimates[i]
    return estimates[i] * seen[near] / estimates[near]
