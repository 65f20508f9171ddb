"""The user's calibration choices: which range an observer gives convert, recorded in the plan.

After calibration a HistogramObserver can pick its range by several methods (``"l2"``, ``"max"``,
``"percentile"``, ``"entropy"``, ``"mse"``) when it keeps the statistics for them (observers made
with ``switchable=True``, e.g. ``get_symmetric_quantization_config(switchable=True)``).
:func:`choose_range` sets the method of one observer, several, or all of them, and records the
choice in ``prepared.plan`` (``GroupRecord.choice``), so that the plan says which ranges a person
chose; :func:`qviz.convert_pt2e` then uses them.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), (torch.randn(8, 4),))
    >>> config = get_symmetric_quantization_config(switchable=True)
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    >>> prepared = qviz.calibrate(prepared, [torch.randn(8, 4)], progress=False)
    >>> chosen = choose_range(prepared, "entropy", observers=["activation_post_process_0"])
    >>> [g.choice for g in chosen]
    ['entropy']
    >>> prepared.plan.groups[0].choice, prepared.plan.groups[2].choice
    ('entropy', None)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qviz.engine.observers import HistogramObserver, parse_histogram_method
from qviz.engine.pt2e.plan import GroupRecord, plan_of, require_plan, set_plan
from qviz.errors import ConfigError


def _groups(prepared: Any, observers: Sequence[str] | str | None) -> list[GroupRecord]:
    plan = plan_of(prepared)
    if plan is None:
        raise ConfigError(
            f"choose_range needs a prepared model (qviz.prepare_pt2e) with .plan, got "
            f"{type(prepared).__name__}"
        )
    histogram = [
        g for g in plan.groups if isinstance(getattr(prepared, g.observer, None), HistogramObserver)
    ]
    if observers is None:
        return histogram
    names = [observers] if isinstance(observers, str) else list(observers)
    by_name = {g.observer: g for g in histogram}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ConfigError(
            f"choose_range: {unknown} are not HistogramObserver groups of this model; they are "
            f"{sorted(by_name)}"
        )
    return [by_name[n] for n in names]


def choose_range(
    prepared: Any,
    method: str,
    *,
    observers: Sequence[str] | str | None = None,
    percentile: float | None = None,
) -> list[GroupRecord]:
    """Make ``observers`` (default: every HistogramObserver) pick their range by ``method``.

    Args:
        prepared: a calibrated model from :func:`qviz.prepare_pt2e` (changed in place: its
            observers' ``method`` and its ``plan``).
        method: ``"l2"``, ``"max"``, ``"percentile"``, ``"entropy"`` or ``"mse"``.
        observers: observer module names (``plan.groups[i].observer``), or None for all.
        percentile: for ``method="percentile"``, the share of ``|x|`` kept unclipped.

    Returns:
        The updated group records, in the order given.

    Raises:
        ConfigError: not a prepared model, an unknown observer or method, or an observer that
            did not keep what ``method`` needs (create it with ``switchable=True``). Nothing is
            changed when any observer refuses.
    """
    method = parse_histogram_method(method)
    groups = _groups(prepared, observers)
    modules = [getattr(prepared, g.observer) for g in groups]
    previous = [(m.method, m.percentile) for m in modules]
    try:
        for module in modules:
            if percentile is not None:
                module.percentile = _percentile(percentile)
            module.method = method
    except ConfigError:
        for module, (old_method, old_pct) in zip(modules, previous, strict=True):
            module.method, module.percentile = old_method, old_pct  # all or nothing
        raise
    text = method if method != "percentile" else f"percentile {modules[0].percentile:g}"
    plan = require_plan(prepared).with_choices({g.group: text for g in groups})
    set_plan(prepared, plan)
    chosen = {g.group: g for g in plan.groups}
    return [chosen[g.group] for g in groups]


def _percentile(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 100:
        raise ConfigError(f"percentile must be a number in (0, 100], got {value!r}")
    return float(value)
