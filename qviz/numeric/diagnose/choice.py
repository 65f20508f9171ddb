"""Which remedies :func:`qviz.numeric.diagnose` tries for a poor operator, in which order, and
the one line it says about them.

Every finding's candidates are the rule's prescription, then what else could help that
operator (per-channel weights, bias correction, AdaRound, 16-bit activations, the output's range
by MSE, float); :mod:`qviz.numeric.diagnose.gain` measures each on the operator alone and
:func:`rank` puts first the quantized remedies that gain at least ``min_gain_db``, then those
not measured there, then float, then the ones that do not pay.

Example:
    >>> p = Prescription("learn fc's rounding", "qviz.engine.repair.adaround")
    >>> remedy_name(p)
    'AdaRound'
"""

from __future__ import annotations

import math
from typing import Any

import torch

from qviz.engine.graph.node_data import op_name
from qviz.engine.quantizers.override import normalize_overrides
from qviz.errors import QvizError
from qviz.numeric.diagnose.gain import (
    FALLBACK,
    OVERRIDE,
    REMEDY_NAMES,
    LocalOperator,
    RemedyEstimate,
    capture,
    estimate,
    local_sqnr,
    weight_edge,
)
from qviz.numeric.diagnose.memo import content_key
from qviz.numeric.diagnose.rules import Context, Prescription


def remedy_name(p: Prescription) -> str:
    """A short name for a prescription: its remedy, an override by what it changes.

    Example:
        >>> remedy_name(Prescription("", OVERRIDE, (("overrides", {"fc": {"dtype": "int16"}}),)))
        'int16 grid'
    """
    if p.function != OVERRIDE:
        return REMEDY_NAMES.get(p.function, p.function.rsplit(".", 1)[-1])
    changes = list(normalize_overrides(dict(p.arguments).get("overrides", {})).values())
    keys = set().union(*changes) if changes else set()
    if "scale" in keys:
        return "fixed range"
    if "qscheme" in keys and all("channel" in str(c.get("qscheme", "")) for c in changes):
        return "per-channel weights"
    if "dtype" in keys:
        return f"{sorted({str(c['dtype']) for c in changes if 'dtype' in c})[0]} grid"
    if "method" in keys:
        return f"{sorted({str(c['method']) for c in changes if 'method' in c})[0]} range"
    return "own observer" if "observer" in keys else "override"


def candidates(local: LocalOperator, found: Prescription) -> list[Prescription]:
    """The rule's prescription first, then what else could help this operator: per-channel
    weights (a per-tensor conv / linear weight), bias correction and AdaRound (a conv /
    linear), 16-bit activations, the output's range by MSE, and keeping it in float."""
    node, out = local.node.name, local.output
    options = [found]
    weight = weight_edge(local)
    if weight is not None:
        if "channel" not in str(getattr(weight.observer, "qscheme", "")):
            axis = 1 if "transpose" in op_name(local.node) else 0
            edit = {weight.key: {"qscheme": "per_channel_symmetric", "ch_axis": axis}}
            options.append(Prescription(f"quantize {weight.key.split(' -> ')[0]} per channel",
                                        OVERRIDE, (("overrides", edit),)))  # fmt: skip
        for action, fn in (
            (f"correct {node}'s bias", "bias_correction"),
            (f"learn {node}'s weight rounding (AdaRound)", "adaround"),
        ):
            options.append(Prescription(action, f"qviz.engine.repair.{fn}", (("nodes", (node,)),)))
    wide = [e for e in (*local.edges, out) if e is not None and not e.constant
            and getattr(e.observer, "dtype", None) in (torch.int8, torch.uint8)]  # fmt: skip
    if wide:
        edit = {e.key: {"dtype": "int16"} for e in wide}
        options.append(Prescription(f"16-bit grids for {node}'s activations", OVERRIDE,
                                    (("overrides", edit),)))  # fmt: skip
    if out is not None and type(out.observer).__name__ == "HistogramObserver":
        edit = {out.key: {"observer": "HistogramObserver", "method": "mse"}}
        options.append(Prescription(f"pick {out.key}'s range by MSE", OVERRIDE,
                                    (("overrides", edit),)))  # fmt: skip
    options.append(Prescription(f"keep {node} in float", FALLBACK,
                                (("nodes_or_module_names", node),)))  # fmt: skip
    unique: dict[tuple[str, str], Prescription] = {}
    for p in options:
        unique.setdefault((p.function, repr(p.arguments)), p)
    return list(unique.values())


def rank(estimates: list[RemedyEstimate], min_gain_db: float) -> tuple[RemedyEstimate, ...]:
    """Best first: remedies that keep the grid and gain at least ``min_gain_db`` (most first),
    those not measured on the operator alone (in the rules' order), those that widen the grid
    (int16, then float), then the rest (most gain first).

    Example:
        >>> p = Prescription("x", "qviz.engine.repair.adaround")
        >>> f = Prescription("keep fc in float", "qviz.numeric.fallback")
        >>> es = [RemedyEstimate(name="AdaRound", prescription=p, before_db=10.0, after_db=10.1,
        ...     how=""),
        ...       RemedyEstimate(name="float", prescription=f, before_db=10.0, after_db=math.inf,
        ...     how="")]
        >>> [e.name for e in rank(es, 0.5)], [e.name for e in rank(es, 0.05)]
        (['float', 'AdaRound'], ['AdaRound', 'float'])
    """

    def order(e: RemedyEstimate) -> tuple[int, float]:
        gain = e.gain_db
        if gain is None:
            return 1, 0.0
        if not e.widens and gain >= min_gain_db:
            return 0, -gain
        if e.widens:
            return 2, 0.0 if e.keeps_quantized else 1.0
        return 3, -gain

    return tuple(sorted(estimates, key=order))


def verdict(node: str, ranked: tuple[RemedyEstimate, ...], min_gain_db: float) -> str:
    """One line: which remedy the measurements support, or that none that keeps the grid pays.

    Example:
        >>> p = Prescription("x", "qviz.engine.repair.adaround")
        >>> f = Prescription("keep fc in float", "qviz.numeric.fallback")
        >>> verdict("fc", rank([RemedyEstimate(name="AdaRound", prescription=p, before_db=10.0,
        ...     after_db=10.1, how=""),
        ...                     RemedyEstimate(name="float", prescription=f, before_db=10.0,
        ...     after_db=math.inf, how="")], 0.5), 0.5)
        'no remedy that keeps fc on its grid gains 0.5 dB on it alone (AdaRound: +0.10 dB): float'
    """
    if not ranked:
        return f"not measured: no remedy could be tried on {node} alone"
    best = ranked[0]
    kept = [e for e in ranked if not e.widens and e.gain_db is not None]
    top = max(kept, key=lambda e: e.gain_db, default=None)
    if best.gain_db is not None and not best.widens and best.gain_db >= min_gain_db:
        return (f"{best.name}: {best.gain_db:+.1f} dB on {node} alone ({best.before_db:.1f} -> "
                f"{best.after_db:.1f} dB)")  # fmt: skip
    measured = (f"{top.name}: {top.gain_db:+.2f} dB" if top is not None else
                "none could be measured")  # fmt: skip
    if best.gain_db is None:
        return f"{best.name}: not measured on {node} alone ({best.how}); the others: {measured}"
    wider = ", ".join(
        e.name if e.gain_db == math.inf else f"{e.name} ({e.gain_db:+.1f} dB)"
        for e in ranked if e.widens
    )  # fmt: skip
    return (f"no remedy that keeps {node} on its grid gains {min_gain_db:g} dB on it alone "
            f"({measured}): {wider}")  # fmt: skip


def measure_remedies(
    ctx: Context, found: dict[str, tuple[Prescription, str]], batches: list[Any],
    min_gain_db: float, progress: bool, estimates: Any = None,
) -> dict[str, tuple[float, tuple[RemedyEstimate, ...], str]]:  # fmt: skip
    """For each poor operator (``{name: (the rule's prescription, the figure that fell below
    the threshold)}``): that figure measured on the operator alone, its candidate remedies
    measured on ``batches`` and ranked, and the verdict. An operator that cannot run alone (a
    call_module, an operator whose inputs are not kept) is left out. ``estimates``: estimates
    kept by :func:`~qviz.numeric.diagnose.memo.content_key` (and the remedy), taken from it
    and added to it."""
    from tqdm.auto import tqdm

    locals_ = capture(ctx, {n: figure for n, (_, figure) in found.items()}, batches)
    out = {}
    for name in tqdm(list(locals_), desc="diagnose: remedies", disable=not progress):
        local = locals_[name]
        try:
            before = local_sqnr(local)
        except (QvizError, RuntimeError, ValueError, TypeError) as exc:
            out[name] = (math.nan, (), f"not measured: {name} does not run alone ({exc})")
            continue
        key = content_key(local) if estimates is not None else None
        ests = []
        for p in candidates(local, found[name][0]):
            kept = estimates.get((key, repr(p))) if estimates is not None else None
            if kept is None:
                kept = estimate(local, remedy_name(p), p, before)
                if estimates is not None:
                    estimates[(key, repr(p))] = kept
            ests.append(kept)
        ranked = rank(ests, min_gain_db)
        out[name] = (before, ranked, verdict(name, ranked, min_gain_db))
    for name in found.keys() - out.keys():
        out[name] = (math.nan, (), f"not measured: {name} does not run alone here")
    return out
