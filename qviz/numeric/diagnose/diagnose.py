"""``diagnose``: why each poor layer of a quantized model loses accuracy, and what to do.

:func:`compare` says *where* a quantized model loses accuracy; :func:`diagnose` says *why*. It
reads what the numeric suite and the engine already recorded: the report's rows (local SQNR, the
clipped share and the part of the grid error it carries, the worst token and channel), the plan
of the calibrated prepared model (its sharing groups and their members) and its observers (their
ranges, histograms and qparams), and the weights. A layer is *poor* when its local SQNR, or its
worst token's or channel's, is below ``threshold_db``; each poor layer gets one
:class:`Finding`: the first of these causes whose rule matches
(:mod:`qviz.numeric.diagnose.rules`), with its evidence as named numbers and a prescription:

======================  ============================================  =============================
cause                   evidence                                      prescription
======================  ============================================  =============================
shared group            members of one observer group whose own       quantize the small member
                        float ranges (the report's) differ by          apart (OverrideQuantizer) or
                        ``range_ratio`` >= ``outlier_factor``          rescale the branch
outlier channels        weights (per-tensor) or activations (with     per-channel weights;
                        ``data``) whose per-channel absolute maxima    cross-layer equalization
                        spread ``max / median`` >= the factor          (conv/linear through relu);
                                                                       SmoothQuant (a linear after
                                                                       a LayerNorm)
slice                   tensor-wide local SQNR fine, one token or     per-channel weights, or
                        channel below the threshold                    keep the layer in float
degenerate range        a tensor whose values round to zero on its    keep it in float
                        grid (``zeros_after`` vs ``zeros_before``)     (``qviz.numeric.fallback``)
clipping                ``clipped`` values carry >= half the grid     a fixed wider range, or the
                        error (``clip_error_share``)                   HistogramObserver method
                                                                       'mse' / 'max'
rounding                local SQNR against the grid's theoretical     bias correction, AdaRound,
                        one (``grid_sqnr``)                            or 16 bits
======================  ============================================  =============================

Prescriptions name the qviz function that applies them as a string (``function``) with its
arguments; the repair transforms live in :mod:`qviz.engine.repair`.

A prescription is a claim, so with ``data`` it is measured: each poor operator runs alone on
the float model's inputs to it, and each candidate remedy (the cause's suggestion, per-channel
weights, bias correction, AdaRound, a 16-bit grid, float) is tried there
(:mod:`qviz.numeric.diagnose.gain`). ``Finding.prescription`` is then the best that pays
(:func:`~qviz.numeric.diagnose.choice.rank`), ``Finding.suggested`` the cause's own, and
``Finding.verdict`` says in one line what was measured, or that no remedy keeping the layer's
grid gains ``min_gain_db``.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> class LayerScale(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc, self.gamma = nn.Linear(8, 8), nn.Parameter(torch.full((8,), 1e-6))
    ...     def forward(self, x):
    ...         return self.fc(x) * self.gamma
    >>> data = [torch.randn(8, 8) for _ in range(2)]
    >>> gm = qviz.export(LayerScale().eval(), (data[0],))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), data, progress=False)
    >>> report = qviz.numeric.compare(gm, qviz.convert_pt2e(prepared), data, progress=False)
    >>> d = diagnose(report, prepared)
    >>> [(f.node, f.cause.value, f.prescription.function) for f in d]
    [('mul', 'degenerate range', 'qviz.numeric.fallback')]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from qviz.engine.graph.fingerprint import Fingerprint, check_converted_from
from qviz.engine.graph.inputs import bind_batch, measured_batches
from qviz.engine.graph.node_data import op_name
from qviz.engine.graph.stage import Stage, check_stage, is_observer
from qviz.engine.pt2e.convert import saw_no_data
from qviz.engine.pt2e.plan import require_plan
from qviz.errors import CalibrationError, ConfigError, closest_names
from qviz.numeric.diagnose.choice import measure_remedies
from qviz.numeric.diagnose.gain import RemedyEstimate
from qviz.numeric.diagnose.memo import RECENT_ESTIMATES
from qviz.numeric.diagnose.rules import CAUSE_COLOURS, RULES, Cause, Context, Prescription

_UNMEASURED = "not measured: pass data= to diagnose to measure the remedies on {} alone"
#: The most a finding's severity shows (dB below the threshold), so a graph's scale stays useful.
MAX_SEVERITY = 60.0


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One poor layer: its cause, the evidence, the prescription and how poor it is.

    Attributes:
        node: the operator (node name, as in the report and the graphs).
        op: its ATen op.
        cause: the :class:`Cause`.
        evidence: the numbers behind it, as ``(name, value)`` pairs (``.facts`` as a dict).
        prescription: what to do, and which qviz function does it.
        sqnr: dB, the layer's figure that fell below the threshold (``figure`` names it).
        figure: ``"local_sqnr"``, ``"local_worst_token_sqnr"`` or ``"local_worst_channel_sqnr"``.
        severity: dB below the threshold (at most ``MAX_SEVERITY``).
        remedies: with data, every candidate remedy measured on this operator alone, best first
            (:func:`~qviz.numeric.diagnose.choice.rank`); ``prescription`` is the first.
        suggested: what the cause alone prescribes (the rule's prescription, before any
            measurement; it is among ``remedies``).
        local_db: the figure the remedies must raise, measured on the operator alone (NaN
            without data): its local SQNR when that is below the threshold, else ``figure``
            (``remedies[0].figure`` names it); it equals the report's.
        verdict: one line on what the measurements support, or that no quantized remedy pays.

    Example:
        >>> f = Finding(node="mul", op="mul", cause=Cause.DEGENERATE, evidence=(("zeros_after",
        ...     1.0),),
        ...             prescription=Prescription("keep mul in float",
        ...     "qviz.numeric.fallback"), sqnr=0.0,
        ...             figure="local_sqnr", severity=25.0)
        >>> f.facts["zeros_after"], str(f.cause)
        (1.0, 'degenerate range')
    """

    node: str
    op: str
    cause: Cause
    evidence: tuple[tuple[str, Any], ...]
    prescription: Prescription
    sqnr: float
    figure: str
    severity: float
    remedies: tuple[RemedyEstimate, ...] = ()
    local_db: float = math.nan
    verdict: str = ""
    suggested: Prescription | None = None

    def __post_init__(self) -> None:
        if self.suggested is None:
            object.__setattr__(self, "suggested", self.prescription)

    @property
    def best_gain_db(self) -> float | None:
        """The first remedy's measured gain on the operator alone (None: not measured)."""
        return self.remedies[0].gain_db if self.remedies else None

    @property
    def remedies_df(self) -> Any:
        """The measured remedies, best first: name, gain_db, before_db, after_db (``inf``:
        float), figure, action, function, how (empty without data)."""
        import pandas as pd

        columns = ["name", "gain_db", "before_db", "after_db", "figure", "action", "function",
                   "how"]  # fmt: skip
        rows = [
            {"name": r.name, "gain_db": r.gain_db, "before_db": r.before_db,
             "after_db": r.after_db, "figure": r.figure, "action": r.prescription.action,
             "function": r.prescription.function, "how": r.how}
            for r in self.remedies
        ]  # fmt: skip
        return pd.DataFrame(rows, columns=columns)

    @property
    def facts(self) -> dict[str, Any]:
        """The evidence as a dict."""
        return dict(self.evidence)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Diagnosis:
    """Every poor layer's :class:`Finding`, worst first, and the model it was made for.

    Attributes:
        findings: one per poor layer, the most severe first.
        threshold_db: a layer is poor below this SQNR (local, worst token or worst channel).
        fingerprint, float_fingerprint: the models the report measured (``qviz.viz.graph``
            refuses to draw the diagnosis on another).

    Example:
        >>> d = Diagnosis((), 25.0)
        >>> len(d), d.for_node("conv2d"), d
        (0, (), Diagnosis(no layer below 25 dB))
    """

    findings: tuple[Finding, ...]
    threshold_db: float
    fingerprint: Fingerprint | None = None
    float_fingerprint: Fingerprint | None = None

    #: The columns ``qviz.viz.graph(metrics=diagnosis, metric_column=...)`` draws as classes.
    CATEGORY_COLUMNS = ("cause",)

    def __iter__(self) -> Iterator[Finding]:
        return iter(self.findings)

    def __len__(self) -> int:
        return len(self.findings)

    def for_node(self, name: str) -> tuple[Finding, ...]:
        """The findings of one node (empty when it is not poor)."""
        return tuple(f for f in self.findings if f.node == name)

    @property
    def df(self) -> Any:
        """One row per finding: node, op, cause, severity, figure, sqnr, action, function,
        gain_db (the prescription's measured gain on the operator alone; None without data),
        verdict, evidence (``name=value`` text)."""
        import pandas as pd

        columns = ["node", "op", "cause", "severity", "figure", "sqnr", "action", "function",
                   "gain_db", "verdict", "evidence"]  # fmt: skip
        rows = [
            {"node": f.node, "op": f.op, "cause": f.cause.value, "severity": f.severity,
             "figure": f.figure, "sqnr": f.sqnr, "action": f.prescription.action,
             "function": f.prescription.function, "gain_db": f.best_gain_db,
             "verdict": f.verdict,
             "evidence": ", ".join(f"{k}={_fmt(v)}" for k, v in f.evidence)}
            for f in self.findings
        ]  # fmt: skip
        return pd.DataFrame(rows, columns=columns)

    def graph_metric(self) -> tuple[dict[str, float], str, bool, tuple[float, float]]:
        """What ``qviz.viz.graph(converted, metrics=diagnosis)`` draws: each poor layer's
        severity (dB below the threshold), lower is better, on a fixed 0 to 30 dB scale; the
        cause is in :attr:`df` and the HTML view.

        Example:
            >>> Diagnosis((), 25.0).graph_metric()
            ({}, 'diagnosis severity (dB below 25 dB)', False, (0.0, 30.0))
        """
        values = {f.node: f.severity for f in self.findings}
        name = f"diagnosis severity (dB below {self.threshold_db:g} dB)"
        return values, name, False, (0.0, 30.0)

    def graph_categories(self, column: str = "cause") -> tuple[dict[str, str], str, dict[str, str]]:
        """What ``qviz.viz.graph(converted, metrics=diagnosis, metric_column="cause")`` draws:
        each poor layer's cause, the name the legend gives it, and each cause's colour.

        Example:
            >>> Diagnosis((), 25.0).graph_categories()[:2]
            ({}, 'cause')
        """
        if column not in self.CATEGORY_COLUMNS:
            raise ConfigError(f"graph_categories({column!r}): give one of {self.CATEGORY_COLUMNS}")
        causes = {f.node: f.cause.value for f in self.findings}
        return causes, column, {c.value: colour for c, colour in CAUSE_COLOURS.items()}

    def summary(self) -> str:
        if not self.findings:
            return f"no layer below {self.threshold_db:g} dB"
        causes: dict[str, int] = {}
        for f in self.findings:
            causes[f.cause.value] = causes.get(f.cause.value, 0) + 1
        parts = ", ".join(f"{n} {c}" for c, n in causes.items())
        return f"{len(self.findings)} layer(s) below {self.threshold_db:g} dB: {parts}"

    def __repr__(self) -> str:
        return f"Diagnosis({self.summary()})"

    def _repr_html_(self) -> str:
        """The notebook view (:func:`qviz.numeric.diagnose.view.diagnosis_html`)."""
        from qviz.numeric.diagnose.view import diagnosis_html

        return diagnosis_html(self)


class _ChannelRanges(Interpreter):
    """Runs the prepared model with its observers skipped (they see nothing, change nothing)
    and keeps the running per-channel absolute maximum of the wanted nodes' outputs."""

    def __init__(self, gm: GraphModule, observers: set[str], wanted: set[str]) -> None:
        super().__init__(gm)
        self.observers, self.wanted = observers, wanted
        self.amax: dict[str, torch.Tensor] = {}

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target in self.observers:
            return args[0]
        return super().call_module(target, args, kwargs)

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if n.name in self.wanted and isinstance(result, torch.Tensor) and result.dim() >= 2:
            axis = 1 if "conv" in op_name(n) or result.dim() >= 4 else result.dim() - 1
            dims = tuple(d for d in range(result.dim()) if d != axis)
            amax = result.detach().abs().float().amax(dims).cpu()
            old = self.amax.get(n.name)
            self.amax[n.name] = amax if old is None or old.shape != amax.shape else (
                torch.maximum(old, amax))  # fmt: skip
        return result


def _activations(ctx: Context, poor: list[str]) -> set[str]:
    """The tensors whose channel ranges the rules read: each poor layer's output and, for a
    conv / linear, its input."""
    wanted = set(poor)
    for name in poor:
        node = ctx.nodes.get(name)
        if node is not None and node.args and any(k in op_name(node) for k in ("conv", "linear")):
            src = ctx.source(node.args[0])
            if src is not None:
                wanted.add(src.name)
    return wanted


def _measure_channels(ctx: Context, poor: list[str], batches: list[Any]) -> None:
    """Fill ``ctx.channel_amax`` from ``batches``."""
    run = _ChannelRanges(ctx.prepared, set(ctx.observers), _activations(ctx, poor))
    with torch.no_grad():
        for index, batch in enumerate(batches):
            run.run(*bind_batch(ctx.prepared, batch, f"diagnose: batch {index}").args)
    ctx.channel_amax = run.amax


def _worst_figure(row: dict[str, Any]) -> tuple[str, float]:
    """The lowest of the row's local, worst-token and worst-channel SQNR (cumulative when the
    layer has no local figure)."""
    figures = [(row.get(k), k) for k in ("local_sqnr", "local_worst_token_sqnr",
                                          "local_worst_channel_sqnr")]  # fmt: skip
    known = [(float(v), k) for v, k in figures if v is not None and not math.isnan(float(v))]
    if not known and row.get("cumulative_sqnr") is not None:
        known = [(float(row["cumulative_sqnr"]), "cumulative_sqnr")]
    value, key = min(known) if known else (math.nan, "local_sqnr")
    return key, value


def _check(report: Any, prepared: Any, data: Any, numbers: dict[str, Any]) -> None:
    if not hasattr(report, "df") or "local_sqnr" not in getattr(report.df, "columns", ()):
        raise ConfigError(
            f"diagnose(report=...) takes the NumericReport of qviz.numeric.compare, got "
            f"{type(report).__name__}"
        )
    check_stage(prepared, Stage.PREPARED, where="diagnose", arg="prepared")
    observers = [m for m in prepared.modules() if is_observer(m)]
    if observers and all(saw_no_data(m) for m in observers):
        raise CalibrationError(
            "diagnose(prepared=...): no observer of this prepared model has seen data: pass the "
            "calibrated prepared model the report's quantized model was converted from"
        )
    check_converted_from(report, prepared, "diagnose(prepared=...)")
    for key, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"diagnose({key}={value!r}): give a positive number")
    names = {n.name for n in prepared.graph.nodes}
    missing = [n for n in report.df["node"] if n not in names]
    if missing:
        raise ConfigError(
            f"diagnose: the report's operator {missing[0]!r} is not in the prepared model "
            f"({closest_names(missing[0], sorted(names))}); pass the calibrated prepared model "
            f"the report's quantized model was converted from"
        )


def diagnose(
    report: Any,
    prepared: GraphModule,
    *,
    data: Any = None,
    threshold_db: float = 25.0,
    outlier_factor: float = 10.0,
    max_batches: int = 8,
    min_gain_db: float = 0.5,
    progress: bool = True,
    estimates: Any = None,
) -> Diagnosis:
    """Classify each poor layer of ``report`` by cause, with evidence and a prescription.

    Args:
        report: the :class:`~qviz.numeric.NumericReport` of :func:`qviz.numeric.compare`.
        prepared: the calibrated prepared model the report's quantized model was converted from
            (its plan and observers hold the statistics read here). It is not changed.
        data: optional batches (as for :func:`qviz.calibrate`): the prepared model's float
            computation runs on up to ``max_batches`` of them, observers skipped, to measure
            the per-channel ranges of the poor layers' activations (activation outliers are
            found only with data).
        threshold_db: a layer is poor when its local SQNR, worst token or worst channel SQNR
            is below this.
        outlier_factor: the ``max / median`` channel spread (and the range ratio of a shared
            group's members) counted as an outlier.
        max_batches: at most this many batches of ``data``.
        min_gain_db: with data, a quantized remedy is prescribed only when it raises the
            operator's own local SQNR by at least this much (measured on the operator alone,
            :mod:`qviz.numeric.diagnose.gain`); when none does, the finding says so and
            prescribes float.
        progress: show a progress bar while the remedies are measured.
        estimates: remedy estimates kept by the exact content they were measured on
            (:func:`~qviz.numeric.diagnose.memo.content_key`): a layer where none of it changed
            takes its estimates from there, bit for bit, instead of measuring them again. None:
            :data:`~qviz.numeric.diagnose.memo.RECENT_ESTIMATES`; ``{}``: measure everything.

    Returns:
        A :class:`Diagnosis`: one :class:`Finding` per poor layer, the most severe first.

    Raises:
        ConfigError: not a report, a model that is not prepared (or lacks a plan), a report of
            another model (an operator the prepared model lacks), or a non-positive number.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> data = [torch.randn(8, 16) for _ in range(2)]
        >>> gm = qviz.export(torch.nn.Linear(16, 4).eval(), (data[0],))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), data, progress=False)
        >>> report = qviz.numeric.compare(gm, qviz.convert_pt2e(prepared), data, progress=False)
        >>> diagnose(report, prepared, data=data)
        Diagnosis(no layer below 25 dB)
    """
    numbers = {"threshold_db": threshold_db, "outlier_factor": outlier_factor,
               "max_batches": max_batches, "min_gain_db": min_gain_db}  # fmt: skip
    _check(report, prepared, data, numbers)
    ctx = _context(report, prepared, threshold_db, outlier_factor)
    worst = {name: _worst_figure(row) for name, row in ctx.rows.items()}
    poor = [name for name, (_, value) in worst.items() if value < threshold_db]
    if data is not None:  # finite, at least one batch: checked whether or not a layer is poor
        data = measured_batches(data, "diagnose", max_batches=max_batches)
        if poor:
            _measure_channels(ctx, poor, data)
    findings = [_finding(ctx, name, *worst[name]) for name in poor]
    kept = RECENT_ESTIMATES if estimates is None else estimates
    findings = _with_remedies(ctx, findings, data, float(min_gain_db), progress, kept)
    findings.sort(key=lambda f: -f.severity)
    return Diagnosis(tuple(findings), float(threshold_db), getattr(report, "fingerprint", None),
                     getattr(report, "float_fingerprint", None))  # fmt: skip


def _context(report: Any, prepared: GraphModule, threshold_db: float, outlier_factor: float
             ) -> Context:  # fmt: skip
    """What every rule reads: the report's rows by node, the prepared model, its plan."""
    rows = {str(r["node"]): r for r in report.df.to_dict("records")}
    plan = require_plan(prepared, "diagnose")
    return Context(rows=rows, prepared=prepared, plan=plan, threshold_db=float(threshold_db),
                   outlier_factor=float(outlier_factor))  # fmt: skip


def _with_remedies(
    ctx: Context, findings: list[Finding], data: Any, min_gain_db: float, progress: bool,
    estimates: Any,
) -> list[Finding]:  # fmt: skip
    """``findings`` with their remedies measured on ``data`` (None: each says it was not)."""
    if data is None:
        return [dataclasses.replace(f, verdict=_UNMEASURED.format(f.node)) for f in findings]
    if not findings:
        return findings
    found = {f.node: (f.prescription, _gain_figure(ctx.rows[f.node], f, ctx.threshold_db))
             for f in findings}  # fmt: skip
    measured = measure_remedies(ctx, found, data, min_gain_db, progress, estimates)
    return [_measured(f, measured.get(f.node)) for f in findings]


def _gain_figure(row: dict[str, Any], finding: Finding, threshold_db: float) -> str:
    """What a remedy must raise: the whole tensor's local SQNR when it is below the threshold
    (a worst channel of a ruined layer can stay poor while the layer is repaired), else the
    token's or channel's figure that fell below it."""
    whole = row.get("local_sqnr")
    if whole is not None and not math.isnan(float(whole)) and float(whole) < threshold_db:
        return "local_sqnr"
    return finding.figure


def _measured(finding: Finding, measured: Any) -> Finding:
    """``finding`` with its remedies measured: the best one prescribed."""
    if measured is None:
        return finding
    before, ranked, verdict = measured
    best = ranked[0].prescription if ranked else finding.prescription
    return dataclasses.replace(finding, prescription=best, remedies=ranked, local_db=before,
                               verdict=verdict)  # fmt: skip


def _finding(ctx: Context, name: str, figure: str, value: float) -> Finding:
    """The first rule that explains the poor layer ``name`` (rounding explains any)."""
    row = ctx.rows[name]
    severity = min(ctx.threshold_db - value, MAX_SEVERITY)
    cause, found = next((c, f) for c, rule in RULES if (f := rule(row, ctx)) is not None)
    return Finding(
        node=name,
        op=str(row.get("op", "")),
        cause=cause,
        evidence=found[0],
        prescription=found[1],
        sqnr=value,
        figure=figure,
        severity=severity,
    )
