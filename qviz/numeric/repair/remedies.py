"""The remedies a :class:`~qviz.numeric.repair.session.RepairSession` applies, and where each
one acts in the pipeline float graph → prepare → calibrate → convert.

========================  ==========  ============================================================
remedy                    stage       what it runs
========================  ==========  ============================================================
cross_layer_equalization  float       ``qviz.engine.repair.cross_layer_equalization(gm, **kw)``
smooth_quant              float       ``smooth_quant(gm, calibration_data, **kw)``
per_channel               quantizer   ``OverrideQuantizer``: the nodes' weights per channel
override                  quantizer   ``OverrideQuantizer(quantizer, overrides)``
fallback                  quantizer   ``qviz.numeric.fallback(quantizer, nodes)``
bias_correction           converted   ``bias_correction(converted, float_gm, calibration_data)``
adaround                  converted   ``adaround(converted, float_gm, calibration_data, **kw)``
========================  ==========  ============================================================

A finding of :func:`qviz.numeric.diagnose` names its remedy by the qviz function of its
prescription; :func:`remedy_of` turns it into a :class:`Remedy`. The repair transforms act on
the whole model (equalization and SmoothQuant rescale every pair and producer they can, bias
correction corrects every layer in order), so the node scope a prescription gives them
(``pairs``, ``nodes``) is kept in :attr:`Remedy.scope` for people and not passed on; AdaRound's
is passed on (``nodes=``: only the layer the finding named is rounded).

Example:
    >>> Remedy("fallback", (("nodes", ("relu",)),)).stage
    <Stage.QUANTIZER: 1>
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from torch.fx import GraphModule

from qviz.engine.graph.node_data import op_name
from qviz.engine.pt2e.plan import TRANSFORMS_KEY, TransformRecord
from qviz.engine.quantizers.override import OverrideQuantizer
from qviz.engine.repair import adaround, bias_correction, cross_layer_equalization, smooth_quant
from qviz.errors import ConfigError, closest_names
from qviz.numeric.diagnose.diagnose import Finding
from qviz.numeric.diagnose.rules import Prescription
from qviz.numeric.variants.sensitivity import fallback


class Stage(IntEnum):
    """Where a remedy acts; a rebuild runs the stages in this order."""

    FLOAT = 0
    QUANTIZER = 1
    CONVERTED = 2


_TRANSFORMS: dict[str, Callable[..., GraphModule]] = {
    "cross_layer_equalization": cross_layer_equalization,
    "smooth_quant": smooth_quant,
    "bias_correction": bias_correction,
    "adaround": adaround,
}
_QUANTIZER_ARGS = {"per_channel": "nodes", "fallback": "nodes", "override": "overrides"}
STAGES: dict[str, Stage] = {
    "cross_layer_equalization": Stage.FLOAT,
    "smooth_quant": Stage.FLOAT,
    "per_channel": Stage.QUANTIZER,
    "override": Stage.QUANTIZER,
    "fallback": Stage.QUANTIZER,
    "bias_correction": Stage.CONVERTED,
    "adaround": Stage.CONVERTED,
}
#: The session passes these itself (the models, the calibration data, its progress flag).
_SUPPLIED = ("gm", "converted", "float_gm", "data", "progress")
_BY_FUNCTION = {
    "qviz.engine.repair.cross_layer_equalization": "cross_layer_equalization",
    "qviz.engine.repair.smooth_quant": "smooth_quant",
    "qviz.engine.repair.bias_correction": "bias_correction",
    "qviz.engine.repair.adaround": "adaround",
    "qviz.numeric.fallback": "fallback",
    "qviz.engine.quantizers.override.OverrideQuantizer": "override",
}


@dataclass(frozen=True)
class Remedy:
    """One remedy as applied: its name, its arguments and, from a finding, the node scope.

    Attributes:
        name: a key of :data:`STAGES`.
        arguments: keyword arguments as ``(name, value)`` pairs.
        scope: the nodes a prescription named (informational for the repair transforms).

    Example:
        >>> Remedy("adaround", (("iterations", 50),)).kwargs
        {'iterations': 50}
    """

    name: str
    arguments: tuple[tuple[str, Any], ...] = ()
    scope: tuple[str, ...] = ()

    @property
    def stage(self) -> Stage:
        """Where it acts (:class:`Stage`)."""
        return STAGES[self.name]

    @property
    def kwargs(self) -> dict[str, Any]:
        """The arguments as a dict."""
        return dict(self.arguments)


def _names(value: Any, remedy: str) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value or ())
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"apply({remedy!r}, nodes=...): give a node name or a list of them")
    return names


def _check_arguments(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` checked against what the remedy takes; quantizer remedies' nodes as a tuple."""
    if name in _QUANTIZER_ARGS:
        key = _QUANTIZER_ARGS[name]
        if set(kwargs) != {key}:
            raise ConfigError(f"apply({name!r}) takes {key}= alone, got {sorted(kwargs)}")
        value = kwargs[key]
        if key == "overrides":
            OverrideQuantizer(None, value)  # validates (ConfigError naming the key)
            return {key: value}
        return {key: _names(value, name)}
    params = inspect.signature(_TRANSFORMS[name]).parameters
    allowed = [p for p in params if p not in _SUPPLIED]
    unknown = [k for k in kwargs if k not in allowed]
    if unknown:
        raise ConfigError(
            f"apply({name!r}): unknown argument {unknown[0]!r}; it takes {allowed} (the session "
            f"passes the models, the calibration data and progress itself)"
        )
    return dict(kwargs)


def remedy_of(remedy: Any, kwargs: Mapping[str, Any]) -> Remedy:
    """A :class:`Remedy` from a name and keyword arguments, or from a finding of
    :func:`qviz.numeric.diagnose` (or its prescription), ``kwargs`` added to its arguments.

    Example:
        >>> remedy_of("fallback", {"nodes": "relu"})
        Remedy(name='fallback', arguments=(('nodes', ('relu',)),), scope=())
        >>> remedy_of(Prescription("equalize", "qviz.engine.repair.cross_layer_equalization",
        ...           (("pairs", (("linear", "linear_1"),)),)), {}).scope
        ('linear', 'linear_1')
    """
    scope: tuple[str, ...] = ()
    if isinstance(remedy, Finding | Prescription):
        name, kwargs, scope = _from_prescription(remedy, kwargs)
    elif isinstance(remedy, str) and remedy in STAGES:
        name = remedy
    else:
        raise ConfigError(
            f"apply(remedy={remedy!r}): give one of {list(STAGES)} or a Finding of "
            f"qviz.numeric.diagnose ({closest_names(str(remedy), STAGES)})"
        )
    arguments = _check_arguments(name, kwargs)
    return Remedy(name, tuple(sorted(arguments.items())), scope)


def _from_prescription(
    remedy: Finding | Prescription, kwargs: Mapping[str, Any]
) -> tuple[str, dict[str, Any], tuple[str, ...]]:
    """The remedy's name, its arguments (``kwargs`` win) and node scope, from a prescription."""
    p = remedy.prescription if isinstance(remedy, Finding) else remedy
    if p.function not in _BY_FUNCTION:
        raise ConfigError(
            f"apply: the prescription's function {p.function!r} is not a remedy a RepairSession "
            f"applies ({sorted(_BY_FUNCTION)})"
        )
    name, given = _BY_FUNCTION[p.function], dict(p.arguments)
    if name == "fallback":
        return name, {"nodes": given["nodes_or_module_names"], **kwargs}, ()
    if name == "override":
        return name, {"overrides": given["overrides"], **kwargs}, ()
    if name == "adaround" and "nodes" in given:  # the layer the finding named
        nodes = tuple(given["nodes"])
        return name, {"nodes": nodes, **kwargs}, nodes
    scope: list[str] = []
    for value in given.values():  # ``pairs`` or ``nodes``: names, or tuples of names
        for item in value:
            scope.extend((item,) if isinstance(item, str) else item)
    return name, dict(kwargs), tuple(dict.fromkeys(scope))


def _per_channel(gm: GraphModule, nodes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Overrides that quantize each named conv / linear's weight per output channel."""
    by_name = {n.name: n for n in gm.graph.nodes}
    out = {}
    for name in nodes:
        node = by_name.get(name)
        if node is None:
            raise ConfigError(
                f"apply('per_channel', nodes=...): no node {name!r} in the float graph "
                f"({closest_names(name, by_name)})"
            )
        weight = node.args[1] if len(node.args) > 1 else None
        if not any(k in op_name(node) for k in ("conv", "linear")) or weight is None:
            raise ConfigError(
                f"apply('per_channel', nodes=...): {node.format_node()} is not a conv / linear "
                f"with a weight; name conv / linear nodes"
            )
        axis = 1 if "transpose" in op_name(node) else 0
        out[f"{weight.name} -> {name}"] = {"qscheme": "per_channel_symmetric", "ch_axis": axis}
    return out


def quantizer_with(quantizer: Any, remedies: tuple[Remedy, ...], gm: GraphModule) -> Any:
    """``quantizer`` wrapped by each quantizer-stage remedy, in application order.

    Example:
        >>> from qviz.engine.quantizers import XNNPACKQuantizer
        >>> quantizer_with(XNNPACKQuantizer(), (Remedy("fallback", (("nodes", ("relu",)),)),),
        ...                None).names
        ('relu',)
    """
    for remedy in remedies:
        if remedy.stage is not Stage.QUANTIZER:
            continue
        kwargs = remedy.kwargs
        if remedy.name == "fallback":
            quantizer = fallback(quantizer, list(kwargs["nodes"]))
        elif remedy.name == "override":
            quantizer = OverrideQuantizer(quantizer, kwargs["overrides"])
        else:
            quantizer = OverrideQuantizer(quantizer, _per_channel(gm, kwargs["nodes"]))
    return quantizer


def transform(
    remedy: Remedy, gm: GraphModule, float_gm: GraphModule, data: Any, progress: bool
) -> tuple[GraphModule, tuple[TransformRecord, ...]]:
    """Run a float- or converted-stage remedy on ``gm`` (a copy comes back) and return it with
    the TransformRecords the remedy added.

    Example:
        >>> import torch, qviz
        >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
        ...                  torch.nn.Linear(8, 2)).eval(), (torch.randn(3, 4),))
        >>> out, records = transform(Remedy("cross_layer_equalization"), gm, gm, None, False)
        >>> [r.kind for r in records]
        ['cross_layer_equalization']
    """
    fn, kwargs = _TRANSFORMS[remedy.name], remedy.kwargs
    before = len(gm.meta.get(TRANSFORMS_KEY, ()))
    if remedy.name == "cross_layer_equalization":
        out = fn(gm, **kwargs)
    elif remedy.name == "smooth_quant":
        out = fn(gm, data, progress=progress, **kwargs)
    elif remedy.name == "adaround":
        out = fn(gm, float_gm, data, progress=progress, **kwargs)
    else:
        out = fn(gm, float_gm, data, **kwargs)
    return out, tuple(out.meta.get(TRANSFORMS_KEY, ())[before:])
