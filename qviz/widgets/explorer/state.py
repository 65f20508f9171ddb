"""``CalibrationExplorer``: which range would each calibration method give this observer?

Pick an observer (dropdown, or click its marker in the graph) and see its histogram with each
method's range (:func:`qviz.viz.ranges.histograms.histogram_data`, drawn by the fast SVG renderer);
switch method, move the percentile slider, try another bit width, and watch the lines, the
clipped share and the SQNR table follow. "Use this range" makes the observer use the method
(:func:`qviz.engine.pt2e.range_choice.choose_range`: recorded in the plan as the user's choice,
used by ``convert_pt2e``); "Apply to all" does it for every HistogramObserver.

A calibrated quant_nn model (its TensorQuantizers) is explored the same way: each enabled,
calibrated quantizer is listed by module path; a HistogramCalibrator shows its histogram, every
calibrator method and the amax it holds, a MaxCalibrator (the default for weights) its max.
"Use this range" loads the method's amax into the quantizer
(:meth:`~qviz.engine.tensor.tensor_quantizer.TensorQuantizer.load_calib_amax`), and :attr:`choices`
reads back which method picked each amax. Give ``example_inputs`` to draw its graph
(:mod:`qviz.engine.tensor.records` markers, clickable).

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

    A quant_nn model:

    >>> from qviz.engine.tensor.quant_modules import quantize_model
    >>> q = quantize_model(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    >>> _ = qviz.calibrate_quantizers(q, [torch.randn(64, 4)], method="entropy", progress=False)
    >>> ex = CalibrationExplorer(q, graph=False)
    >>> ex.observers, ex.state.method
    (['0._input_quantizer', '0._weight_quantizer'], 'entropy')
    >>> ex.set(method="mse").use_range().method
    'mse'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from qviz.errors import ConfigError, QvizError
from qviz.viz.ranges.histograms import HistogramData
from qviz.widgets.explorer.sources import source_for
from qviz.widgets.explorer.view import ExplorerView
from qviz.widgets.kit.view_owner import ViewOwner


@dataclass(frozen=True)
class ExplorerState:
    """What the explorer shows: an observer (or a TensorQuantizer's module path), the method
    being considered, its settings."""

    observer: str
    method: str
    percentile: float
    num_bits: int
    log: bool = True


class CalibrationExplorer(ViewOwner):
    """Explore and choose calibration ranges of a calibrated model's HistogramObservers, or of
    a calibrated quant_nn model's TensorQuantizers.

    Args:
        calibrated_model: a model from :func:`qviz.prepare_pt2e` after :func:`qviz.calibrate`.
            Observers made with ``switchable=True`` (e.g.
            ``get_symmetric_quantization_config(switchable=True)``) can show and use every
            method; others show only their own. Or a model of quant_nn layers after
            :func:`qviz.calibrate_quantizers` (its enabled quantizers that saw data).
        graph: show the model's graph too (click an observer marker to pick it).
        example_inputs: for a quant_nn model, inputs to export it with for the graph (without
            them no graph is drawn, and the status line says so).

    Attributes:
        state: the current :class:`ExplorerState`.
        error: the last refused action's message, or None.
        source: what is explored (:class:`~qviz.widgets.explorer.sources.PlanSource` or
            :class:`~qviz.widgets.explorer.sources.QuantizerSource`).
        view: its :class:`~qviz.widgets.explorer.view.ExplorerView` (the ipywidgets).
        widget: the ipywidgets box (the explorer also renders itself in Jupyter).

    Raises:
        ConfigError: the model has no plan or no HistogramObserver, or (quant_nn) no enabled
            TensorQuantizer with calibration statistics.
    """

    def __init__(
        self,
        calibrated_model: Any,
        *,
        graph: bool = True,
        example_inputs: tuple[Any, ...] | None = None,
    ) -> None:
        self.source = source_for(calibrated_model, example_inputs)
        self.model = calibrated_model
        self.observers = list(self.source.names)
        self.error: str | None = None
        self._cache: dict[tuple, HistogramData] = {}
        self.state = self._state_for(self.observers[0])
        self.view = ExplorerView(self, with_graph=graph)
        self.view.refresh()

    # -- Python equivalents of the controls ----------------------------------------------------
    def select(self, observer_or_tensor: str) -> CalibrationExplorer:
        """Show an observer, by module name (``"activation_post_process_3"``) or by a tensor it
        observes; for a quant_nn model, a TensorQuantizer by module path or graph marker."""
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
        """Make the shown observer use the considered method; returns its updated GroupRecord
        (a TensorQuantizer: its :class:`~qviz.engine.tensor.records.QuantizerRecord`)."""
        records = self._choose([self.state.observer])
        return records[0] if records else None

    def apply_to_all(self) -> list[Any]:
        """Make every HistogramObserver (every TensorQuantizer whose calibrator can compute the
        method) use the considered method; returns their records."""
        return self._choose(None) or []

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The table: one dict per method (range, scale, zero_point, clipped, SQNR)."""
        return [dict(r) for r in self.data.rows]

    @property
    def data(self) -> HistogramData:
        """The histogram and every method's range for the current state."""
        return self.source.data(self.state, self._cached)

    @property
    def svg(self) -> str:
        """The histogram drawing currently shown."""
        return self.view.histogram.value

    @property
    def choices(self) -> dict[str, str]:
        """``{observer: method}`` for every range the user chose (read from the plan); for a
        quant_nn model, the method that computed each quantizer's loaded amax."""
        return self.source.choices()

    @property
    def overrides(self) -> dict[str, dict[str, Any]]:
        """The choices as OverrideQuantizer overrides, so that a quantizer reproduces them.

        Every tensor of a chosen group that has its own spec gets the method (and percentile),
        so the groups stay as they are: ``OverrideQuantizer(base, explorer.overrides)`` (or
        merged with an AnnotationEditor's overrides) prepares observers that pick these ranges.

        Raises:
            ConfigError: a quant_nn model (its choices live in its quantizers' amax).
        """
        return self.source.overrides()

    # -- state changes -------------------------------------------------------------------------
    def _state_for(self, observer: str) -> ExplorerState:
        return ExplorerState(observer, *self.source.start(observer))

    def _select(self, name: str) -> None:
        self.state = dataclasses.replace(
            self._state_for(self.source.resolve(name)),
            log=self.state.log,
            percentile=self.state.percentile,
        )

    def _set(self, method: Any, percentile: Any, num_bits: Any, log: Any) -> None:
        changes: dict[str, Any] = {}
        if method is not None:
            if method not in self.source.methods:
                raise ConfigError(f"method {method!r} is not one of {list(self.source.methods)}")
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
        _ = self.data  # compute now, so that a refusal keeps the previous state

    def _choose(self, observers: list[str] | None) -> list[Any] | None:
        try:
            records = self.source.choose(self.state, observers)
            self.error = None
        except QvizError as exc:
            self.error, records = str(exc), None
        self._cache.clear()  # the observers' own rows changed
        if records:
            self.view.redraw()
        self.view.refresh()
        return records

    # -- data ----------------------------------------------------------------------------------
    def _cached(self, key: tuple, compute: Any) -> HistogramData:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def __repr__(self) -> str:
        st = self.state
        return (
            f"CalibrationExplorer({st.observer}: method={st.method}, percentile={st.percentile:g}, "
            f"num_bits={st.num_bits}, choices={self.choices})"
        )
