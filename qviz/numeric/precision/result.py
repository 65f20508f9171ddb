"""What :func:`~qviz.numeric.search_precision` found, as records the views draw: each unit's
screened options, the Pareto front of the estimate, the full evaluations that confirmed it, and
the chosen assignment (as a quantizer, a table and a graph colouring).

Example:
    >>> FrontPoint(cost=1.5, estimate=30.0, choice=("w8a8", "float")).choice
    ('w8a8', 'float')
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from qviz.errors import ConfigError
from qviz.numeric.precision.units import Precision, Unit, assignment_overrides

#: Each precision's colour on the graph, by name; others take the last colour.
PRECISION_COLOURS = {
    "w2a8": "#f0625a",  # light enough for the black text of a graph box
    "w3a8": "#f99a57",
    "w4a8": "#fdc776",
    "w4a16": "#fee08b",
    "w8a8": "#a6d96a",
    "w8a16": "#66bd63",
    "float": "#d9d9d9",
}
_OTHER = "#74add1"


@dataclass(frozen=True)
class FrontPoint:
    """One assignment on the Pareto front: its cost, its estimated figure (the metric, or the
    output SQNR in dB) and the precision of each unit, in unit order."""

    cost: float
    estimate: float
    choice: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """A measurement of one assignment: ``point`` its front index (None: an assignment off the
    front), the output SQNR in dB against float, the metric (None without one), whether it
    meets the target, and ``screening``: True for the reference every option was screened
    against (measured on the screening data), False for a full evaluation on ``data``."""

    point: int | None
    cost: float
    output_sqnr: float
    metric: float | None
    meets: bool
    screening: bool = False


@dataclass(frozen=True)
class Screened:
    """One unit at one precision, every other unit at its reference precision: its cost and
    what the screening data measured."""

    unit: str
    precision: str
    cost: float
    output_sqnr: float
    metric: float | None


@dataclass(frozen=True, kw_only=True)
class PrecisionResult:
    """The search's records (see the module docstring).

    Attributes:
        target: ``"metric"`` (a drop of at most ``limit`` from the float model's metric) or
            ``"output_sqnr"`` (at least ``limit`` dB).
        limit: the target's figure; ``float_metric`` the float model's metric (or None).
        cost_unit: the cost's unit (``"KiB"``, ``"GBOP"``, or ``"cost"`` for a function).
        units, layers: the units searched, and ``(node, op, module, unit)`` of each layer.
        reference: the assignment every option was screened against.
        screened, front, evaluations: the screening, the front, the full evaluations.
        chosen: the front index of the cheapest assignment confirmed to meet the target (None:
            none was). ``model``: that assignment's converted model.

    Example:
        >>> r = PrecisionResult(target="output_sqnr", limit=30.0, float_metric=None,
        ...     cost_unit="KiB", units=(), layers=(), reference=(), screened=(), front=(),
        ...     evaluations=(), chosen=None)
        >>> r.met, r.summary()
        (False, 'no assignment met output SQNR >= 30 dB in 0 full evaluation(s)')
    """

    target: str
    limit: float
    float_metric: float | None
    cost_unit: str
    units: tuple[Unit, ...]
    layers: tuple[tuple[str, str, str, str], ...]
    reference: tuple[str, ...]
    screened: tuple[Screened, ...]
    front: tuple[FrontPoint, ...]
    evaluations: tuple[Evaluation, ...]
    chosen: int | None
    fingerprint: Any = field(default=None, repr=False, compare=False)
    float_fingerprint: Any = field(default=None, repr=False, compare=False)
    base: Any = field(default=None, repr=False, compare=False)
    model: Any = field(default=None, repr=False, compare=False)

    CATEGORY_COLUMNS = ("precision",)

    @property
    def met(self) -> bool:
        return self.chosen is not None

    def _point(self, point: int | None) -> FrontPoint:
        index = self.chosen if point is None else point
        if index is None:
            raise ConfigError(
                "no assignment met the target: pass point= (an index of result.front) to look "
                "at another one, or search again with more candidates or max_evaluations"
            )
        if not -len(self.front) <= index < len(self.front):
            raise ConfigError(f"point={index}: the front has {len(self.front)} points")
        return self.front[index]

    def assignment(self, point: int | None = None) -> dict[str, str]:
        """Each layer's precision at front point ``point`` (default: the chosen one).

        Example:
            >>> u = Unit("linear", ("linear",), (), (), 8)
            >>> r = PrecisionResult(target="output_sqnr", limit=30.0, float_metric=None,
            ...     cost_unit="KiB", units=(u,), layers=(), reference=("float",), screened=(),
            ...                     front=(FrontPoint(1.0, 35.0,
            ...     ("w8a8",)),), evaluations=(), chosen=0)
            >>> r.assignment()
            {'linear': 'w8a8'}
        """
        choice = self._point(point).choice
        return {layer: p for u, p in zip(self.units, choice, strict=True) for layer in u.layers}

    def overrides(self, point: int | None = None) -> dict[str, dict[str, Any]]:
        """The :class:`~qviz.engine.quantizers.override.OverrideQuantizer` edits of the base
        quantizer that give front point ``point`` (default: the chosen one), as plain data."""
        choice = [Precision.parse(p) for p in self._point(point).choice]
        return assignment_overrides(list(self.units), choice)

    def quantizer(self, point: int | None = None) -> Any:
        """A quantizer that reproduces front point ``point`` (default: the chosen one): the
        base quantizer with :meth:`overrides`; prepare, calibrate and convert with it."""
        from qviz.engine.quantizers.override import OverrideQuantizer

        return OverrideQuantizer(self.base, self.overrides(point))

    def at(self, point: int) -> PrecisionResult:
        """This result with front point ``point`` as the one drawn and exported (the model
        kept is the chosen one's)."""
        self._point(point)
        return replace(self, chosen=point % len(self.front))

    def graph_categories(self, column: str = "precision") -> tuple[dict, str, dict]:
        """What ``qviz.viz.graph(model, metrics=result, metric_column="precision")`` draws: each
        layer's precision at the chosen point, and each precision's colour."""
        if column not in self.CATEGORY_COLUMNS:
            raise ConfigError(f"graph_categories({column!r}): give one of {self.CATEGORY_COLUMNS}")
        names = {s.precision for s in self.screened} | {p for f in self.front for p in f.choice}
        order = sorted(names, key=_precision_order)
        return self.assignment(), column, {p: PRECISION_COLOURS.get(p, _OTHER) for p in order}

    def table(self, point: int | None = None) -> Any:
        """A DataFrame, one row per layer: ``node``, ``op``, ``module``, ``unit``, ``precision``
        at ``point`` (default: the chosen one), its unit's ``cost`` there, and one column per
        screened precision with the figure the unit alone at it measured."""
        import pandas as pd

        choice = dict(zip((u.name for u in self.units), self._point(point).choice, strict=True))
        costs = {(s.unit, s.precision): s.cost for s in self.screened}
        figure = {(s.unit, s.precision): self._figure(s) for s in self.screened}
        names = sorted({s.precision for s in self.screened}, key=_precision_order)
        rows = []
        for node, op, module, unit in self.layers:
            row = {"node": node, "op": op, "module": module, "unit": unit,
                   "precision": choice[unit], "cost": costs.get((unit, choice[unit]))}  # fmt: skip
            row |= {f"screened {p}": figure.get((unit, p)) for p in names}
            rows.append(row)
        return pd.DataFrame(rows)

    def _figure(self, measured: Any) -> float:
        value = measured.metric if self.target == "metric" else measured.output_sqnr
        return float("nan") if value is None else float(value)

    def figure_of(self, evaluation: Evaluation) -> float:
        """The figure the target is on (the metric, or output SQNR in dB) of an evaluation."""
        return self._figure(evaluation)

    @property
    def full_evaluations(self) -> tuple[Evaluation, ...]:
        """The evaluations of whole assignments on the evaluation data (not the screening)."""
        return tuple(e for e in self.evaluations if not e.screening)

    def target_text(self) -> str:
        if self.target == "metric":
            return f"metric drop <= {self.limit:g}"
        return f"output SQNR >= {self.limit:g} dB"

    def summary(self) -> str:
        full = len(self.full_evaluations)
        if not self.met:
            return f"no assignment met {self.target_text()} in {full} full evaluation(s)"
        point = self.front[int(self.chosen or 0)]
        counts: dict[str, int] = {}
        for p in point.choice:
            counts[p] = counts.get(p, 0) + 1
        mix = ", ".join(f"{n} {p}" for p, n in sorted(counts.items(), key=lambda i: i[0]))
        best = [e for e in self.full_evaluations if e.point == self.chosen]
        figure = self._figure_text(best[-1]) if best else f"estimated {point.estimate:#.4g}"
        return (
            f"{mix}: cost {point.cost:.4g} {self.cost_unit}, {figure} "
            f"({self.target_text()}), {full} full evaluation(s)"
        )

    def _figure_text(self, e: Evaluation) -> str:
        if self.target == "metric":
            return f"metric {e.metric:#.4g} (float {self.float_metric:#.4g})"
        return f"output SQNR {e.output_sqnr:.2f} dB"

    def __repr__(self) -> str:
        return f"PrecisionResult({self.summary()})"

    def plot(self, selected: int | None = None) -> Any:
        """The Pareto plot (:func:`qviz.numeric.precision.plot.pareto_plot`): a Figure."""
        from qviz.numeric.precision.plot import pareto_plot

        return pareto_plot(self, selected=selected)

    def _repr_html_(self) -> str:
        from qviz.numeric.precision.view import result_html

        return result_html(self)


def _precision_order(name: str) -> tuple[int, int]:
    """Cheapest first: (weight bits, activation bits), float at 32 each."""
    return Precision.parse(name).bits
