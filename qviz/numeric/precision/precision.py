"""Which layers need more bits: the cheapest mixed-precision assignment that meets an accuracy
target, confirmed by full evaluations, with the trade-off it was chosen from.

:func:`search_precision` first evaluates every unit at its cheapest candidate in full: when that
meets the target there is nothing to search. Otherwise it runs three steps:

1. **Screen.** Every unit (a weighted layer with the activations that feed it,
   :mod:`qviz.numeric.precision.units`) is measured at each candidate precision, every other
   unit at its most expensive candidate (the *reference*; float when float is a candidate).
   Observers are calibrated once per candidate and copied into every variant that observes
   the same (:class:`~qviz.engine.pt2e.observer_reuse.ObserverReuse`).
2. **Estimate.** Quantization noise of independent layers adds, and so do small metric drops:
   an assignment's estimate is the reference's penalty plus each unit's screened extra. The
   Pareto front of cost against that estimate is exact for the estimate
   (:func:`~qviz.numeric.precision.front.pareto_front`).
3. **Confirm.** Front points are evaluated in full on ``data``, cheapest-first guesses
   corrected by what each evaluation measured against its estimate
   (:func:`~qviz.numeric.precision.front.next_probe`), until the cheapest point that meets the
   target sits next to one that does not (measured, or by its corrected estimate), or
   ``max_evaluations`` are spent.

Distributed (``group=``, as :func:`~qviz.numeric.sensitivity`): every data argument is this
rank's shard, each variant is calibrated and scored over all shards, and every rank makes the
same choices from the same merged figures. ``qviz.viz.graph(exported_model, metrics=result,
metric_column="precision")`` colours each layer of the graph by its precision.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> torch.manual_seed(0) and None
    >>> model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    >>> data = [torch.randn(32, 16) for _ in range(2)]
    >>> gm = qviz.export(model, (data[0],))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> result = search_precision(gm, q, data, min_sqnr=25.0, candidates=["w4a8", "w8a8"],
    ...                           progress=False)
    >>> result.met, set(result.assignment().values()) <= {"w4a8", "w8a8"}
    (True, True)
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from torch.fx import GraphModule

from qviz.engine import distributed
from qviz.engine.graph.fingerprint import fingerprint, known_origin
from qviz.engine.graph.inputs import checked_batches
from qviz.engine.graph.node_data import op_name
from qviz.engine.graph.stage import Stage, check_stage
from qviz.engine.pt2e.observer_reuse import ObserverReuse
from qviz.engine.quantizers.fallback import module_path
from qviz.engine.quantizers.override import OverrideQuantizer
from qviz.errors import ConfigError
from qviz.numeric.measure.progress import progress_bar
from qviz.numeric.precision.cost import Cost, parse_cost, unit_costs
from qviz.numeric.precision.front import next_probe, pareto_front
from qviz.numeric.precision.result import Evaluation, FrontPoint, PrecisionResult, Screened
from qviz.numeric.precision.units import Precision, Unit, assignment_overrides, find_units
from qviz.numeric.variants.variants import (
    VariantScorer,
    prepare_variant,
    quantize_variant,
    variant_batches,
)

DEFAULT_CANDIDATES = ("w4a8", "w8a8", "w8a16", "float")
_WHERE = "search_precision"


@dataclass(frozen=True)
class _Target:
    """The target as a penalty (lower is better): the metric's drop from float, or output
    noise over signal power."""

    kind: str
    limit: float

    @classmethod
    def of(cls, metric: Any, max_drop: Any, min_sqnr: Any) -> _Target:
        if (max_drop is None) == (min_sqnr is None):
            raise ConfigError(
                "search_precision: give one target, max_drop= (the metric's largest drop from "
                "the float model's, with metric=) or min_sqnr= (dB of the outputs against float)"
            )
        if max_drop is not None:
            if metric is None:
                raise ConfigError(
                    "search_precision(max_drop=...): a drop of what? pass metric=(float_out, "
                    "quant_out, target) -> float, or use min_sqnr= instead"
                )
            return cls("metric", _number(max_drop, "max_drop"))
        return cls("output_sqnr", _number(min_sqnr, "min_sqnr"))

    def penalty(self, sqnr: float, metric: float | None, float_metric: float | None) -> float:
        if self.kind == "metric":
            return float(float_metric or 0.0) - float(metric or 0.0)
        return 0.0 if sqnr == math.inf else 10 ** (-sqnr / 10)

    @property
    def allowed(self) -> float:
        return self.limit if self.kind == "metric" else 10 ** (-self.limit / 10)

    def figure(self, penalty: float, float_metric: float | None) -> float:
        """A penalty as the figure the user reads: the metric, or the SQNR in dB."""
        if self.kind == "metric":
            return float(float_metric or 0.0) - penalty
        return math.inf if penalty <= 0 else -10 * math.log10(penalty)


def _confirmed(evaluations: int, passed: dict[int, float]) -> str:
    """Why the confirming stopped before its budget, beside its progress bar."""
    runs = f"{evaluations} evaluation{'' if evaluations == 1 else 's'}"
    if not passed:
        return f"the best front point misses the target, after {runs}"
    return f"confirmed point {min(passed)} after {runs}"


def _noise(sqnr: float) -> float:
    """Output noise power over signal power, from the SQNR in dB."""
    return 0.0 if sqnr == math.inf else 10 ** (-sqnr / 10)


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ConfigError(f"search_precision({name}={value!r}): give a number")
    return float(value)


def search_precision(
    exported_model: GraphModule,
    quantizer: Any,
    data: Any,
    *,
    metric: Callable[[Any, Any, Any], float] | None = None,
    max_drop: float | None = None,
    min_sqnr: float | None = None,
    candidates: Sequence[Any] = DEFAULT_CANDIDATES,
    cost: Any = "bops",
    layers: Sequence[str] | None = None,
    screening_data: Any = None,
    calibration_data: Any = None,
    max_evaluations: int = 8,
    progress: bool = True,
    group: Any = None,
) -> PrecisionResult:
    """The cheapest per-layer precisions whose model meets the target, confirmed in full.

    Args:
        exported_model: the float graph module from :func:`qviz.export` (not changed).
        quantizer: the base quantizer (its specs are the 8-bit starting point).
        data: evaluation batches (the target is confirmed on them).
        metric: ``metric(float_out, quant_out, target) -> float``, higher is better.
        max_drop: the metric's largest allowed drop from the float model's (with ``metric``).
        min_sqnr: or: the smallest allowed output SQNR in dB against the float model.
        candidates: precisions per layer: ``"w4a8"``, ``"w8a8"``, ``"w8a16"``, ``"float"`` ...
        cost: ``"bops"``, ``"size"`` or ``cost(layer, precision)``: see precision_cost.
        layers: the weighted layers to search over (default: all; others keep the base's).
        screening_data: batches each unit's options are measured on (default: ``data``).
        calibration_data: batches to calibrate on (default: ``data``).
        max_evaluations: the most full evaluations (the first guess included).
        progress: progress bars for the screening and the confirmation.
        group: a ``torch.distributed`` process group, or ``False``: see the module docstring.

    Returns:
        A :class:`~qviz.numeric.PrecisionResult`: ``.quantizer()`` reproduces the choice,
        ``.table()`` lists it, ``.plot()`` draws the front (module docstring: the graph).

    Raises:
        ConfigError: no target or two, a bad candidate, cost, layer or batch (each named).
        MeasurementError: an evaluated model's output SQNR or metric is not a number (outputs
            without a floating-point tensor, NaN in one output only, ...): nothing is decided
            on it.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> gm = qviz.export(torch.nn.Linear(8, 4).eval(), (torch.randn(16, 8),))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> search_precision(gm, q, [torch.randn(16, 8)], min_sqnr=60.0,
        ...                  progress=False).assignment()  # 60 dB: the layer in float
        {'linear': 'float'}
    """
    target = _Target.of(metric, max_drop, min_sqnr)
    setup = functools.partial(_setup, exported_model, quantizer, data, metric, candidates, cost,
                              layers, screening_data, calibration_data)  # fmt: skip
    out = distributed.sharded(setup, group, _WHERE, share=lambda _: None)
    with known_origin(exported_model):  # every variant's prepare: the float digest taken once
        search = _Search(out.result, target, out.shard.group, progress and out.shard.rank == 0)
        if not search.first_guess():
            search.screen()
            search.confirm(_positive(max_evaluations) - 1)
        return search.result()


def _positive(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"search_precision(max_evaluations={value!r}): give an int >= 1")
    return value


@dataclass(kw_only=True)
class _State:
    """What the setup hands the search (this rank's part)."""

    gm: GraphModule
    base: Any
    units: list[Unit]
    options: list[list[Precision]]
    costs: list[list[float]]
    cost_unit: str
    full: VariantScorer
    screen: VariantScorer
    calibration: list[Any]


def _setup(gm, quantizer, data, metric, candidates, cost, layers, screening_data, calibration_data,
           shard: distributed.Shard) -> _State:  # fmt: skip
    """The argument checks, the float passes and the base plan: this rank's first step."""
    import qviz

    check_stage(gm, Stage.FLOAT, where=_WHERE, arg="exported_model", exported=True)
    how = parse_cost(cost)
    precisions = _candidates(candidates)
    # finite; a shard may be empty
    batches, calibration = variant_batches(data, calibration_data, gm, _WHERE, allow_empty=True)
    full = VariantScorer(gm, batches, metric, _WHERE, shard)
    screen = full
    if screening_data is not None:
        checked = checked_batches(screening_data, gm, f"{_WHERE}(screening_data=...)")
        screen = VariantScorer(gm, checked, metric, _WHERE, shard)
    units = find_units(gm, qviz.prepare_pt2e(gm, quantizer).plan, layers)
    options = [_distinct(u, precisions) for u in units]
    unit_name = how.unit if isinstance(how, Cost) else "cost"
    costs = unit_costs(gm, units, options, how)
    return _State(
        gm=gm,
        base=quantizer,
        units=units,
        options=options,
        costs=costs,
        cost_unit=unit_name,
        full=full,
        screen=screen,
        calibration=calibration,
    )


def _candidates(candidates: Any) -> list[Precision]:
    items = [candidates] if isinstance(candidates, str | Precision) else list(candidates or ())
    parsed = list(dict.fromkeys(Precision.parse(c) for c in items))
    if not parsed:
        raise ConfigError(f"{_WHERE}(candidates=...): give at least one precision ('w8a8')")
    return parsed


def _distinct(unit: Unit, precisions: list[Precision]) -> list[Precision]:
    """The precisions that make different models of ``unit`` (a unit without quantized inputs
    has no activation choice): the cheapest of each kind."""
    seen: dict[str, Precision] = {}
    for p in sorted(precisions, key=lambda p: p.bits):
        seen.setdefault(repr(sorted(unit.overrides(p).items())), p)
    return list(seen.values())


class _Search:
    """The screening, the front and the confirmation over one setup (see the module
    docstring); every figure it decides on is the same on every rank."""

    def __init__(self, state: _State, target: _Target, group: Any, show: bool) -> None:
        self.s, self.target, self.group, self.show = state, target, group, show
        self.ref = [max(range(len(c)), key=lambda o: (c[o], o)) for c in state.costs]
        self.deltas = [[0.0] * len(opts) for opts in state.options]
        self.noise = [[0.0] * len(opts) for opts in state.options]  # output noise, always
        self.screened: list[Screened] = []
        self.evaluations: list[Evaluation] = []
        self.front: list[FrontPoint] = []
        self.model: GraphModule | None = None
        self.reuse = ObserverReuse()

    def _quantizer(self, choice: Sequence[int]) -> OverrideQuantizer:
        precisions = [self.s.options[u][o] for u, o in enumerate(choice)]
        return OverrideQuantizer(self.s.base, assignment_overrides(self.s.units, precisions))

    def _build(self, choice: Sequence[int]) -> GraphModule:
        with warnings.catch_warnings():  # every layer in float is an assignment like another
            warnings.filterwarnings("ignore", "convert_pt2e: the quantizer annotated nothing")
            return quantize_variant(self.s.gm, self._quantizer(choice), self.s.calibration,
                                    self.group, self.reuse, _WHERE)  # fmt: skip

    def _cost(self, choice: Sequence[int]) -> float:
        return sum(self.s.costs[u][o] for u, o in enumerate(choice))

    def _penalty(self, scorer: VariantScorer, score: tuple[float, float | None]) -> float:
        return self.target.penalty(score[0], score[1], scorer.float_metric)

    def _calibrate_once(self) -> None:
        """One calibration per candidate: every unit that has it at it, the rest at their
        reference; the variants after take copies of these observers."""
        wanted = dict.fromkeys(p for opts in self.s.options for p in opts if not p.is_float)
        for p in progress_bar(list(wanted), self.show, "calibrating each precision"):
            choice = [opts.index(p) if p in opts else r
                      for opts, r in zip(self.s.options, self.ref, strict=True)]  # fmt: skip
            prepare_variant(self.s.gm, self._quantizer(choice), self.s.calibration, self.group,
                            self.reuse, _WHERE)  # fmt: skip

    def screen(self) -> None:
        """Each unit at each of its options, the others at their reference: the penalty it
        adds to the reference's (never below 0)."""
        s = self.s
        if s.screen is not s.full:
            s.screen.score_float()
        self._calibrate_once()
        label = "the screening reference (every layer at its most expensive candidate)"
        score = s.screen.score(self._build(self.ref), label)
        self.reference = self._evaluation(None, self.ref, score, s.screen, screening=True)
        ref_penalty = self._penalty(s.screen, score)
        pairs = [(u, o) for u, opts in enumerate(s.options) for o in range(len(opts))]
        for u, o in progress_bar(pairs, self.show, "screening precisions"):
            choice = list(self.ref)
            choice[u] = o
            if o != self.ref[u]:
                label = f"{s.units[u].name} at {s.options[u][o].name} (screening)"
                score = s.screen.score(self._build(choice), label)
                self.deltas[u][o] = max(0.0, self._penalty(s.screen, score) - ref_penalty)
                self.noise[u][o] = max(0.0, _noise(score[0]) - _noise(self.reference.output_sqnr))
            else:
                score = (self.reference.output_sqnr, self.reference.metric)
            self.screened.append(Screened(s.units[u].name, s.options[u][o].name,
                                          s.costs[u][o], *score))  # fmt: skip
        self.ref_penalty = ref_penalty

    def _evaluation(self, point: int | None, choice: Sequence[int], score: Any,
                    scorer: VariantScorer, screening: bool = False) -> Evaluation:  # fmt: skip
        meets = self._penalty(scorer, score) <= self.target.allowed
        return Evaluation(
            point=point,
            cost=self._cost(choice),
            output_sqnr=score[0],
            metric=score[1],
            meets=meets,
            screening=screening,
        )

    def first_guess(self) -> bool:
        """Every unit at its cheapest option, evaluated in full before anything is screened:
        True (nothing to search) when it meets the target."""
        s = self.s
        s.full.score_float()
        self.cheapest = [min(range(len(c)), key=lambda o: (c[o], o)) for c in s.costs]
        model = self._build(self.cheapest)
        label = "the first guess (every layer at its cheapest candidate)"
        self.guess_score = s.full.score(model, label)
        self.guess = self._evaluation(None, self.cheapest, self.guess_score, s.full)
        if not self.guess.meets:
            return False
        figure = self.target.figure(self._penalty(s.full, self.guess_score), s.full.float_metric)
        names = tuple(s.options[u][o].name for u, o in enumerate(self.cheapest))
        self.front = [FrontPoint(self.guess.cost, figure, names)]
        self.guess = replace(self.guess, point=0)
        self.reference, self.chosen, self.model = None, 0, model
        return True

    def confirm(self, budget: int) -> None:
        """Evaluate front points in full, as :func:`next_probe` picks them."""
        s = self.s
        deltas = self._tie_broken()
        options = [list(zip(c, d, strict=True)) for c, d in zip(s.costs, deltas, strict=True)]
        points = pareto_front(options)
        estimates = [self.ref_penalty + p for _, p, _ in points]
        self.front = [
            FrontPoint(cost, self.target.figure(e, s.screen.float_metric),
                       tuple(s.options[u][o].name for u, o in enumerate(choice)))
            for (cost, _, choice), e in zip(points, estimates, strict=True)
        ]  # fmt: skip
        passed: dict[int, float] = {}
        failed: dict[int, float] = {}
        guess = next((i for i, p in enumerate(points) if list(p[2]) == self.cheapest), None)
        if guess is not None:  # the first guess is a front point: it failed there
            failed[guess] = self._penalty(s.full, self.guess_score)
            self.guess = replace(self.guess, point=guess)
        bar = progress_bar(range(budget), self.show, "confirming the front")
        for _ in bar:
            i = next_probe(estimates, self.target.allowed, passed, failed)
            if i is None:  # the answer is known: the budget need not be spent
                bar.stop(_confirmed(self._full_evaluations(), passed))
                break
            model = self._build(points[i][2])
            score = s.full.score(model, f"front point {i}")
            e = self._evaluation(i, points[i][2], score, s.full)
            self.evaluations.append(e)
            (passed if e.meets else failed)[i] = self._penalty(s.full, score)
            if e.meets and i == min(passed):
                self.model = model
        self.chosen = min(passed) if passed else None

    def _full_evaluations(self) -> int:
        """Full evaluations so far, counted as the result's summary counts them (the first
        guess included), so the progress bar and the summary say the same number."""
        done = (self.reference, self.guess, *self.evaluations)
        return sum(1 for e in done if e is not None and not e.screening)

    def _tie_broken(self) -> list[list[float]]:
        """A metric moves in steps (one sample of a few hundred), so many options screen at
        the same drop, 0 most often: the output noise each adds orders them, weighted so that
        all of it together stays below half the smallest step of the metric."""
        if self.target.kind != "metric":
            return self.deltas
        steps = [d for row in self.deltas for d in row if d > 0]
        step = min(steps, default=self.target.allowed) or 1e-3
        total = sum(max(row) for row in self.noise)
        weight = 0.5 * step / total if total > 0 else 0.0
        return [[d + weight * n for d, n in zip(drops, noise, strict=True)]
                for drops, noise in zip(self.deltas, self.noise, strict=True)]  # fmt: skip

    def result(self) -> PrecisionResult:
        s = self.s
        layers = tuple((n.name, op_name(n), module_path(n), u.name) for u in s.units
                       for n in s.gm.graph.nodes if n.name in u.layers)  # fmt: skip
        return PrecisionResult(
            target=self.target.kind,
            limit=self.target.limit,
            float_metric=s.full.float_metric,
            cost_unit=s.cost_unit,
            units=tuple(s.units),
            layers=layers,
            reference=tuple(opts[r].name for opts, r in zip(s.options, self.ref, strict=True)),
            screened=tuple(self.screened),
            front=tuple(self.front),
            evaluations=tuple(
                e for e in (self.reference, self.guess, *self.evaluations) if e is not None
            ),
            chosen=self.chosen,
            fingerprint=None if self.model is None else fingerprint(self.model),
            float_fingerprint=fingerprint(s.gm),
            base=s.base,
            model=self.model,
        )
