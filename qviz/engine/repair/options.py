"""The options of each repair transform, as typed data checked where the user gave them.

Each public transform builds its record from its keyword arguments first thing, before it
reads a model: a bad value is a :class:`~qviz.errors.ConfigError` naming the argument, the
value and the valid range, and nothing has been copied, run or changed. The checks are the same
for every transform: a bool is not an integer (``True`` is no iteration count), an integer
must be an integer (``2.7`` iterations is refused, not truncated), NaN and infinity are refused
wherever a number is taken.

* :class:`EqualizationOptions`: ``cross_layer_equalization``;
* :class:`BiasCorrectionOptions`: ``bias_correction``;
* :class:`SmoothQuantOptions`: ``smooth_quant`` (its ``alpha`` also ``smoothing_factors``');
* :class:`AdaRoundOptions`: ``adaround``, its :class:`AdaRoundSettings` (the optimization, which
  ``learn_rounding`` reads) with the layers to round and the progress bar.

Example:
    >>> EqualizationOptions(num_std=2).num_std
    2.0
    >>> EqualizationOptions(max_sweeps=0)
    Traceback (most recent call last):
    ...
    qviz.errors.ConfigError: cross_layer_equalization: max_sweeps must be an integer >= 1, got 0
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from qviz.errors import ConfigError


def _got(value: Any) -> str:
    """``value`` as the message shows it, with its type where the repr hides it."""
    shown = f"{value!r:.60}"
    if value is None or isinstance(value, bool | float | str | numbers.Integral):
        return shown
    return f"{shown} ({type(value).__name__})"


def _refuse(where: str, name: str, rule: str, value: Any, hint: str = "") -> ConfigError:
    return ConfigError(f"{where}: {name} must be {rule}, got {_got(value)}{hint}")


def integer(
    where: str,
    name: str,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    none: str = "",
) -> int | None:
    """``value`` as an int in ``[low, high]``; ``none`` (what None means) allows None.

    Example:
        >>> integer("adaround", "iterations", 3, low=1)
        3
        >>> integer("adaround", "iterations", 2.7, low=1)
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: adaround: iterations must be an integer >= 1, got 2.7
    """
    bounds = [f">= {low}"] if low is not None else []
    bounds += [f"<= {high}"] if high is not None else []
    rule = "an integer" + (" " + " and ".join(bounds) if bounds else "")
    rule += f", or None ({none})" if none else ""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        hint = ""
        if isinstance(value, float) and value.is_integer():
            hint = f" (a float: give {name}={int(value)})"
        elif isinstance(value, bool):
            hint = " (a bool is not a count)"
        raise _refuse(where, name, rule, value, hint)
    if (low is not None and value < low) or (high is not None and value > high):
        raise _refuse(where, name, rule, value)
    return int(value)


def real(
    where: str,
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    open_high: bool = False,
    hint: str = "",
) -> float:
    """``value`` as a finite float in the range (``open_*``: the end itself excluded); ``hint``
    is added to the message of a value out of the range (what it would do).

    Example:
        >>> real("smooth_quant", "alpha", 1, low=0, high=1)
        1.0
        >>> real("adaround", "lr", float("nan"), low=0, open_low=True)
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: adaround: lr must be > 0 (a finite number), got nan
    """
    if low is not None and high is not None:
        rule = f"in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    elif low is not None:
        rule = f"{'>' if open_low else '>='} {low:g}"
    elif high is not None:
        rule = f"{'<' if open_high else '<='} {high:g}"
    else:
        rule = ""
    rule = f"{rule} (a finite number)" if rule else "a finite number"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _refuse(where, name, rule, value)
    number = float(value)
    if not math.isfinite(number):
        raise _refuse(where, name, rule, value)
    below = low is not None and (number <= low if open_low else number < low)
    above = high is not None and (number >= high if open_high else number > high)
    if below or above:
        raise _refuse(where, name, rule, value, hint)
    return number


def flag(where: str, name: str, value: Any) -> bool:
    """``value`` as True or False (not 0, 1, ``"yes"`` or None).

    Example:
        >>> flag("smooth_quant", "progress", False)
        False
    """
    if not isinstance(value, bool):
        raise _refuse(where, name, "True or False", value)
    return value


def choice(where: str, name: str, value: Any, choices: Sequence[str]) -> str:
    """``value``, one of ``choices`` (strings).

    Example:
        >>> choice("bias_correction", "reference", "float", ("float", "quantized"))
        'float'
    """
    if not isinstance(value, str) or value not in choices:
        raise _refuse(where, name, f"one of {tuple(choices)}", value)
    return value


def node_names(where: str, name: str, value: Any, meaning: str) -> tuple[str, ...] | None:
    """``value`` (None, one node name or a non-empty sequence of them) as a tuple of names.

    Example:
        >>> node_names("adaround", "nodes", "linear", "every layer")
        ('linear',)
    """
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else value
    rule = f"a node name or a non-empty list of them, or None ({meaning})"
    if not isinstance(names, Sequence) or not all(isinstance(n, str) and n for n in names):
        raise _refuse(where, name, rule, value)
    if not names:
        raise _refuse(where, name, rule, value, ": it names no node, so nothing would be done")
    return tuple(names)


def _set(record: Any, **values: Any) -> None:
    """Store checked values on a frozen record."""
    for key, value in values.items():
        object.__setattr__(record, key, value)


@dataclass(frozen=True, kw_only=True)
class EqualizationOptions:
    """The options of :func:`~qviz.engine.repair.cross_layer_equalization` (its docstring says
    what each does).

    Example:
        >>> EqualizationOptions(sweeps=1).sweeps
        1
    """

    WHERE: ClassVar[str] = "cross_layer_equalization"
    sweeps: int | None = None
    tol: float = 1e-6
    max_sweeps: int = 1000
    high_bias_absorption: bool = True
    num_std: float = 3.0

    def __post_init__(self) -> None:
        w = self.WHERE
        _set(
            self,
            sweeps=integer(w, "sweeps", self.sweeps, low=1, none="repeat until converged"),
            tol=real(w, "tol", self.tol, low=0),
            max_sweeps=integer(w, "max_sweeps", self.max_sweeps, low=1),
            high_bias_absorption=flag(w, "high_bias_absorption", self.high_bias_absorption),
            num_std=real(
                w, "num_std", self.num_std, low=0,
                hint=": below 0 more than the always-positive part of a bias would be moved, "
                "which changes the float function",
            ),
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class BiasCorrectionOptions:
    """The options of :func:`~qviz.engine.repair.bias_correction`.

    Example:
        >>> BiasCorrectionOptions(reference="quantized", max_batches=4).max_batches
        4
    """

    WHERE: ClassVar[str] = "bias_correction"
    REFERENCES: ClassVar[tuple[str, ...]] = ("float", "quantized")
    reference: str = "float"
    max_batches: int | None = None

    def __post_init__(self) -> None:
        w = self.WHERE
        _set(
            self,
            reference=choice(w, "reference", self.reference, self.REFERENCES),
            max_batches=integer(w, "max_batches", self.max_batches, low=1, none="every batch"),
        )


def check_alpha(alpha: Any) -> float:
    """SmoothQuant's migration strength, checked: a finite number in [0, 1].

    Example:
        >>> check_alpha(0.5)
        0.5
    """
    return real("smooth_quant", "alpha", alpha, low=0, high=1)


@dataclass(frozen=True, kw_only=True)
class SmoothQuantOptions:
    """The options of :func:`~qviz.engine.repair.smooth_quant`.

    Example:
        >>> SmoothQuantOptions(alpha=0.8).alpha
        0.8
    """

    WHERE: ClassVar[str] = "smooth_quant"
    alpha: float = 0.5
    progress: bool = True

    def __post_init__(self) -> None:
        _set(
            self,
            alpha=check_alpha(self.alpha),
            progress=flag(self.WHERE, "progress", self.progress),
        )


@dataclass(frozen=True, kw_only=True)
class AdaRoundSettings:
    """AdaRound's optimization settings (the paper's defaults, as AIMET uses them).

    Example:
        >>> AdaRoundSettings(iterations=500).warm_start
        0.2
    """

    WHERE: ClassVar[str] = "adaround"
    iterations: int = 2000
    reg_param: float = 0.01
    beta_range: tuple[float, float] = (20.0, 2.0)
    warm_start: float = 0.2
    batch_size: int = 32  #: cached samples per iteration
    lr: float = 1e-2  #: Adam's learning rate on V
    seed: int = 0

    def __post_init__(self) -> None:
        w = self.WHERE
        _set(
            self,
            iterations=integer(w, "iterations", self.iterations, low=1),
            reg_param=real(w, "reg_param", self.reg_param, low=0),
            beta_range=self._beta_range(),
            warm_start=real(w, "warm_start", self.warm_start, low=0, high=1, open_high=True),
            batch_size=integer(w, "batch_size", self.batch_size, low=1),
            lr=real(w, "lr", self.lr, low=0, open_low=True),
            seed=integer(w, "seed", self.seed, low=0, high=2**64 - 1),
        )

    def _beta_range(self) -> tuple[float, float]:
        rule = "(start, end): two finite numbers > 0"
        value = self.beta_range
        if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
            raise _refuse(self.WHERE, "beta_range", rule, value)
        start, end = (
            real(self.WHERE, f"beta_range[{i}]", v, low=0, open_low=True)
            for i, v in enumerate(value)
        )
        return (start, end)


@dataclass(frozen=True, kw_only=True)
class AdaRoundOptions(AdaRoundSettings):
    """The options of :func:`~qviz.engine.repair.adaround`: its optimization settings, the
    layers to round (``nodes``: None for every quantized one) and the progress bar.

    Example:
        >>> AdaRoundOptions(nodes="linear", iterations=50).nodes
        ('linear',)
    """

    nodes: tuple[str, ...] | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        w = self.WHERE
        _set(
            self,
            nodes=node_names(w, "nodes", self.nodes, "every quantized conv / linear"),
            progress=flag(w, "progress", self.progress),
        )
