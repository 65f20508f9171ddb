"""A QConfig's observer constructor as a PT2E spec on qviz's observers, and the facts about it
that a backend's dtype constraints are checked against.

torch.ao observer constructors (``HistogramObserver.with_args(reduce_range=True)``) become the
qviz observer of the same name with the same arguments, so the observer prepare inserts is built
exactly as FX mode builds it (qviz's observers compute torch's qparams bit for bit). A
placeholder of a float dtype, ``NoopObserver`` and ``ReuseInputObserver`` observe nothing;
``FixedQParamsObserver`` becomes a FixedQParamsQuantizationSpec; a dynamic placeholder a
dynamic spec.

Example:
    >>> import torch
    >>> from torch.ao.quantization.observer import HistogramObserver
    >>> spec, facts = observer_spec(HistogramObserver.with_args(reduce_range=True), "activation")
    >>> spec.observer_or_fake_quant_ctr.p.func.__module__, facts.quant_min, facts.quant_max
    ('qviz.engine.observers.histogram', 0, 127)
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from qviz.engine import observers
from qviz.engine.pt2e.passes.observer_to_qdq import FLOAT_DTYPES
from qviz.engine.specs import FixedQParamsQuantizationSpec, QuantizationSpec, QuantizationSpecBase
from qviz.errors import ConfigError

_NOT_OBSERVING = ("NoopObserver", "ReuseInputObserver")


@dataclass(frozen=True, kw_only=True)
class ObserverFacts:
    """What a QConfig's observer will do, as a backend's constraints need it."""

    observer: str
    dtype: torch.dtype | None
    quant_min: int | None = None
    quant_max: int | None = None
    eps: float | None = None
    is_dynamic: bool = False
    scale: float | None = None
    zero_point: int | None = None


def _class_and_kwargs(ctr: Any) -> tuple[type, dict[str, Any]]:
    """The observer class of ``ctr`` and every keyword it was given, ``with_args`` chains
    included (``MinMaxObserver.with_args(eps=e).with_args(quant_max=127)``: the later wins)."""
    layers: list[dict[str, Any]] = []
    inner = ctr
    while True:
        partial = getattr(inner, "p", inner)
        if not isinstance(partial, functools.partial):
            break
        layers.append(dict(partial.keywords))
        inner = partial.func
    if isinstance(inner, type):
        kwargs: dict[str, Any] = {}
        for layer in reversed(layers):  # innermost first, so the outer call's keywords win
            kwargs.update(layer)
        return inner, kwargs
    raise ConfigError(
        f"{ctr!r} is not an observer class or Observer.with_args(...); a QConfig takes "
        f"constructors, e.g. MinMaxObserver.with_args(quant_min=0, quant_max=127)"
    )


def same_constructor(a: Any, b: Any) -> bool:
    """Whether two observer constructors build the same observer (torch.ao's qconfig_equals:
    the same class with the same keywords)."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    try:
        return _class_and_kwargs(a) == _class_and_kwargs(b)
    except ConfigError:
        return bool(a == b)


def _instance(ctr: Any, where: str) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ctr()
    except Exception as error:  # the user's constructor: say which and why
        raise ConfigError(f"{where}: building the observer {ctr!r} failed: {error}") from error


Made = tuple[QuantizationSpecBase | None, ObserverFacts | None]


def observer_spec(ctr: Any, where: str, cache: dict[int, tuple[Any, Made]] | None = None) -> Made:
    """The spec qviz annotates with for observer constructor ``ctr``, and its facts.

    With a ``cache`` (a quantizer keeps one), one constructor gives one spec object, so two
    edges configured by the same QConfig have equal specs and may share an observer, as
    prepare's implicit sharing requires.

    Returns:
        ``(None, None)`` for no observer; ``(None, facts)`` for one that observes nothing
        (float placeholders, NoopObserver, ReuseInputObserver).

    Raises:
        ConfigError: ``ctr`` is not an observer constructor, or qviz has no observer of its name.
    """
    if ctr is None:
        return None, None
    key = id(ctr)
    if key in _MADE and _MADE[key][0] is ctr:
        return _MADE[key][1]
    made = _observer_spec(ctr, where)
    _MADE[key] = (ctr, made)
    return made


_MADE: dict[int, tuple[Any, tuple[QuantizationSpecBase | None, ObserverFacts | None]]] = {}


def _observer_spec(
    ctr: Any, where: str
) -> tuple[QuantizationSpecBase | None, ObserverFacts | None]:
    cls, kwargs = _class_and_kwargs(ctr)
    obs = _instance(ctr, where)
    dtype = getattr(obs, "dtype", None)
    facts = ObserverFacts(
        observer=cls.__name__,
        dtype=dtype,
        quant_min=getattr(obs, "quant_min", None),
        quant_max=getattr(obs, "quant_max", None),
        eps=float(obs.eps) if isinstance(getattr(obs, "eps", None), torch.Tensor) else None,
        is_dynamic=bool(getattr(obs, "is_dynamic", False)),
    )
    if cls.__name__ in _NOT_OBSERVING or (dtype in FLOAT_DTYPES and not facts.is_dynamic):
        return None, facts
    if cls.__name__ == "FixedQParamsObserver":
        scale, zero_point = obs.calculate_qparams()
        facts = ObserverFacts(
            **{**vars(facts), "scale": float(scale), "zero_point": int(zero_point)}
        )
        spec = FixedQParamsQuantizationSpec(
            dtype=dtype,
            scale=float(scale),
            zero_point=int(zero_point),
            quant_min=facts.quant_min,
            quant_max=facts.quant_max,
            qscheme=obs.qscheme,
        )
        return spec, facts
    ours = getattr(observers, cls.__name__, None)
    if ours is None:
        raise ConfigError(
            f"{where}: qviz has no observer named {cls.__name__}; use one of MinMaxObserver, "
            f"MovingAverageMinMaxObserver, PerChannelMinMaxObserver, "
            f"MovingAveragePerChannelMinMaxObserver, HistogramObserver, PlaceholderObserver, "
            f"FixedQParamsObserver"
        )
    per_channel = obs.qscheme in (torch.per_channel_affine, torch.per_channel_symmetric)
    # prepare builds the observer from the spec's fields over the constructor's keywords, so
    # the spec carries the QConfig's own quant_min / quant_max (None where it gave none): the
    # observer is then built with exactly the QConfig's arguments, as FX mode builds it (a
    # customized range sets a symmetric quint8 zero point to its midpoint, and reduce_range
    # halves it, as torch does), and convert quantizes with the observer's range.
    spec = QuantizationSpec(
        dtype=dtype,
        observer_or_fake_quant_ctr=ours.with_args(**kwargs),
        quant_min=kwargs.get("quant_min"),
        quant_max=kwargs.get("quant_max"),
        qscheme=obs.qscheme,
        ch_axis=int(obs.ch_axis) if per_channel else None,
        is_dynamic=facts.is_dynamic,
    )
    return spec, facts
