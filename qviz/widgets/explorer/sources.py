"""What a :class:`~qviz.widgets.explorer.CalibrationExplorer` explores: the HistogramObservers
of a prepared PT2E model, or the calibrated TensorQuantizers of a quant_nn model.

Both sources answer the same questions, so the explorer and its view are one piece of code:
which names to list, where a name starts (method, percentile, bits), the histogram data for a
state, how to make a quantizer use a method (the engine's
:func:`~qviz.engine.pt2e.range_choice.choose_range`
for observers, :meth:`~qviz.engine.tensor.tensor_quantizer.TensorQuantizer.load_calib_amax` for
TensorQuantizers) and which choices the engine holds.

A TensorQuantizer with a HistogramCalibrator shows its |x| histogram and every calibrator
method, with a dotted line at its loaded amax; one with a MaxCalibrator (the default for
weights) keeps only the running max, so it shows that one range and no histogram.

Example:
    >>> import torch, qviz
    >>> from qviz.engine import quant_nn
    >>> from qviz.engine.tensor.descriptor import QuantDescriptor
    >>> layer = quant_nn.QuantLinear(4, 2, quant_desc_input=QuantDescriptor(calib_method="mse"))
    >>> qviz.calibrate_quantizers(layer, [torch.randn(64, 4)], method="mse", progress=False)
    ... # doctest: +ELLIPSIS
    quantizer ...
    >>> source = QuantizerSource(layer)
    >>> source.names, source.start("_input_quantizer")
    (['_input_quantizer', '_weight_quantizer'], ('mse', 99.99, 8))
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from qviz.engine.graph.capture import export
from qviz.engine.graph.stage import Stage, model_stage
from qviz.engine.observers import HistogramObserver
from qviz.engine.pt2e.plan import plan_of, require_plan
from qviz.engine.pt2e.range_choice import choose_range
from qviz.engine.qparams import bits_of_range, quant_range, symmetric_scale
from qviz.engine.tensor.calib import HistogramCalibrator, MaxCalibrator
from qviz.engine.tensor.records import quantizer_records
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import ConfigError, closest_names
from qviz.viz.ranges.histograms import HistogramData, QuantGrid, histogram_data

#: Every method the explorer offers (a source offers those it can compute).
METHODS = ("max", "percentile", "entropy", "mse", "l2")
_CALIBRATOR_METHODS = ("max", "percentile", "entropy", "mse")
_DEFAULT_PERCENTILE = 99.99

Cached = Callable[[tuple, Callable[[], HistogramData]], HistogramData]


def merge(parts: list[HistogramData]) -> HistogramData:
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


def label_of(observer: str, members: list[str]) -> str:
    """Dropdown text: the observer and the first tensor it observes.

    Example:
        >>> label_of("activation_post_process_3", ["relu_2", "relu_2 -> max_pool2d"])
        'activation_post_process_3: relu_2 (+1)'
    """
    more = f" (+{len(members) - 1})" if len(members) > 1 else ""
    return f"{observer}: {members[0]}{more}" if members else observer


def _bits(obs: HistogramObserver) -> int:
    return bits_of_range(obs.quant_min, obs.quant_max)


class PlanSource:
    """The HistogramObservers of a model from :func:`qviz.prepare_pt2e` (read from its plan)."""

    methods = METHODS
    choice_label = "user choice"
    no_choice = "no user choice yet"
    redraw_after_choice = False  # the markers say the sharing group, not the range

    def __init__(self, model: Any) -> None:
        plan = plan_of(model)
        if plan is None:
            raise ConfigError(
                f"CalibrationExplorer needs a calibrated model from qviz.prepare_pt2e (with "
                f".plan) or a calibrated model of quant_nn layers (TensorQuantizers), got "
                f"{type(model).__name__}"
            )
        self.model = model
        self.names = [
            g.observer
            for g in plan.groups
            if isinstance(getattr(model, g.observer, None), HistogramObserver)
        ]
        if not self.names:
            raise ConfigError("CalibrationExplorer: this model has no HistogramObserver")

    def start(self, name: str) -> tuple[str, float, int]:
        """``(method, percentile, num_bits)`` the observer uses now."""
        obs = self.model.get_submodule(name)
        return obs.method, float(obs.percentile), _bits(obs)

    def resolve(self, name: str) -> str:
        """The observer of ``name``: an observer's module name, or a tensor it observes."""
        if name in self.names:
            return name
        producer, _, consumer = (s.strip() for s in name.partition("->"))
        try:
            group = self._current().group_of(producer, consumer or None)
        except ConfigError:
            raise ConfigError(
                f"{name!r} is neither a HistogramObserver ({', '.join(self.names)}) nor a "
                f"tensor the plan observes"
            ) from None
        if group.observer not in self.names:
            raise ConfigError(
                f"{name!r} is observed by {group.observer}, a "
                f"{type(self.model.get_submodule(group.observer)).__name__}: only "
                f"HistogramObservers keep a histogram to explore"
            )
        return group.observer

    def data(self, st: Any, cached: Cached) -> HistogramData:
        """The histogram and every method's row for the state ``st``."""
        obs = self.model.get_submodule(st.observer)
        if obs.calibrator is None or not obs.calibrator.num_batches:
            return cached((st.observer, "own"), lambda: histogram_data(obs))
        source = obs if st.num_bits == _bits(obs) else obs.calibrator.with_num_bits(st.num_bits)
        parts = []
        if st.num_bits == _bits(obs) and (obs.switchable or obs.method == "l2"):
            key = (st.observer, st.num_bits, "l2", None)
            parts.append(cached(key, lambda: histogram_data(obs, methods=("l2",))))
        for m in _CALIBRATOR_METHODS:
            pct = st.percentile if m == "percentile" else None
            parts.append(
                cached(
                    (st.observer, st.num_bits, m, pct),
                    lambda m=m, pct=pct: histogram_data(source, methods=(m,), percentile=pct),
                )
            )
        return merge(parts)

    def choose(self, st: Any, names: list[str] | None) -> list[Any]:
        """Make the observers ``names`` (None: every HistogramObserver) use ``st``'s method."""
        obs = self.model.get_submodule(st.observer)
        if st.num_bits != _bits(obs):
            raise ConfigError(
                f"{st.observer} quantizes to {_bits(obs)} bits (its spec's range); "
                f"num_bits={st.num_bits} only explores: set num_bits back to {_bits(obs)}, "
                f"or change the range with the AnnotationEditor"
            )
        pct = st.percentile if st.method == "percentile" else None
        return choose_range(self.model, st.method, observers=names, percentile=pct)

    def choices(self) -> dict[str, str]:
        """``{observer: method}`` for every range the user chose (read from the plan)."""
        return {g.observer: g.choice for g in self._current().groups if g.choice}

    def overrides(self) -> dict[str, dict[str, Any]]:
        """The choices as OverrideQuantizer overrides (see ``CalibrationExplorer.overrides``)."""
        plan = self._current()
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

    def options(self) -> list[tuple[str, str]]:
        """Dropdown entries ``(label, observer)``: the observer and what it observes."""
        groups = {g.observer: g for g in self._current().groups}
        return [(label_of(n, [str(m) for m in groups[n].members]), n) for n in self.names]

    def graph_model(self) -> Any:
        """The graph module to draw."""
        return self.model

    def _current(self) -> Any:
        """The model's plan now (a choice replaces it: :func:`choose_range`)."""
        return require_plan(self.model, "CalibrationExplorer")


def _method_of(amax_method: str | None) -> tuple[str | None, float | None]:
    """``"percentile 99.9"`` -> ``("percentile", 99.9)``; ``"entropy"`` -> ``("entropy", None)``."""
    if not amax_method:
        return None, None
    method, _, pct = amax_method.partition(" ")
    return method, float(pct) if pct else None


class QuantizerSource:
    """The calibrated TensorQuantizers of a quant_nn model (enabled, with statistics).

    Args:
        model: a model of quant_nn layers after calibration (``qviz.calibrate_quantizers`` or
            the calibration recipe by hand).
        example_inputs: inputs to export the model with, to draw its graph (None: no graph).
    """

    methods = _CALIBRATOR_METHODS
    choice_label = "amax from"
    no_choice = "amax not computed by a calibration method (set by hand, or loaded)"
    redraw_after_choice = True  # the markers say the amax

    def __init__(self, model: nn.Module, example_inputs: tuple[Any, ...] | None = None) -> None:
        self.model = model
        self.example_inputs = example_inputs
        enabled = {r.name for r in quantizer_records(model) if r.enabled}
        self.quantizers = {
            name: tq
            for name, tq in model.named_modules()
            if name in enabled and tq.calibrator.num_batches
        }
        if not self.quantizers:
            raise ConfigError(
                f"CalibrationExplorer: no enabled TensorQuantizer of this "
                f"{type(model).__name__} has calibration statistics: calibrate it first "
                f"(qviz.calibrate_quantizers(model, data, method='entropy'))"
            )
        self.names = list(self.quantizers)

    def start(self, name: str) -> tuple[str, float, int]:
        """``(method, percentile, num_bits)``: the method that picked its amax, if known."""
        tq = self.quantizers[name]
        method, pct = _method_of(tq.amax_method)
        if method is None:
            method = tq.quant_desc.calib_method
        if isinstance(tq.calibrator, MaxCalibrator) or method not in self.methods:
            method = "max"
        return method, pct if pct is not None else _DEFAULT_PERCENTILE, tq.num_bits

    def resolve(self, name: str) -> str:
        """The quantizer of ``name``: its module path or its graph marker (``tq/<path>@k``)."""
        path = re.sub(r"@\d+$", "", name.removeprefix("tq/"))
        if path in self.quantizers:
            return path
        tq = dict(self.model.named_modules()).get(path)
        if isinstance(tq, TensorQuantizer):
            off = tq.facts()["disabled"] or not tq.facts()["quant"]
            why = "is disabled" if off else "has seen no calibration data"
            raise ConfigError(f"TensorQuantizer {path!r} {why}: nothing to explore")
        raise ConfigError(
            f"{name!r} is not a calibrated TensorQuantizer of this model "
            f"({closest_names(path, self.names)})"
        )

    def data(self, st: Any, cached: Cached) -> HistogramData:
        """The histogram (or, for a MaxCalibrator, the max) and each method's row."""
        tq = self.quantizers[st.observer]
        calib = tq.calibrator
        if not isinstance(calib, HistogramCalibrator):
            return cached((st.observer, st.num_bits, "max"), lambda: _max_data(st, tq))
        source = calib if st.num_bits == calib.num_bits else calib.with_num_bits(st.num_bits)
        parts = []
        for m in self.methods:
            pct = st.percentile if m == "percentile" else None
            parts.append(
                cached(
                    (st.observer, st.num_bits, m, pct),
                    lambda m=m, pct=pct: histogram_data(source, methods=(m,), percentile=pct),
                )
            )
        return _with_amax(merge(parts), st, tq)

    def choose(self, st: Any, names: list[str] | None) -> list[Any]:
        """Load the amax ``st``'s method picks into the quantizers ``names`` (None: every one
        whose calibrator can compute the method); returns their records."""
        if names is None:
            histogram = st.method != "max"
            names = [
                n
                for n, tq in self.quantizers.items()
                if not histogram or isinstance(tq.calibrator, HistogramCalibrator)
            ]
        tq = self.quantizers[st.observer]
        if st.num_bits != tq.num_bits:
            raise ConfigError(
                f"{st.observer} quantizes to {tq.num_bits} bits (its QuantDescriptor); "
                f"num_bits={st.num_bits} only explores: set num_bits back to {tq.num_bits}"
            )
        options = {"percentile": st.percentile} if st.method == "percentile" else {}
        for name in names:
            quantizer = self.quantizers[name]
            if st.method != "max" and not isinstance(quantizer.calibrator, HistogramCalibrator):
                raise ConfigError(
                    f"{name} keeps only the running max (MaxCalibrator), so only 'max' can be "
                    f"used: calibrate it with a histogram (qviz.calibrate_quantizers(model, "
                    f"data, method={st.method!r}) for inputs, weight_method= for weights)"
                )
            quantizer.load_calib_amax(st.method, **options)
        wanted = set(names)
        return [r for r in quantizer_records(self.model) if r.name in wanted]

    def choices(self) -> dict[str, str]:
        """``{quantizer: method}``: the method that computed each loaded amax (engine state)."""
        return {n: tq.amax_method for n, tq in self.quantizers.items() if tq.amax_method}

    def overrides(self) -> dict[str, dict[str, Any]]:
        raise ConfigError(
            "overrides are OverrideQuantizer settings for the PT2E flow; a quant_nn model keeps "
            "its chosen amax in its TensorQuantizers: save model.state_dict() instead"
        )

    def options(self) -> list[tuple[str, str]]:
        """Dropdown entries ``(label, quantizer)``: the path and its calibrator."""
        return [
            (f"{n} ({type(tq.calibrator).__name__.removesuffix('Calibrator').lower()})", n)
            for n, tq in self.quantizers.items()
        ]

    def graph_model(self) -> Any:
        """The model exported with ``example_inputs`` (fresh: it shows the current amax)."""
        if self.example_inputs is None:
            return None
        return export(self.model, self.example_inputs)


def _with_amax(data: HistogramData, st: Any, tq: TensorQuantizer) -> HistogramData:
    """Title with the quantizer's name and a dotted line at its loaded amax (the table stars
    the method that computed it: :meth:`QuantizerSource.choices`)."""
    calib = tq.calibrator
    channel = " channel 0" if calib.axis is not None else ""
    title = f"{st.observer}{channel}: |x| of {calib.num_elements:,} values, {st.num_bits}-bit"
    lines = list(data.lines)
    if tq.amax is not None:
        amax = float(tq.amax.reshape(-1)[0])
        method = tq.amax_method or "set by hand"
        lines.append(("observer:range", amax, f"loaded amax={amax:.4g} ({method})"))
    return dataclasses.replace(data, title=title, lines=tuple(lines))


def _max_data(st: Any, tq: TensorQuantizer) -> HistogramData:
    """A MaxCalibrator's one range: no histogram, the running max of |x| (per channel: the
    largest), its scale at ``st.num_bits``; clipped is 0 by construction, SQNR unknown."""
    calib = tq.calibrator
    amax_all = calib.compute_amax("max").reshape(-1).float()
    amax = float(amax_all.max())
    _, qmax = quant_range(st.num_bits, unsigned=tq.unsigned)
    scale = float(symmetric_scale(amax, num_bits=st.num_bits, unsigned=tq.unsigned))
    row = {
        "method": "max", "amax": amax, "low": 0.0 if tq.unsigned else -amax, "high": amax,
        "scale": scale, "zero_point": 0, "clipped_fraction": 0.0, "clipped_least": 0.0,
        "clipped_most": 0.0, "sqnr_db": float("nan"), "current": False,
    }  # fmt: skip
    channels = amax_all.numel()
    note = "MaxCalibrator keeps only the running max of |x|: no histogram, one range"
    if channels > 1:
        note += (
            f"; {channels} channels, amax {float(amax_all.min()):.4g}..{amax:.4g} (row: largest)"
        )
    title = f"{st.observer}: max |x| of {calib.num_elements:,} values, {st.num_bits}-bit"
    return HistogramData(
        title=title,
        counts=torch.zeros(0, dtype=torch.float64),
        edges=torch.zeros(1, dtype=torch.float64),
        signed=False,
        lines=(("method:max", amax, f"max  amax={amax:.4g}"),),
        rows=(row,),
        grid=QuantGrid(scale, 0, 0 if tq.unsigned else -qmax, qmax),
        note=note,
    )


def source_for(model: Any, example_inputs: tuple[Any, ...] | None = None) -> Any:
    """The source exploring ``model``: TensorQuantizers if it holds any, else its plan.

    Raises:
        ConfigError: neither a prepared PT2E model with HistogramObservers nor a calibrated
            quant_nn model.
    """
    if isinstance(model, nn.Module) and any(
        isinstance(m, TensorQuantizer) for m in model.modules()
    ):
        return QuantizerSource(model, example_inputs)
    if isinstance(model, nn.Module) and model_stage(model) is Stage.CONVERTED:
        raise ConfigError(
            "CalibrationExplorer: calibrated_model must be a model from qviz.prepare_pt2e after "
            "qviz.calibrate, got a converted GraphModule (its HistogramObservers became "
            "quantize/dequantize ops with fixed scales, so no histogram is left to explore): pass "
            "the calibrated prepared model, before qviz.convert_pt2e (CalibrationExplorer("
            "prepared), then qviz.convert_pt2e(prepared))"
        )
    return PlanSource(model)
