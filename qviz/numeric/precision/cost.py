"""What a precision costs a layer: weight storage or bit operations, from the exported graph's
shapes (no model run), or the user's own function.

* ``"size"``: the weights' storage, ``numel * weight_bits / 8`` bytes, in KiB (float: 32 bits).
* ``"bops"``: bit operations per sample, ``MACs * weight_bits * activation_bits`` (float: 32 by
  32), in GBOP; a layer's MACs per sample are its weight's elements times the output elements
  each one meets (``prod(output.shape[1:]) / out_channels``: the output pixels of a conv, the
  tokens of a linear).
* a function ``cost(layer, precision) -> float`` (``layer``: a node name; ``precision``: a
  :class:`~qviz.numeric.precision.units.Precision`), summed over a unit's layers: a measured
  latency table, a memory budget of your own.

Example:
    >>> import torch, qviz
    >>> gm = qviz.export(torch.nn.Linear(64, 32).eval(), (torch.randn(2, 64),))
    >>> layer_counts(gm, "linear")  # weight elements, MACs per sample
    (2048, 2048)
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import GraphModule

from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.user_calls import call_user
from qviz.errors import ConfigError
from qviz.numeric.precision.units import Precision, Unit


class Cost(enum.Enum):
    """The built-in costs (see the module docstring); ``Cost("size")`` from its value."""

    SIZE = "size"
    BOPS = "bops"

    @property
    def unit(self) -> str:
        return {"size": "KiB", "bops": "GBOP"}[self.value]


def parse_cost(cost: Any) -> Cost | Callable[[str, Precision], float]:
    """``cost`` as a :class:`Cost` or the user's function; anything else is refused.

    Example:
        >>> parse_cost("bops")
        <Cost.BOPS: 'bops'>
    """
    if isinstance(cost, Cost) or callable(cost):
        return cost
    try:
        return Cost(cost)
    except ValueError:
        raise ConfigError(
            f"search_precision(cost={cost!r}): give one of {[c.value for c in Cost]} or a "
            f"function cost(layer, precision) -> float"
        ) from None


def layer_counts(gm: GraphModule, layer: str) -> tuple[int, int]:
    """(weight elements, MACs per sample) of ``layer`` (a conv or linear node of ``gm``).

    Example:
        >>> import torch, qviz
        >>> gm = qviz.export(torch.nn.Conv2d(3, 8, 3).eval(), (torch.randn(1, 3, 10, 10),))
        >>> layer_counts(gm, "conv2d")  # 8*3*3*3 weights, each met 8*8 times
        (216, 13824)
    """
    node = next(n for n in gm.graph.nodes if n.name == layer)
    weight = node.args[1]
    shape = tuple(get_attr_value(gm, weight).shape) if weight.op == "get_attr" else ()
    numel = math.prod(shape)
    out = node.meta.get("val")
    if out is None or not shape:
        return numel, numel
    per_sample = math.prod(int(d) for d in out.shape[1:])
    return numel, numel * per_sample // max(1, int(shape[0]))


def unit_costs(
    gm: GraphModule, units: Sequence[Unit], options: Sequence[Sequence[Precision]], cost: Any
) -> list[list[float]]:
    """Each unit's cost at each of its options (``options[u]``), in ``cost``'s unit.

    Example:
        >>> import torch, qviz
        >>> gm = qviz.export(torch.nn.Linear(64, 32).eval(), (torch.randn(2, 64),))
        >>> unit = Unit("linear", ("linear",), (), (), 8)
        >>> unit_costs(gm, [unit], [[Precision(4, 8), Precision(None, None)]], "size")
        [[1.0, 8.0]]
    """
    how = parse_cost(cost)
    counts = {layer: layer_counts(gm, layer) for u in units for layer in u.layers}

    def one(layer: str, precision: Precision) -> float:
        if not isinstance(how, Cost):
            return call_user(
                how, layer, precision, role="cost", where=f"search_precision: layer {layer!r} "
                f"at {precision}", signature="cost(layer, precision)", convert=_cost_value,
                expected="a finite number >= 0 (bytes, BOPs or your own unit)",
            )  # fmt: skip
        numel, macs = counts[layer]
        w, a = precision.bits
        return numel * w / 8 / 1024 if how is Cost.SIZE else macs * w * a / 1e9

    return [[sum(one(layer, p) for layer in u.layers) for p in opts]
            for u, opts in zip(units, options, strict=True)]  # fmt: skip


def _cost_value(value: Any) -> float:
    """A user cost as a float; TypeError or ValueError for what no search can add up: not a
    number, NaN, infinite or negative (a negative cost would make a layer's float option the
    cheapest)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real | torch.Tensor):
        raise TypeError(f"not a number: {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"not a finite number >= 0: {number}")
    return number
