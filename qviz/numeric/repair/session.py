"""``RepairSession``: apply a remedy, see the model before and after, undo it.

A session starts from the float graph, a quantizer and data, and builds the baseline: prepare →
calibrate → convert → :func:`qviz.numeric.compare`, and :func:`qviz.numeric.diagnose` when
:attr:`RepairSession.diagnosis` is first read for a step (then kept). Each
:meth:`RepairSession.apply` rebuilds the quantized model from the float graph with every remedy
applied so far, measures it on the same batches and returns a :class:`RepairStep`: the model's
output SQNR and metric, and each layer's local and cumulative SQNR, before and after.

**Order.** A rebuild runs the stages in one fixed order, whatever the order the remedies were
applied in: float-graph transforms (cross-layer equalization, SmoothQuant) before prepare,
quantizer changes (per-channel weights, overrides, fallbacks) at prepare, post-convert
transforms (bias correction, AdaRound) after convert. Within a stage the remedies run in the
order they were applied (equalizing then smoothing differs from smoothing then equalizing; a
later override edits what an earlier one set). Only the stages from the new remedy's on are
rebuilt: a post-convert remedy starts from the current quantized model.

**What is measured.** Each layer is compared with the float graph the model was prepared from
(after the float-graph transforms, which keep the float function but rescale channels inside
it); the calibration batches and the evaluation batches are read once, when the session starts,
so every step sees the same ones.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> data = [torch.randn(16, 4)]
    >>> gm = qviz.export(model.eval(), (data[0],))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> session = RepairSession(gm, q, data, data, progress=False)
    >>> step = session.apply("cross_layer_equalization")
    >>> [r.kind for r in session.transforms], len(session.undo().history)
    (['cross_layer_equalization'], 0)
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule

from qviz.engine.graph.fingerprint import derived_copy
from qviz.engine.graph.stage import Stage as ModelStage
from qviz.engine.graph.stage import check_stage
from qviz.engine.pt2e.plan import TransformRecord
from qviz.errors import ConfigError, QvizError
from qviz.numeric.compare.compare import compare
from qviz.numeric.diagnose.diagnose import Diagnosis, Finding, diagnose
from qviz.numeric.measure.totals import check_figures
from qviz.numeric.repair.remedies import Remedy, Stage, quantizer_with, remedy_of, transform
from qviz.numeric.variants.variants import prepare_variant, variant_batches

_LAYER_COLUMNS = ("node", "local_sqnr_before", "local_sqnr_after", "cumulative_sqnr_before",
                  "cumulative_sqnr_after")  # fmt: skip


NO_GAIN_DB = 0.05
"""A step whose output SQNR moves less than this (dB), its metric not rising, is "no gain"."""


@dataclass(frozen=True, kw_only=True)
class RepairStep:
    """One applied remedy and what it changed.

    Attributes:
        remedy: its name (``"cross_layer_equalization"``, ``"fallback"``, ...).
        arguments: what it was given, as ``(name, value)`` pairs.
        scope: the nodes the finding it came from named (empty when applied by name).
        transforms: the TransformRecords it added to the plan.
        layers: per operator ``(node, local before, local after, cumulative before, cumulative
            after)`` SQNR in dB (NaN where the operator is not quantized on that side);
            :attr:`df` shows them.
        output_sqnr_before, output_sqnr_after: the model outputs' SQNR (dB).
        metric_before, metric_after: the session's metric (None without one).
        seconds: how long the rebuild and the measurement took.

    Example:
        >>> step = RepairStep(remedy="fallback", arguments=(("nodes", ("relu",)),), scope=(),
        ...     transforms=(),
        ...                   layers=(("relu", 30.0, math.nan, 28.0,
        ...     math.nan),), output_sqnr_before=28.0, output_sqnr_after=31.5, metric_before=None,
        ...     metric_after=None,
        ...                   seconds=0.1)
        >>> step.delta, step
        (3.5, RepairStep(fallback: output SQNR 28.00 -> 31.50 dB))
    """

    remedy: str
    arguments: tuple[tuple[str, Any], ...]
    scope: tuple[str, ...]
    transforms: tuple[TransformRecord, ...]
    layers: tuple[tuple[str, float, float, float, float], ...]
    output_sqnr_before: float
    output_sqnr_after: float
    metric_before: float | None
    metric_after: float | None
    seconds: float

    @property
    def delta(self) -> float:
        """Output SQNR after minus before (dB)."""
        return self.output_sqnr_after - self.output_sqnr_before

    @property
    def gained(self) -> bool:
        """Whether the remedy paid: the output SQNR rose by at least :data:`NO_GAIN_DB`, or
        the metric rose.

        Example:
            >>> RepairStep(remedy="fallback", arguments=(), scope=(), transforms=(), layers=(),
            ...     output_sqnr_before=28.0, output_sqnr_after=28.001, metric_before=None,
            ...     metric_after=None, seconds=0.1).gained
            False
        """
        metric_up = (
            self.metric_before is not None
            and self.metric_after is not None
            and self.metric_after > self.metric_before
        )
        return self.delta >= NO_GAIN_DB or metric_up

    @property
    def verdict(self) -> str:
        """The step in words: ``"+3.50 dB"``, ``"no gain"`` or ``"worse by 1.20 dB"``.

        Example:
            >>> RepairStep(remedy="fallback", arguments=(), scope=(), transforms=(), layers=(),
            ...     output_sqnr_before=28.0, output_sqnr_after=28.0, metric_before=None,
            ...     metric_after=None, seconds=0.1).verdict
            'no gain (output SQNR 28.00 dB, unchanged within 0.05 dB)'
        """
        if self.gained:
            return f"{self.delta:+.2f} dB"
        if self.delta <= -NO_GAIN_DB:
            return f"worse by {-self.delta:.2f} dB"
        return (
            f"no gain (output SQNR {self.output_sqnr_after:.2f} dB, unchanged within "
            f"{NO_GAIN_DB} dB)"
        )

    @property
    def df(self) -> Any:
        """One row per operator: node, local and cumulative SQNR before and after, and the two
        changes (``local_delta``, ``cumulative_delta``)."""
        import pandas as pd

        df = pd.DataFrame(list(self.layers), columns=list(_LAYER_COLUMNS))
        df["local_delta"] = df["local_sqnr_after"] - df["local_sqnr_before"]
        df["cumulative_delta"] = df["cumulative_sqnr_after"] - df["cumulative_sqnr_before"]
        return df

    def changes(self, nodes: str | None = None, *, by: str | None = None) -> RepairStep:
        """The same step with its per-layer table narrowed and sorted, for a notebook to show.

        Args:
            nodes: a regular expression; only the layers whose node name starts with a match
                stay (``r"conv|linear"``). None: every layer.
            by: a numeric column of :attr:`df` (``"local_delta"``, ``"cumulative_delta"``,
                ``"local_sqnr_after"``, ...): the layers largest first, NaN last. None: graph
                order.

        Raises:
            ConfigError: ``by`` is not a numeric column of :attr:`df`, or ``nodes`` is not a
                regular expression.

        Example:
            >>> step = RepairStep(remedy="fallback", arguments=(), scope=(), transforms=(),
            ...     layers=(("conv2d", 10.0, 30.0, 9.0, 29.0),
            ...     ("relu", 20.0, 21.0, 9.5, 28.0), ("linear", 5.0, 5.0, 8.0, 27.0)),
            ...     output_sqnr_before=8.0, output_sqnr_after=27.0, metric_before=None,
            ...     metric_after=None, seconds=0.1)
            >>> [row[0] for row in step.changes(r"conv|linear", by="local_delta").layers]
            ['conv2d', 'linear']
        """
        import re

        columns = [c for c in self.df.columns if c != "node"]
        if by is not None and by not in columns:
            raise ConfigError(f"RepairStep.changes(by={by!r}): give one of {columns}")
        try:
            pattern = re.compile(nodes) if nodes is not None else None
        except (re.error, TypeError) as e:
            raise ConfigError(f"RepairStep.changes(nodes={nodes!r}): not a pattern: {e}") from e
        df = self.df
        keep = [pattern is None or bool(pattern.match(str(n))) for n in df["node"]]
        rows = df[keep]
        if by is not None:
            rows = rows.sort_values(by, ascending=False, kind="stable", na_position="last")
        layers = tuple(self.layers[i] for i in rows.index)
        return dataclasses.replace(self, layers=layers)

    def __repr__(self) -> str:
        if not self.gained:
            return f"RepairStep({self.remedy}: {self.verdict})"
        return (
            f"RepairStep({self.remedy}: output SQNR {self.output_sqnr_before:.2f} -> "
            f"{self.output_sqnr_after:.2f} dB)"
        )

    def _repr_html_(self) -> str:
        """The notebook view (:mod:`qviz.numeric.repair.view`): the summary line, then per
        layer its local and cumulative SQNR before, after and the change."""
        from qviz.numeric.repair.view import step_html

        return step_html(self)


@dataclass(frozen=True, kw_only=True)
class _State:
    """Everything one build made; the session keeps one per step, so undo restores it as is.

    Its diagnosis is made when first asked for (:meth:`diagnosed`), then kept: it measures each
    finding's remedies on its layer (AdaRound's estimate among them), the slowest part of a
    build, and a step that nobody diagnoses (one of several remedies applied in a row) needs
    none."""

    remedies: tuple[Remedy, ...]
    records: tuple[tuple[TransformRecord, ...], ...]
    float_gm: GraphModule
    quantizer: Any
    prepared: GraphModule
    converted: GraphModule
    quantized: GraphModule
    report: Any
    diagnose: Any  # () -> Diagnosis
    made: dict[str, Diagnosis] = dataclasses.field(default_factory=dict)

    def diagnosed(self) -> Diagnosis:
        """This state's diagnosis (made on the first call, the same object after)."""
        if "diagnosis" not in self.made:
            self.made["diagnosis"] = self.diagnose()
        return self.made["diagnosis"]


def _figures(report: Any) -> dict[str, tuple[float, float]]:
    return {str(r["node"]): (float(r["local_sqnr"]), float(r["cumulative_sqnr"]))
            for r in report.df.to_dict("records")}  # fmt: skip


def _layers(before: Any, after: Any) -> tuple[tuple[str, float, float, float, float], ...]:
    """Each operator of either report (the before report's order first), figures side by side."""
    old, new, nan = _figures(before), _figures(after), (math.nan, math.nan)
    rows = []
    for node in dict.fromkeys([*old, *new]):
        (lb, cb), (la, ca) = old.get(node, nan), new.get(node, nan)
        rows.append((node, lb, la, cb, ca))
    return tuple(rows)


class RepairSession:
    """Apply remedies to a quantized model one at a time, each measured before and after, with
    an undo (see the module docstring for the order the stages run in).

    Args:
        float_gm: the float graph module :func:`qviz.export` returned (copied; never changed).
        quantizer: the quantizer the baseline is prepared with.
        calibration_data: batches to calibrate on (and for the remedies that need data:
            SmoothQuant's activation ranges, bias correction, AdaRound); None: ``data``.
        data: the evaluation batches every report is measured on (and diagnose reads).
        metric: ``metric(float_out, quant_out, target) -> float``, as in
            :func:`qviz.numeric.compare`.
        progress: progress bars for calibration, comparison and the long remedies.

    Attributes:
        history: the applied steps (:class:`RepairStep`), oldest first.
        report, quantized_model, prepared_model, float_model, diagnosis, transforms: the
            current state's.
        data: the evaluation batches.
        baseline: the report of the model without remedies.

    Raises:
        ConfigError: ``float_gm`` is not an exported float graph, or the data has no batch.
        MeasurementError: the baseline's output SQNR or metric is not a number (outputs
            without a floating-point tensor, NaN in one output only, ...); a remedy whose
            model measures so is refused the same way, and the session stays as it was.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> data = [torch.randn(16, 4)]
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        >>> gm = qviz.export(model.eval(), (data[0],))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> session = RepairSession(gm, q, data, data, progress=False)
        >>> step = session.apply("fallback", nodes="linear_1")
        >>> step.remedy, list(session.report.df["node"])
        ('fallback', ['linear'])
    """

    def __init__(
        self,
        float_gm: GraphModule,
        quantizer: Any,
        calibration_data: Any,
        data: Any,
        *,
        metric: Any = None,
        progress: bool = True,
    ) -> None:
        check_stage(float_gm, ModelStage.FLOAT, where="RepairSession", arg="float_gm",
                    exported=True)  # fmt: skip
        # the session's own copy, its origin recorded: no prepare digests its weights again
        self._float = derived_copy(float_gm)
        self._quantizer = quantizer
        self._data, self._calibration = variant_batches(data, calibration_data, float_gm,
                                                        "RepairSession")  # fmt: skip
        self.metric, self.progress = metric, progress
        self._states = [self._build((), None)]
        self._steps: list[RepairStep] = []

    def _build(self, remedies: tuple[Remedy, ...], base: _State | None) -> _State:
        """The state with ``remedies`` applied; from ``base`` when only the last one is new
        (the stages before the new remedy's are taken from it)."""
        import qviz

        start = Stage.FLOAT if base is None else remedies[-1].stage
        records = [*base.records, ()] if base is not None else [()] * len(remedies)
        cal, progress = self._calibration, self.progress
        gm = self._float if start is Stage.FLOAT else base.float_gm  # type: ignore[union-attr]
        for i, r in enumerate(remedies):
            if start is Stage.FLOAT and r.stage is Stage.FLOAT:
                gm, records[i] = transform(r, gm, gm, cal, progress)
        if start <= Stage.QUANTIZER or base is None:
            quantizer = quantizer_with(self._quantizer, remedies, gm)
            prepared = prepare_variant(gm, quantizer, cal, where="RepairSession", progress=progress)
            converted = qviz.convert_pt2e(prepared)
            quantized, post = converted, range(len(remedies))
        else:
            quantizer, prepared = base.quantizer, base.prepared
            converted, quantized = base.converted, base.quantized
            post = range(len(remedies) - 1, len(remedies))
        for i in post:
            if remedies[i].stage is Stage.CONVERTED:
                quantized, records[i] = transform(remedies[i], quantized, gm, cal, progress)
        report = compare(gm, quantized, self._data, metric=self.metric, progress=progress)
        what = "+".join(r.name for r in remedies) or "the baseline (no remedy)"
        check_figures(report.output_sqnr, report.output_problem, report.metric,
                      f"RepairSession: {what}")  # fmt: skip
        data = self._data
        return _State(
            remedies=remedies,
            records=tuple(records),
            float_gm=gm,
            quantizer=quantizer,
            prepared=prepared,
            converted=converted,
            quantized=quantized,
            report=report,
            # the estimates of layers a step left as they were are kept (by what they were
            # measured on), not measured again: diagnose's RECENT_ESTIMATES
            diagnose=lambda: diagnose(report, prepared, data=data, progress=self.progress),
        )

    def apply(self, remedy: Any, **kwargs: Any) -> RepairStep:
        """Apply ``remedy``, rebuild and re-measure; the step is added to :attr:`history`.

        Args:
            remedy: ``"cross_layer_equalization"``, ``"smooth_quant"``, ``"per_channel"``
                (``nodes=``: conv / linear nodes whose weights go per channel), ``"override"``
                (``overrides=``, as OverrideQuantizer takes them), ``"fallback"`` (``nodes=``:
                kept in float), ``"bias_correction"``, ``"adaround"``; or a Finding of
                :attr:`diagnosis` (its prescription names the remedy and its arguments).
            **kwargs: the remedy's own arguments (e.g. ``alpha=`` for SmoothQuant,
                ``iterations=`` for AdaRound); the session passes models, data and progress.

        Returns:
            The :class:`RepairStep`: before (the current state) and after.

        Raises:
            ConfigError: an unknown remedy or argument (before anything runs). Any error while
                rebuilding is re-raised as a QvizError naming the remedy and the cause; the
                session is then exactly as it was.

        Example:
            >>> import torch, qviz
            >>> from qviz.engine.quantizers import XNNPACKQuantizer
            >>> from qviz.engine.quantizers import get_symmetric_quantization_config as config
            >>> data = [torch.randn(8, 4)]
            >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 2)).eval(), (data[0],))
            >>> q = XNNPACKQuantizer().set_global(config())
            >>> s = RepairSession(gm, q, data, data, progress=False)
            >>> s.apply("smoth_quant")
            Traceback (most recent call last):
            ...
            qviz.errors.ConfigError: apply(remedy='smoth_quant'): give one of ['cross_layer_equalization', 'smooth_quant', 'per_channel', 'override', 'fallback', 'bias_correction', 'adaround'] or a Finding of qviz.numeric.diagnose (closest: ['smooth_quant'])
        """  # noqa: E501
        self._check_finding(remedy)
        r = remedy_of(remedy, kwargs)
        state, start = self._states[-1], time.perf_counter()
        try:
            new = self._build((*state.remedies, r), state)
        except Exception as e:
            why = f"RepairSession.apply({r.name!r}) failed; the session is unchanged: "
            if isinstance(e, QvizError):
                raise type(e)(why + str(e)) from e
            raise QvizError(f"{why}{type(e).__name__}: {e}") from e
        step = RepairStep(
            remedy=r.name,
            arguments=r.arguments,
            scope=r.scope,
            transforms=new.records[-1],
            layers=_layers(state.report, new.report),
            output_sqnr_before=float(state.report.output_sqnr),
            output_sqnr_after=float(new.report.output_sqnr),
            metric_before=state.report.metric,
            metric_after=new.report.metric,
            seconds=time.perf_counter() - start,
        )
        self._states.append(new)
        self._steps.append(step)
        return step

    def undo(self) -> RepairSession:
        """Remove the last remedy: the previous model, report and diagnosis come back (the same
        objects, nothing is recomputed); returns the session.

        Raises:
            ConfigError: no remedy has been applied.

        Example:
            >>> import torch, qviz
            >>> from qviz.engine.quantizers import XNNPACKQuantizer
            >>> from qviz.engine.quantizers import get_symmetric_quantization_config as config
            >>> data = [torch.randn(8, 4)]
            >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 2)).eval(), (data[0],))
            >>> q = XNNPACKQuantizer().set_global(config())
            >>> s = RepairSession(gm, q, data, data, progress=False)
            >>> s.undo()
            Traceback (most recent call last):
            ...
            qviz.errors.ConfigError: RepairSession.undo(): no remedy to undo; apply one first
        """
        if not self._steps:
            raise ConfigError("RepairSession.undo(): no remedy to undo; apply one first")
        self._states.pop()
        self._steps.pop()
        return self

    @property
    def history(self) -> tuple[RepairStep, ...]:
        """The applied steps, oldest first."""
        return tuple(self._steps)

    @property
    def remedies(self) -> tuple[Remedy, ...]:
        """The applied remedies, in application order."""
        return self._states[-1].remedies

    @property
    def report(self) -> Any:
        """The current model's :class:`~qviz.numeric.compare.report.NumericReport`."""
        return self._states[-1].report

    @property
    def baseline(self) -> Any:
        """The report of the model without remedies."""
        return self._states[0].report

    @property
    def quantized_model(self) -> GraphModule:
        """The current quantized model (converted, then the post-convert remedies)."""
        return self._states[-1].quantized

    @property
    def float_model(self) -> GraphModule:
        """The float graph the current model was prepared from (the float-graph remedies
        applied: what each layer is compared with)."""
        return self._states[-1].float_gm

    @property
    def data(self) -> list[Any]:
        """The evaluation batches every report is measured on (read once, at the start)."""
        return list(self._data)

    @property
    def prepared_model(self) -> GraphModule:
        """The current calibrated prepared model (what :attr:`diagnosis` read)."""
        return self._states[-1].prepared

    def _check_finding(self, remedy: Any) -> None:
        """A Finding must come from one of this session's diagnoses (the current one, or an
        earlier step's): another session's, or another model's, names nodes and figures of a
        model this session does not hold."""
        if not isinstance(remedy, Finding):
            return
        if any(remedy in state.made["diagnosis"].findings
               for state in self._states if state.made):  # fmt: skip
            return
        raise ConfigError(
            f"RepairSession.apply: this Finding ({remedy.node}: {remedy.cause}, "
            f"{remedy.sqnr:.2f} dB) is not one of this session's diagnoses; it came from "
            f"another session or another model's diagnose: apply a finding of "
            f"session.diagnosis.findings, or name the remedy (apply('smooth_quant', ...))"
        )

    @property
    def diagnosis(self) -> Diagnosis:
        """The current model's :class:`~qviz.numeric.diagnose.diagnose.Diagnosis` (measured
        when first asked for, then kept)."""
        return self._states[-1].diagnosed()

    @property
    def transforms(self) -> tuple[TransformRecord, ...]:
        """The TransformRecords of the current model's plan, in the order they ran."""
        return self.quantized_model.plan.transforms

    def _rows(self) -> list[tuple[str, float, float | None, float]]:
        """(remedy, output SQNR, metric, change in output SQNR) of the baseline and each step."""
        base = self.baseline
        rows = [("baseline", float(base.output_sqnr), base.metric, math.nan)]
        rows += [(s.remedy, s.output_sqnr_after, s.metric_after, s.delta) for s in self._steps]
        return rows

    def __repr__(self) -> str:
        steps = " -> ".join(f"{r}: {sqnr:.2f} dB" for r, sqnr, _, _ in self._rows())
        return f"RepairSession({steps})"

    def _repr_html_(self) -> str:
        from qviz.numeric.repair.view import session_html

        return session_html(self._rows())
