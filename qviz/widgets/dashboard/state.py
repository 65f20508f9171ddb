"""``NumericDashboard``: find the layer, fix it, check, in one place.

The numeric suite's per-layer table (:func:`qviz.numeric.compare`), sortable by local or
cumulative SQNR, beside the quantized graph coloured as a heatmap by the chosen metric. Picking a
layer (a row, or a node in the graph) shows its detail (:class:`LayerDetail`): its float against
its quantized outputs on one sample batch, as a scatter and an error histogram. "Fallback" keeps
the layer in float (:func:`qviz.numeric.fallback`): the model is prepared, calibrated and
converted again from the float graph, compared again over the data (with a progress bar), and
the run is added to the history, so the model's output SQNR and metric before and after stand
side by side.

The state is plain data (:class:`DashboardState`); every control has a Python equivalent
(:meth:`NumericDashboard.select`, :meth:`~NumericDashboard.sort`,
:meth:`~NumericDashboard.color_by`, :meth:`~NumericDashboard.toggle_fallback`, and the query
:meth:`~NumericDashboard.detail`). An action qviz refuses leaves the previous state and shows the
message in :attr:`~NumericDashboard.error`.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> torch.manual_seed(0) and None
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    >>> data = [torch.randn(16, 4) for _ in range(2)]
    >>> gm = qviz.export(model, (data[0],), dynamic_batch=True)
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> quantized = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), data,
    ...                                              progress=False))
    >>> d = NumericDashboard.from_models(gm, quantized, data, quantizer=q, progress=False,
    ...                                  graph=False)
    >>> [r["node"] for r in d.sort("graph").rows]
    ['linear', 'relu', 'linear_1']
    >>> d.toggle_fallback("linear_1").state.fallback
    ('linear_1',)
    >>> [run["fallback"] for run in d.history]
    [[], ['linear_1']]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule

from qviz.engine.graph.fingerprint import check_fingerprint, check_lineage
from qviz.engine.graph.inputs import bind_batch
from qviz.engine.graph.stage import Stage, check_stage
from qviz.errors import ConfigError, closest_names
from qviz.numeric.compare.compare import float_graph_of
from qviz.numeric.compare.detail import LayerDetail, layer_detail
from qviz.numeric.variants.variants import quantize_variant, variant_batches
from qviz.widgets.dashboard.repair import CAUSE_COLUMN, apply_remedy, kept_selection, undo_remedy
from qviz.widgets.dashboard.table import (
    COLOR_COLUMNS,
    LOWERING_COLUMN,
    SORT_COLUMNS,
    Run,
    choice,
    float_row,
    sorted_rows,
)
from qviz.widgets.dashboard.view import DashboardView
from qviz.widgets.kit.view_owner import ViewOwner


@dataclass(frozen=True, kw_only=True)
class DashboardState:
    """What the dashboard shows: sort order, chosen layer, layers in float, heatmap, runs;
    ``builds`` identifies the repair session's current model (one id per applied remedy)."""

    sort_by: str = "local_sqnr"
    selected: str | None = None
    fallback: tuple[str, ...] = ()
    color_by: str = "local_sqnr"
    history: tuple[Run, ...] = ()
    builds: tuple[int, ...] = ()


class NumericDashboard(ViewOwner):
    """The numeric report as a table beside a heatmap graph, layer details and fallbacks.

    Prefer :meth:`from_models`, which runs the comparison and keeps what details and fallbacks
    need. ``NumericDashboard(report)`` alone shows the table; with ``quantized_model`` the graph
    too; with ``float_model`` and ``data`` layer details; with ``quantizer`` as well, fallbacks.

    Args:
        report: a :class:`~qviz.numeric.NumericReport` from :func:`qviz.numeric.compare`.
        quantized_model: the model the report measured (from :func:`qviz.convert_pt2e`).
        float_model: the float graph module it was prepared from (or the float nn.Module).
        data: the evaluation batches the report was computed on (the first is the detail sample).
        quantizer: the quantizer ``quantized_model`` was made with: enables fallbacks.
        calibration_data: batches a fallback variant is calibrated on (default: ``data``); give
            the ones ``quantized_model`` was calibrated on, so runs differ only by the fallback.
        metric: ``metric(float_out, quant_out, target) -> float`` for each re-run, as in compare.
        graph: show the graph (needs ``quantized_model`` and graphviz's ``dot``).
        lowered: ``qviz.lower(quantized_model, ...)``: the graph marks each op's kernel
            (integer, or float and why) for the model as given.
        lowering: ``qviz.numeric.compare_lowered(quantized_model, lowered, data)``: adds
            "colour by: steps from reference (lowered)", the lowering error beside the
            quantization error.
        session: a :class:`~qviz.numeric.RepairSession` (prefer :meth:`from_session`): the
            dashboard shows the session's current model, each poor layer's diagnosis (cause,
            evidence, prescription), "colour by: cause", and applies remedies
            (:meth:`apply`, :meth:`undo`), each measured before and after.

    Attributes:
        state: the current :class:`DashboardState`.
        report: the report of the current run (with the current fallbacks).
        quantized_model: the model of the current run.
        error: the last refused action's message, or None.
        view: its :class:`~qviz.widgets.dashboard.view.DashboardView` (the ipywidgets).
        widget: the ipywidgets box (the dashboard also renders itself in Jupyter).

    Raises:
        ConfigError: ``report`` is not a NumericReport, a model at the wrong stage
            (``quantized_model`` converted, ``float_model`` float), ``report`` measured another
            model than ``quantized_model``, or ``data`` is not batches.

    Example:
        >>> from qviz.numeric import NumericReport
        >>> rows = [{"node": "a", "local_sqnr": 40.0, "cumulative_sqnr": 39.0},
        ...         {"node": "b", "local_sqnr": 12.0, "cumulative_sqnr": 11.0}]
        >>> r = NumericReport.from_table(rows, output_sqnr=11.0)
        >>> d = NumericDashboard(r)
        >>> d.state.selected, [row["node"] for row in d.rows]   # worst local SQNR first
        ('b', ['b', 'a'])
        >>> d.toggle_fallback("b").error.split(":")[0], d.state.fallback
        ('fallback needs the quantizer', ())
    """

    def __init__(
        self,
        report: Any,
        *,
        quantized_model: GraphModule | None = None,
        float_model: Any = None,
        data: Any = None,
        quantizer: Any = None,
        calibration_data: Any = None,
        metric: Callable[[Any, Any, Any], float] | None = None,
        graph: bool = True,
        lowered: Any = None,
        lowering: Any = None,
        session: Any = None,
    ) -> None:
        df = getattr(report, "df", None)
        if df is None or "node" not in getattr(df, "columns", ()):
            raise ConfigError(
                f"NumericDashboard needs a NumericReport from qviz.numeric.compare.compare, got "
                f"{type(report).__name__}; or use NumericDashboard.from_models(float, quantized, "
                f"data)"
            )
        if quantized_model is not None:  # the stages details and fallbacks run, checked first
            check_stage(quantized_model, Stage.CONVERTED, where="NumericDashboard",
                        arg="quantized_model")  # fmt: skip
            check_fingerprint(report, quantized_model, "NumericDashboard")
        if float_model is not None:
            check_stage(float_model, Stage.FLOAT, where="NumericDashboard", arg="float_model")
            check_lineage(float_model, quantized_model, "NumericDashboard(float_model=...)")
        if session is not None and getattr(session, "quantized_model", None) is not None:
            check_fingerprint(report, session.quantized_model, "NumericDashboard(session=...)")
        self.lowered, self.lowering = _checked_lowering(lowered, lowering, quantized_model)
        self.session, self._builds = session, 0
        self.error: str | None = None
        self.quantizer, self.metric = quantizer, metric
        model = quantized_model if quantized_model is not None else float_model
        self._batches, self._calibration = variant_batches(
            [] if data is None else data, calibration_data, model, "NumericDashboard",
            allow_empty=data is None,
        )  # fmt: skip
        self._sample = self._sample_inputs(model)
        self.float_model = (
            float_graph_of(float_model, self._sample)
            if float_model is not None and self._sample is not None
            else None
        )
        self._base = report
        self._runs: dict[tuple[str, ...], tuple[Any, Any]] = {(): (quantized_model, report)}
        self._order = {str(n): i for i, n in enumerate(report.df["node"])}
        self._details: dict[tuple, LayerDetail] = {}
        worst = report.worst(1)["node"].tolist() if len(report.df) else []
        first = Run((), float(report.output_sqnr), report.metric)
        self.state = DashboardState(selected=worst[0] if worst else None, history=(first,))
        self.view = DashboardView(self, with_graph=graph and quantized_model is not None)
        self.view.refresh()

    @classmethod
    def from_models(
        cls,
        float_model: Any,
        quantized_model: GraphModule,
        data: Any,
        *,
        metric: Callable[[Any, Any, Any], float] | None = None,
        quantizer: Any = None,
        calibration_data: Any = None,
        progress: bool = True,
        graph: bool = True,
        lowered: Any = None,
        lowering: Any = None,
    ) -> NumericDashboard:
        """Compare ``quantized_model`` with ``float_model`` over ``data`` and show the dashboard.

        Args:
            float_model: the float graph module from :func:`qviz.export` that was quantized
                (or the float nn.Module, exported here on the first batch): float.
            quantized_model: the model from :func:`qviz.convert_pt2e`: converted. Both stages
                are checked before anything runs (a prepared model's observers see no data).
            data: evaluation batches (as for :func:`qviz.calibrate`: tensors,
                ``(inputs..., target)``, dicts); kept in memory.
            metric: ``metric(float_out, quant_out, target) -> float``, e.g. accuracy.
            quantizer: the quantizer used, to enable "fallback" (without it: disabled).
            calibration_data: batches to calibrate fallback variants on (default: ``data``).
            progress: show a progress bar while comparing.
            graph: show the heatmap graph.
            lowered, lowering: the lowered model and its comparison, as for the constructor.

        Example:
            >>> import torch, qviz
            >>> from qviz.engine.quantizers import XNNPACKQuantizer
            >>> from qviz.engine.quantizers import get_symmetric_quantization_config as cfg
            >>> x = torch.randn(8, 4)
            >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (x,))
            >>> qm = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(
            ...     gm, XNNPACKQuantizer().set_global(cfg())), [x], progress=False))
            >>> d = NumericDashboard.from_models(gm, qm, [x], progress=False, graph=False)
            >>> d.detail("linear").numel
            16
        """
        from qviz.numeric.compare.compare import compare

        where = "NumericDashboard.from_models"
        check_stage(quantized_model, Stage.CONVERTED, where=where, arg="quantized_model")
        check_stage(float_model, Stage.FLOAT, where=where, arg="float_model")
        batches, calibration = variant_batches(data, calibration_data, quantized_model, where)
        fgm = float_graph_of(float_model, bind_batch(quantized_model, batches[0], where).args)
        report = compare(fgm, quantized_model, batches, metric=metric, progress=progress)
        return cls(
            report, quantized_model=quantized_model, float_model=fgm, data=batches,
            quantizer=quantizer, calibration_data=calibration, metric=metric, graph=graph,
            lowered=lowered, lowering=lowering,
        )  # fmt: skip

    @classmethod
    def from_session(cls, session: Any, *, graph: bool = True) -> NumericDashboard:
        """The dashboard of a :class:`~qviz.numeric.RepairSession`: its current model and
        report, each poor layer's diagnosis, and remedies applied and undone from the
        dashboard (:meth:`apply`, :meth:`undo`; the session changes with it).

        Example:
            >>> import torch, qviz
            >>> from qviz.engine.quantizers import XNNPACKQuantizer
            >>> from qviz.engine.quantizers import get_symmetric_quantization_config as cfg
            >>> from qviz.numeric import RepairSession
            >>> torch.manual_seed(0) and None
            >>> data = [torch.randn(16, 4)]
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
            >>> gm = qviz.export(model.eval(), (data[0],))
            >>> q = XNNPACKQuantizer().set_global(cfg(is_per_channel=False, weight_qmax=3,
            ...                                       weight_qmin=-3))
            >>> s = RepairSession(gm, q, data, data, progress=False)
            >>> d = NumericDashboard.from_session(s, graph=False)
            >>> d.finding("linear").cause.value, d.apply("fallback").history[-1]["remedy"]
            ('rounding', 'fallback')
            >>> [r["remedy"] for r in d.undo().history], len(s.history)
            (['', 'fallback', 'undo fallback'], 0)
        """
        from qviz.numeric.repair.session import RepairSession

        if not isinstance(session, RepairSession):
            raise ConfigError(
                f"NumericDashboard.from_session takes a qviz.numeric.RepairSession, got "
                f"{type(session).__name__}"
            )
        return cls(
            session.report, quantized_model=session.quantized_model,
            float_model=session.float_model, data=session.data, metric=session.metric,
            graph=graph, session=session,
        )  # fmt: skip

    # -- Python equivalents of the controls ----------------------------------------------------
    def select(self, node: str) -> NumericDashboard:
        """Show a layer: a node name of the table (``"conv2d_1"``)."""
        return self._guard(lambda: self._select(node))

    def sort(self, by: str) -> NumericDashboard:
        """Sort the table: ``"graph"`` order or a column, worst first (see SORT_COLUMNS)."""
        return self._guard(lambda: self._set(sort_by=choice(by, SORT_COLUMNS, "sort by")))

    def color_by(self, column: str) -> NumericDashboard:
        """Colour the graph by a report column (see COLOR_COLUMNS; the worse, the redder)."""
        return self._guard(
            lambda: self._set(color_by=choice(column, self.color_options, "colour by"))
        )

    @property
    def color_options(self) -> tuple[str, ...]:
        """What the graph can be coloured by: the report's columns, with ``lowering`` the
        steps from the reference on the lowered program's kernels, and in a repair session
        each poor layer's cause."""
        extra = (LOWERING_COLUMN,) if self.lowering is not None else ()
        return COLOR_COLUMNS + extra + ((CAUSE_COLUMN,) if self.session is not None else ())

    def apply(self, remedy: Any = None, **kwargs: Any) -> NumericDashboard:
        """Apply a remedy in the repair session (:meth:`from_session`) and show the result.

        Args:
            remedy: None or ``"prescription"`` (the selected layer's prescription), a remedy
                name as :meth:`RepairSession.apply <qviz.numeric.RepairSession.apply>` takes
                it (``"per_channel"`` and ``"fallback"`` act on the selected layer unless
                ``nodes=`` is given), or a Finding.
            **kwargs: the remedy's own arguments (``iterations=``, ``alpha=``, ``nodes=``).
        """
        return self._guard(lambda: self._record_build(apply_remedy(self, remedy, kwargs)))

    def undo(self) -> NumericDashboard:
        """Remove the repair session's last remedy; the model before it comes back."""
        return self._guard(lambda: self._record_build(undo_remedy(self), undone=True))

    @property
    def diagnosis(self) -> Any:
        """The repair session's current :class:`~qviz.numeric.diagnose.diagnose.Diagnosis` (None
        outside a session)."""
        return self.session.diagnosis if self.session is not None else None

    def finding(self, node: str | None = None) -> Any:
        """The diagnosis of ``node`` (default: the selected layer): its Finding, or None when
        it is not poor or outside a repair session."""
        node = node if node is not None else self.state.selected
        found = self.diagnosis.for_node(node) if self.diagnosis is not None and node else ()
        return found[0] if found else None

    def toggle_fallback(self, node: str | None = None) -> NumericDashboard:
        """Keep ``node`` (default: the selected layer) in float, or quantize it again.

        The model is prepared from the float graph with :func:`qviz.numeric.fallback` for every
        layer now in float, calibrated, converted and compared again; the run joins
        :attr:`history`. A set of fallbacks seen before is not run again.
        """
        return self._guard(lambda: self._toggle(node))

    def detail(self, node: str | None = None) -> LayerDetail:
        """The float against quantized outputs of ``node`` (default: the selected layer).

        Raises:
            ConfigError: an unknown layer, or no float model and data to run (use from_models).
        """
        node = node if node is not None else self.state.selected
        if node is None:
            raise ConfigError("detail: no layer selected; pass a node name")
        self._check_row(node)
        if self.float_model is None or self.quantized_model is None or self._sample is None:
            raise ConfigError(
                "layer details need the models and data: use NumericDashboard.from_models("
                "float_model, quantized_model, data)"
            )
        key = (self.state.fallback, self.state.builds, node)
        if key not in self._details:
            float_model = self.session.float_model if self.session is not None else self.float_model
            self._details[key] = layer_detail(float_model, self.quantized_model, node, self._sample)
        return self._details[key]

    @property
    def report(self) -> Any:
        """The NumericReport of the current run."""
        if self.session is not None:
            return self.session.report
        return self._runs[self.state.fallback][1]

    @property
    def quantized_model(self) -> GraphModule | None:
        """The quantized model of the current run (None when not given)."""
        if self.session is not None:
            return self.session.quantized_model
        return self._runs[self.state.fallback][0]

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every run, first the one given: ``{"fallback": [...], "output_sqnr", "metric"}``."""
        return [run.as_dict() for run in self.state.history]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The table in its sort order: the report's rows, plus one per layer in float; in a
        repair session after a remedy, each row's ``cumulative_delta`` (dB) by that remedy."""
        rows = [dict(r, fallback=False) for r in self.report.df.to_dict("records")]
        if self.session is not None and self.session.history:  # the last remedy's change
            step = self.session.history[-1]
            delta = dict(zip(step.df["node"], step.df["cumulative_delta"], strict=True))
            rows = [dict(r, cumulative_delta=float(delta.get(r["node"], math.nan))) for r in rows]
        base = {str(r["node"]): r for r in self._base.df.to_dict("records")}
        for name in self.state.fallback:
            rows.append(float_row(base.get(name, {"node": name})))
        return sorted_rows(rows, self.state.sort_by, self._order)

    # -- state changes -------------------------------------------------------------------------
    def _set(self, **changes: Any) -> None:
        self.state = dataclasses.replace(self.state, **changes)

    def _record_build(self, run: Run, *, undone: bool = False) -> None:
        """Record a repair session's run: a new build id for the model a remedy made (or, for
        an undo, the build before it again), the run in the history, and the selection kept
        where the session's new report still has that layer."""
        builds = self.state.builds
        if undone:
            builds = builds[:-1]
        else:
            self._builds += 1
            builds = (*builds, self._builds)
        selected = kept_selection(self.report, self.state.selected)
        self._set(builds=builds, history=(*self.state.history, run), selected=selected)

    def _nodes(self) -> list[str]:
        return [*map(str, self.report.df["node"]), *self.state.fallback]

    def _check_row(self, node: Any) -> None:
        nodes = self._nodes()
        if node not in nodes:
            raise ConfigError(
                f"{node!r} is not a layer of the numeric report ({closest_names(node, nodes)}; "
                f"the layers are {nodes[:12]})"
            )

    def _select(self, node: str) -> None:
        self._check_row(node)
        self._set(selected=node)

    def _toggle(self, node: str | None) -> None:
        node = node if node is not None else self.state.selected
        if node is None:
            raise ConfigError("toggle_fallback: no layer selected; pass a node name")
        if self.session is not None:
            raise ConfigError(
                "in a repair session a fallback is a remedy: dash.apply('fallback') keeps the "
                "selected layer in float, dash.undo() takes it back"
            )
        if self.quantizer is None:
            raise ConfigError(
                "fallback needs the quantizer: pass quantizer= (and the models and data) to "
                "NumericDashboard.from_models"
            )
        if self.float_model is None or not self._batches:
            raise ConfigError(
                "fallback needs the float model and data: use NumericDashboard.from_models("
                "float_model, quantized_model, data, quantizer=...)"
            )
        self._check_row(node)
        fallen = tuple(sorted(set(self.state.fallback) ^ {node}))
        if fallen not in self._runs:
            self._runs[fallen] = self._run(fallen)
        report = self._runs[fallen][1]
        run = Run(fallen, float(report.output_sqnr), report.metric)
        self._set(fallback=fallen, selected=node, history=(*self.state.history, run))

    def _run(self, fallen: tuple[str, ...]) -> tuple[GraphModule, Any]:
        from qviz.numeric import compare, fallback

        quantizer = fallback(self.quantizer, list(fallen)) if fallen else self.quantizer
        total, done = len(self._calibration) + len(self._batches), [0]

        def counted(batches: Iterable[Any]) -> Iterator[Any]:
            for batch in batches:
                yield batch
                done[0] += 1
                self.view.on_batch(done[0], total)

        quantized = quantize_variant(self.float_model, quantizer, counted(self._calibration),
                                     where="NumericDashboard.fallback")  # fmt: skip
        batches = counted(self._batches)
        report = compare(self.float_model, quantized, batches, metric=self.metric, progress=False)
        return quantized, report

    def _sample_inputs(self, model: Any) -> tuple[Any, ...] | None:
        """The first batch's inputs, bound to ``model`` (the detail sample)."""
        if not self._batches or model is None:
            return None
        return bind_batch(model, self._batches[0], "NumericDashboard: batch 0").args

    def __repr__(self) -> str:
        st = self.state
        return (
            f"NumericDashboard({len(self.report.df)} layers, selected={st.selected}, "
            f"fallback={list(st.fallback)}, output SQNR {self.report.output_sqnr:.2f} dB)"
        )


def _checked_lowering(lowered: Any, lowering: Any, model: Any) -> tuple[Any, Any]:
    """``lowered`` and ``lowering``, refused unless both measure ``model`` (the dashboard's
    quantized model as given)."""
    if lowered is None and lowering is None:
        return None, None
    if model is None:
        raise ConfigError(
            "NumericDashboard(lowered=..., lowering=...) needs quantized_model=, the model "
            "that was lowered"
        )
    for record, arg in ((lowered, "lowered"), (lowering, "lowering")):
        if record is not None:
            check_fingerprint(record, model, f"NumericDashboard({arg}=...)", what=f"the {arg}")
    return lowered, lowering
