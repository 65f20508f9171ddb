"""What a mixed-precision search chooses between: precisions, the units they are chosen for, and
the overrides that give a unit its precision.

A **precision** is a weight bit width and an input-activation bit width (``"w4a8"``,
``"w8a16"``), or ``"float"``. A **unit** is what takes one precision: a layer with a weight
(conv, linear) together with the activation tensors that feed it. Two layers fed by one
observer (a ResNet block's conv and its downsample conv both read one ReLU's output) read one
quantized tensor, so they are one unit: the plan's sharing groups decide, as they decide what
one observer measures.

A unit at ``w4a16`` gets, through :class:`~qviz.engine.quantizers.override.OverrideQuantizer`,
4-bit weights (the base quantizer's weight spec, its range narrowed to ``-8..7``) and int16
for every tensor of each activation group that feeds it (the producer's output and every edge
that shares it, so the value is not rounded to int8 first); ``float`` leaves its layers in
float (the plan says "user fallback").

Example:
    >>> Precision.parse("w4a8"), Precision.parse("float").name
    (Precision(weight_bits=4, activation_bits=8), 'float')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule, Node

from qviz.engine.qparams import bits_of_range
from qviz.errors import ConfigError

_FLOAT_NAMES = ("float", "fp32", "float32")
#: Bits a float tensor is costed at.
FLOAT_BITS = 32


@dataclass(frozen=True)
class Precision:
    """A weight and an input-activation bit width; both None: float.

    Args:
        weight_bits: 2 to 8 (stored in int8, the range narrowed), or None (float).
        activation_bits: 8 or 16, or None (float).

    Example:
        >>> Precision(4, 8).name, Precision(None, None).is_float
        ('w4a8', True)
    """

    weight_bits: int | None
    activation_bits: int | None

    def __post_init__(self) -> None:
        w, a = self.weight_bits, self.activation_bits
        if (w is None) != (a is None):
            raise ConfigError(
                f"Precision({w!r}, {a!r}): give both bit widths, or neither for float"
            )
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or not 2 <= w <= 8):
            raise ConfigError(f"Precision: weight_bits must be an int from 2 to 8, got {w!r}")
        if a is not None and a not in (8, 16):
            raise ConfigError(f"Precision: activation_bits must be 8 or 16, got {a!r}")

    @property
    def is_float(self) -> bool:
        return self.weight_bits is None

    @property
    def name(self) -> str:
        return "float" if self.is_float else f"w{self.weight_bits}a{self.activation_bits}"

    @property
    def bits(self) -> tuple[int, int]:
        """(weight bits, activation bits), float costed at 32 each."""
        if self.is_float:
            return FLOAT_BITS, FLOAT_BITS
        return int(self.weight_bits or 0), int(self.activation_bits or 0)

    @classmethod
    def parse(cls, value: Any) -> Precision:
        """A Precision from itself, ``"w4a8"``-style text or ``"float"``.

        Example:
            >>> Precision.parse("W8A16")
            Precision(weight_bits=8, activation_bits=16)
        """
        if isinstance(value, Precision):
            return value
        text = str(value).strip().lower()
        if text in _FLOAT_NAMES:
            return cls(None, None)
        w, sep, a = text.removeprefix("w").partition("a")
        if not (text.startswith("w") and sep and w.isdigit() and a.isdigit()):
            raise ConfigError(
                f"candidate {value!r}: write a precision as 'w<bits>a<bits>' ('w4a8', 'w8a16') "
                f"or 'float'"
            )
        return cls(int(w), int(a))


@dataclass(frozen=True)
class Unit:
    """Layers that take one precision, and what giving it to them edits (plain data).

    Attributes:
        name: the first layer's node name.
        layers: the layers' node names, in graph order.
        weights: ``("weight -> layer", quant_min, quant_max)`` for each weight the base
            quantizer observes, with its range there.
        activations: the override keys of every tensor of the activation groups that feed the
            layers (``"relu"``: an output; ``"relu -> conv2d_1"``: an edge).
        base_activation_bits: the bit width the base quantizer gives those activations.

    Example:
        >>> u = Unit("linear", ("linear",), (("w -> linear", -127, 127),), ("x -> linear",), 8)
        >>> u.overrides(Precision(4, 16))
        {'w -> linear': {'quant_min': -8, 'quant_max': 7}, 'x -> linear': {'dtype': 'int16'}}
    """

    name: str
    layers: tuple[str, ...]
    weights: tuple[tuple[str, int, int], ...]
    activations: tuple[str, ...]
    base_activation_bits: int

    def overrides(self, precision: Precision) -> dict[str, dict[str, Any]]:
        """The :class:`~qviz.engine.quantizers.override.OverrideQuantizer` edits that give
        this unit ``precision`` (none where the base quantizer already does)."""
        if precision.is_float:
            return {layer: {"quantize": False} for layer in self.layers}
        edits: dict[str, dict[str, Any]] = {}
        for key, lo, hi in self.weights:
            new = weight_range(lo, hi, int(precision.weight_bits or 0))
            if new != (lo, hi):
                edits[key] = {"quant_min": new[0], "quant_max": new[1]}
        if precision.activation_bits != self.base_activation_bits:
            dtype = "int16" if precision.activation_bits == 16 else "int8"
            edits |= {key: {"dtype": dtype} for key in self.activations}
        return edits


def weight_range(quant_min: int, quant_max: int, bits: int) -> tuple[int, int]:
    """The ``bits``-bit range for a weight the base quantizer stores in ``quant_min..quant_max``:
    that range itself at its own width, else every level of the narrower integer (signed
    ``-8..7`` at 4 bits, as ExecuTorch's int4 and AIMET's 4-bit weights; unsigned ``0..15``).

    Example:
        >>> weight_range(-127, 127, 8), weight_range(-127, 127, 4), weight_range(0, 255, 4)
        ((-127, 127), (-8, 7), (0, 15))
    """
    if bits >= _bits_of(quant_min, quant_max):
        return quant_min, quant_max
    if quant_min >= 0:
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _bits_of(quant_min: int, quant_max: int) -> int:
    return max(1, bits_of_range(quant_min, quant_max))


def _key(producer: str, consumer: str | None) -> str:
    return producer if consumer is None else f"{producer} -> {consumer}"


def _bits(spec: Any) -> int:
    return _bits_of(spec.quant_min, spec.quant_max)


def find_units(gm: GraphModule, plan: Any, layers: Any = None) -> list[Unit]:
    """The units of ``plan`` (the base quantizer's, on ``gm``), in graph order.

    Args:
        gm: the float exported graph the plan was made on.
        plan: the prepared model's :class:`~qviz.engine.pt2e.plan.QuantPlan`.
        layers: node names to search over (default: every operator with an observed weight).

    Raises:
        ConfigError: a named layer has no observed weight, or none has.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer
        >>> from qviz.engine.quantizers import get_symmetric_quantization_config as config
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(),
        ...                             torch.nn.Linear(4, 2)).eval()
        >>> gm = qviz.export(model, (torch.randn(2, 4),))
        >>> plan = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config())).plan
        >>> [(u.name, u.activations) for u in find_units(gm, plan)]
        [('linear', ('input_1 -> linear',)), ('linear_1', ('relu', 'relu -> linear_1'))]
    """
    nodes = {n.name: n for n in gm.graph.nodes}
    weights: dict[str, list[tuple[str, int, int]]] = {}
    feeding: dict[str, list[Any]] = {}
    for g in plan.groups:
        for m in g.members:
            producer = nodes.get(m.producer)
            if m.consumer is None or producer is None or m.consumer not in nodes:
                continue
            if producer.op == "get_attr":
                entry = (_key(m.producer, m.consumer), g.spec.quant_min, g.spec.quant_max)
                weights.setdefault(m.consumer, []).append(entry)
            elif g.spec.kind == "observed":
                feeding.setdefault(m.consumer, []).append(g)
    chosen = _chosen_layers(nodes, weights, layers)
    return _merged_units(chosen, weights, feeding)


def _chosen_layers(nodes: dict[str, Node], weights: dict[str, list], layers: Any) -> list[str]:
    order = list(nodes)
    if layers is None:
        found = [n for n in order if n in weights]
        if not found:
            raise ConfigError(
                "search_precision: the quantizer observes no layer's weight; there is nothing "
                "to give a precision to"
            )
        return found
    names = [layers] if isinstance(layers, str) else list(layers)
    for name in names:
        if name not in weights:
            raise ConfigError(
                f"search_precision(layers=...): {name!r} is not an operator with an observed "
                f"weight; choose from {[n for n in order if n in weights]}"
            )
    return sorted(set(names), key=order.index)


def _merged_units(chosen: list[str], weights: dict, feeding: dict) -> list[Unit]:
    """One unit per set of layers joined by an activation group they share (union-find)."""
    parent = {name: name for name in chosen}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    reader: dict[int, str] = {}
    for layer in chosen:
        for g in feeding.get(layer, ()):
            if g.group in reader:
                parent[root(layer)] = root(reader[g.group])
            reader.setdefault(g.group, layer)
    members: dict[str, list[str]] = {}
    for layer in chosen:
        members.setdefault(root(layer), []).append(layer)
    return [_unit(layers, weights, feeding) for layers in members.values()]


def _unit(layers: list[str], weights: dict, feeding: dict) -> Unit:
    groups = {g.group: g for layer in layers for g in feeding.get(layer, ())}
    keys = dict.fromkeys(_key(m.producer, m.consumer) for g in groups.values() for m in g.members)
    bits = {_bits(g.spec) for g in groups.values()}
    return Unit(
        name=layers[0],
        layers=tuple(layers),
        weights=tuple(w for layer in layers for w in weights.get(layer, ())),
        activations=tuple(keys),
        base_activation_bits=max(bits) if bits else 8,
    )


def assignment_overrides(units: list[Unit], choice: list[Precision]) -> dict[str, dict[str, Any]]:
    """Every unit's overrides for ``choice`` (one precision per unit), as one dict. A layer
    kept in float has no output to edit: the edges from it carry its consumers' precision.

    Example:
        >>> a = Unit("linear", ("linear",), (), ("x -> linear",), 8)
        >>> b = Unit("linear_1", ("linear_1",), (), ("linear", "linear -> linear_1"), 8)
        >>> assignment_overrides([a, b], [Precision.parse("float"), Precision.parse("w8a16")])
        {'linear': {'quantize': False}, 'linear -> linear_1': {'dtype': 'int16'}}
    """
    float_layers = {layer for u, p in zip(units, choice, strict=True) if p.is_float
                    for layer in u.layers}  # fmt: skip
    out: dict[str, dict[str, Any]] = {}
    for unit, precision in zip(units, choice, strict=True):
        for key, edit in unit.overrides(precision).items():
            if key in float_layers and "quantize" not in edit:
                continue
            out[key] = edit
    return out
