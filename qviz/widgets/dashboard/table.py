"""The table of :class:`~qviz.widgets.dashboard.NumericDashboard`: its columns, which way each is
better, its sort order, the row of a layer kept in float, and its history's runs (:class:`Run`).

Plain data and pure functions, shared by the dashboard (its state) and its view (the controls).

Example:
    >>> rows = [{"node": "a", "local_sqnr": 40.0}, {"node": "b", "local_sqnr": 12.0},
    ...         float_row({"node": "c", "op": "linear", "local_sqnr": 3.0})]
    >>> [r["node"] for r in sorted_rows(rows, "local_sqnr", {"a": 0, "b": 1, "c": 2})]
    ['b', 'a', 'c']
    >>> choice("bogus", SORT_COLUMNS[:2], "sort by")
    Traceback (most recent call last):
    ...
    qviz.errors.ConfigError: sort by 'bogus': choose one of ['graph', 'local_sqnr']
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from qviz.errors import ConfigError

#: What the table sorts by: graph order, or a report column, worst first.
SORT_COLUMNS = (
    "graph", "local_sqnr", "cumulative_sqnr", "weight_sqnr", "cumulative_cosine", "cumulative_mse",
    "local_mse", "cumulative_max_abs_err",
    "clipped", "rmse_scale",
)  # fmt: skip
#: Columns where higher is better (sorted ascending to put the worst first).
HIGHER_IS_BETTER = frozenset({"local_sqnr", "cumulative_sqnr", "weight_sqnr", "cumulative_cosine"})
#: What the graph can be coloured by (green is good: high SQNR or cosine, low errors).
COLOR_COLUMNS = (
    "local_sqnr", "cumulative_sqnr", "weight_sqnr", "cumulative_cosine", "cumulative_mse",
    "local_mse", "cumulative_max_abs_err", "clipped", "rmse_scale",
)  # fmt: skip


#: The extra colouring a dashboard with a lowering comparison offers: each op's largest
#: difference from the reference on the lowered program's kernels, in steps of its grid.
LOWERING_COLUMN = "steps from reference (lowered)"


def choice(value: Any, options: tuple[str, ...], what: str) -> str:
    """``value`` if it is one of ``options``, else a ConfigError listing them."""
    if value not in options:
        raise ConfigError(f"{what} {value!r}: choose one of {list(options)}")
    return str(value)


def float_row(base: dict[str, Any]) -> dict[str, Any]:
    """The row of a layer kept in float: its names from ``base``, NaN figures, ``fallback``."""
    keep = ("node", "op", "module", "handle")
    row: dict[str, Any] = {k: (v if k in keep else math.nan) for k, v in base.items()}
    return dict(row, fallback=True)


def sorted_rows(rows: list[dict[str, Any]], by: str, order: dict[str, int]) -> list[dict[str, Any]]:
    """Graph order (``order``: node -> position), or worst first by a column; layers in float
    and NaN last."""
    position = {id(r): order.get(str(r["node"]), len(order) + i) for i, r in enumerate(rows)}
    rows = sorted(rows, key=lambda r: position[id(r)])
    if by == "graph":
        return rows
    sign = 1.0 if by in HIGHER_IS_BETTER else -1.0

    def key(r: dict[str, Any]) -> tuple[int, float]:
        v = r.get(by, math.nan)
        v = float(v) if isinstance(v, int | float) else math.nan
        return (1, 0.0) if math.isnan(v) else (0, sign * v)

    return sorted(rows, key=key)  # stable: graph order among equals


@dataclass(frozen=True)
class Run:
    """One comparison of the model: which layers were in float, and the model's figures;
    ``remedy`` names the repair step that made it (``"undo adaround"`` for an undo; ``""``
    outside a repair session)."""

    fallback: tuple[str, ...]
    output_sqnr: float
    metric: float | None
    remedy: str = ""

    def as_dict(self) -> dict[str, Any]:
        """``{"fallback": [...], "output_sqnr": dB, "metric": value or None, "remedy": ...}``."""
        return {"fallback": list(self.fallback), "output_sqnr": self.output_sqnr,
                "metric": self.metric, "remedy": self.remedy}  # fmt: skip
