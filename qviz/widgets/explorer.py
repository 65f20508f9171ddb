"""``CalibrationExplorer``: which range would each calibration method give this observer?

Pick an observer (dropdown, or click its marker in the graph) and see its histogram with each
method's range (:func:`qviz.viz.histograms.histogram_data`, drawn by the fast SVG renderer);
switch method, move the percentile slider, try another bit width, and watch the lines, the
clipped share and the SQNR table follow. "Use this range" makes the observer use the method
(:func:`qviz.engine.choices.choose_range`: recorded in the plan as the user's choice, used by
``convert_pt2e``); "Apply to all" does it for every HistogramObserver.

The state is plain data (:class:`ExplorerState`); every control has a Python equivalent
(:meth:`CalibrationExplorer.select`, :meth:`~CalibrationExplorer.set`,
:meth:`~CalibrationExplorer.use_range`, :meth:`~CalibrationExplorer.apply_to_all`). An edit the
engine refuses leaves the previous state and shows the message in :attr:`error`.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), (torch.randn(64, 4),))
    >>> config = get_symmetric_quantization_config(switchable=True)
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    >>> prepared = qviz.calibrate(prepared, [torch.randn(64, 4)], progress=False)
    >>> ex = CalibrationExplorer(prepared, graph=False)
    >>> ex.set(method="entropy").state.method, [r["method"] for r in ex.rows][:2]
    ('entropy', ['max', 'percentile'])
    >>> ex.use_range().choice
    'entropy'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from qviz.engine.choices import choose_range
from qviz.engine.observers import HistogramObserver
from qviz.errors import ConfigError, QvizError
from qviz.viz.histogram_svg import histogram_svg
from qviz.viz.histograms import HistogramData, histogram_data

__all__ = ["CalibrationExplorer", "ExplorerState"]

METHODS = ("max", "percentile", "entropy", "mse", "l2")
_CALIBRATOR_METHODS = ("max", "percentile", "entropy", "mse")


@dataclass(frozen=True)
class ExplorerState:
    """What the explorer shows: an observer, the method being considered, its settings."""

    observer: str
    method: str
    percentile: float
    num_bits: int
    log: bool = True


def _bits(obs: HistogramObserver) -> int:
    return int(obs.quant_max - obs.quant_min).bit_length()


class CalibrationExplorer:
    """Explore and choose calibration ranges of a calibrated model's HistogramObservers.

    Args:
        calibrated_model: a model from :func:`qviz.prepare_pt2e` after :func:`qviz.calibrate`.
            Observers made with ``switchable=True`` (e.g.
            ``get_symmetric_quantization_config(switchable=True)``) can show and use every
            method; others show only their own.
        graph: show the model's graph too (click an observer marker to pick it).

    Attributes:
        state: the current :class:`ExplorerState`.
        error: the last refused action's message, or None.
        widget: the ipywidgets box (the explorer also renders itself in Jupyter).

    Raises:
        ConfigError: the model has no plan or no HistogramObserver.
    """

    def __init__(self, calibrated_model: Any, *, graph: bool = True) -> None:
        plan = getattr(calibrated_model, "plan", None)
        if plan is None or not hasattr(plan, "groups"):
            raise ConfigError(
                f"CalibrationExplorer needs a calibrated model from qviz.prepare_pt2e (with "
                f".plan), got {type(calibrated_model).__name__}"
            )
        self.model = calibrated_model
        self.observers = [
            g.observer
            for g in plan.groups
            if isinstance(getattr(calibrated_model, g.observer, None), HistogramObserver)
        ]
        if not self.observers:
            raise ConfigError("CalibrationExplorer: this model has no HistogramObserver")
        self.error: str | None = None
        self._cache: dict[tuple, HistogramData] = {}
        self.state = self._state_for(self.observers[0])
        self._syncing = False
        self._build(graph)
        self._refresh()

    # -- Python equivalents of the controls ----------------------------------------------------
    def select(self, observer_or_tensor: str) -> CalibrationExplorer:
        """Show an observer, by module name (``"activation_post_process_3"``) or by a tensor it
        observes."""
        return self._guard(lambda: self._select(observer_or_tensor))

    def set(
        self,
        *,
        method: str | None = None,
        percentile: float | None = None,
        num_bits: int | None = None,
        log: bool | None = None,
    ) -> CalibrationExplorer:
        """Change what is considered: method, percentile, bit width, log count axis."""
        return self._guard(lambda: self._set(method, percentile, num_bits, log))

    def use_range(self) -> Any:
        """Make the shown observer use the considered method; returns its updated GroupRecord."""
        records = self._choose([self.state.observer])
        return records[0] if records else None

    def apply_to_all(self) -> list[Any]:
        """Make every HistogramObserver use the considered method; returns their records."""
        return self._choose(None) or []

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The table: one dict per method (range, scale, zero_point, clipped, SQNR)."""
        return [dict(r) for r in self._data().rows]

    @property
    def svg(self) -> str:
        """The histogram drawing currently shown."""
        return self._histogram.value

    @property
    def choices(self) -> dict[str, str]:
        """``{observer: method}`` for every range the user chose (read from the plan)."""
        return {g.observer: g.choice for g in self.model.plan.groups if g.choice}

    @property
    def overrides(self) -> dict[str, dict[str, Any]]:
        """The choices as OverrideQuantizer overrides, so that a quantizer reproduces them.

        Every tensor of a chosen group that has its own spec gets the method (and percentile),
        so the groups stay as they are: ``OverrideQuantizer(base, explorer.overrides)`` (or
        merged with an AnnotationEditor's overrides) prepares observers that pick these ranges.
        """
        plan = self.model.plan
        out: dict[str, dict[str, Any]] = {}
        for group in plan.groups:
            if not group.choice:
                continue
            method, _, pct = group.choice.partition(" ")
            change: dict[str, Any] = {"observer": "HistogramObserver", "method": method}
            if pct:
                change["percentile"] = float(pct)
            for record in plan.tensors:
                if record.group == group.group and record.spec.kind != "shared":
                    out[str(record.tensor)] = dict(change)
        return out

    # -- state changes -------------------------------------------------------------------------
    def _guard(self, action: Any) -> CalibrationExplorer:
        before = self.state
        try:
            action()
            self.error = None
        except QvizError as exc:
            self.state, self.error = before, str(exc)
        self._refresh()
        return self

    def _state_for(self, observer: str) -> ExplorerState:
        obs = self.model.get_submodule(observer)
        return ExplorerState(observer, obs.method, float(obs.percentile), _bits(obs))

    def _select(self, name: str) -> None:
        if name not in self.observers:
            name = self._observer_of(name)
        self.state = dataclasses.replace(
            self._state_for(name), log=self.state.log, percentile=self.state.percentile
        )

    def _observer_of(self, tensor: str) -> str:
        producer, _, consumer = (s.strip() for s in tensor.partition("->"))
        try:
            group = self.model.plan.group_of(producer, consumer or None)
        except ConfigError:
            raise ConfigError(
                f"{tensor!r} is neither a HistogramObserver ({', '.join(self.observers)}) nor a "
                f"tensor the plan observes"
            ) from None
        if group.observer not in self.observers:
            raise ConfigError(
                f"{tensor!r} is observed by {group.observer}, a "
                f"{type(self.model.get_submodule(group.observer)).__name__}: only "
                f"HistogramObservers keep a histogram to explore"
            )
        return group.observer

    def _set(self, method: Any, percentile: Any, num_bits: Any, log: Any) -> None:
        changes: dict[str, Any] = {}
        if method is not None:
            if method not in METHODS:
                raise ConfigError(f"method {method!r} is not one of {list(METHODS)}")
            changes["method"] = method
        if percentile is not None:
            if isinstance(percentile, bool) or not 0 < float(percentile) <= 100:
                raise ConfigError(f"percentile must be in (0, 100], got {percentile!r}")
            changes["percentile"] = float(percentile)
        if num_bits is not None:
            if (
                isinstance(num_bits, bool)
                or not isinstance(num_bits, int)
                or not 2 <= num_bits <= 16
            ):
                raise ConfigError(f"num_bits must be an int in 2..16, got {num_bits!r}")
            changes["num_bits"] = num_bits
        if log is not None:
            changes["log"] = bool(log)
        self.state = dataclasses.replace(self.state, **changes)
        self._data()  # compute now, so that a refusal keeps the previous state

    def _choose(self, observers: list[str] | None) -> list[Any] | None:
        st = self.state
        try:
            obs = self.model.get_submodule(st.observer)
            if st.num_bits != _bits(obs):
                raise ConfigError(
                    f"{st.observer} quantizes to {_bits(obs)} bits (its spec's range); "
                    f"num_bits={st.num_bits} only explores: set num_bits back to {_bits(obs)}, "
                    f"or change the range with the AnnotationEditor"
                )
            pct = st.percentile if st.method == "percentile" else None
            records = choose_range(self.model, st.method, observers=observers, percentile=pct)
            self.error = None
        except QvizError as exc:
            self.error, records = str(exc), None
        self._cache.clear()  # the observers' own rows changed
        self._refresh()
        return records

    # -- data ----------------------------------------------------------------------------------
    def _data(self) -> HistogramData:
        st = self.state
        obs = self.model.get_submodule(st.observer)
        if obs.calibrator is None or not obs.calibrator.num_batches:
            return self._cached((st.observer, "own"), lambda: histogram_data(obs))
        source = obs if st.num_bits == _bits(obs) else obs.calibrator.with_num_bits(st.num_bits)
        parts = []
        if st.num_bits == _bits(obs) and (obs.switchable or obs.method == "l2"):
            key = (st.observer, st.num_bits, "l2", None)
            parts.append(self._cached(key, lambda: histogram_data(obs, methods=("l2",))))
        for m in _CALIBRATOR_METHODS:
            pct = st.percentile if m == "percentile" else None
            key = (st.observer, st.num_bits, m, pct)
            parts.append(
                self._cached(
                    key, lambda m=m, pct=pct: histogram_data(source, methods=(m,), percentile=pct)
                )
            )
        return _merge(parts)

    def _cached(self, key: tuple, compute: Any) -> HistogramData:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    # -- view ----------------------------------------------------------------------------------
    def _build(self, with_graph: bool) -> None:
        from qviz.widgets.explorer_view import build_view

        build_view(self, with_graph)

    def _refresh(self) -> None:
        from qviz.widgets.explorer_view import refresh_view

        refresh_view(self)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        st = self.state
        return (
            f"CalibrationExplorer({st.observer}: method={st.method}, percentile={st.percentile:g}, "
            f"num_bits={st.num_bits}, choices={self.choices})"
        )


def _merge(parts: list[HistogramData]) -> HistogramData:
    """One HistogramData from several single-method ones over the same histogram."""
    rows: dict[str, dict[str, Any]] = {}
    lines: dict[str, tuple[str, float, str]] = {}
    for part in parts:
        for row in part.rows:
            rows.setdefault(row["method"], row)
        for line in part.lines:
            lines.setdefault(line[0], line)
    methods = [*(m for m in METHODS if m in rows), *(m for m in rows if m not in METHODS)]
    return dataclasses.replace(
        parts[0], rows=tuple(rows[m] for m in methods), lines=tuple(lines.values())
    )


def histogram_of(explorer: CalibrationExplorer) -> str:
    """The explorer's current histogram as SVG text."""
    st = explorer.state
    return histogram_svg(explorer._data(), log=st.log, highlight=st.method)
