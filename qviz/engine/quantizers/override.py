"""OverrideQuantizer: another quantizer's annotations, edited by plain-data overrides.

Overrides are a dict, JSON-serialisable, applied in order after the base quantizer annotates:

======================  ======================================================================
key                     what it edits
======================  ======================================================================
``"conv2d_2"``          that node's output (a node name, as in the plan and the graphs)
``"relu_1 -> add"``     that input edge
``"block.conv2"``       the output of every operator inside that module (nn_module_stack)
``"op:conv2d"``         the output of every operator of that type
======================  ======================================================================

and each value is a dict of changes, named as in ``QuantizationSpec``:

* ``dtype`` (``"int8"``, ``"uint8"``, ``"int16"``), ``quant_min``, ``quant_max`` (a new dtype
  without a range takes the dtype's full range; ``quant_min=-8, quant_max=7`` is int4 in int8
  storage), ``qscheme`` (``"per_tensor_affine"``, ``"per_tensor_symmetric"``,
  ``"per_channel_symmetric"``, ``"per_channel_affine"``), ``ch_axis``;
* ``observer``: an observer class name of :mod:`qviz.engine.observers` (a per-channel qscheme
  picks the per-channel variant), and ``method`` for a HistogramObserver (``"l2"``, ``"max"``,
  ``"percentile"``, ``"entropy"``, ``"mse"``) with its ``percentile``;
* ``quantize``: ``False`` leaves the node (or edge) in float, the plan says "user fallback";
  ``True`` quantizes an operator the base left alone, with ``default_spec``;
* ``share_with``: ``"producer -> consumer"`` or a node name: use that tensor's observer;
* ``scale`` and ``zero_point``: fixed qparams (a FixedQParamsQuantizationSpec).

A tensor that shared its spec with another (``SharedQuantizationSpec``) gets its own, edited copy
of the shared spec: editing it unshares it. Invalid edits raise a QvizError naming the key.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), (torch.randn(2, 4),))
    >>> base = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> q = OverrideQuantizer(base, {"relu": {"dtype": "uint8", "observer": "MinMaxObserver"}})
    >>> spec = qviz.prepare_pt2e(gm, q).plan.group_of("relu").spec
    >>> spec.dtype, spec.quant_min, spec.quant_max, spec.observer
    ('uint8', 0, 255, 'MinMaxObserver')
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import torch
from torch.fx import GraphModule, Node

from qviz.engine.graph.node_data import op_name
from qviz.engine.observers import (
    HISTOGRAM_METHODS,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
)
from qviz.engine.qparams import DTYPE_RANGES
from qviz.engine.quantizers.annotate import USER_FALLBACK, record_float_reason
from qviz.engine.quantizers.fallback import (
    WrappingQuantizer,
    _repair,
    _resolve,
    _snapshot,
    inside_module,
    module_path,
)
from qviz.engine.specs import (
    Q_ANNOTATION_KEY,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    SharedQuantizationSpec,
)
from qviz.errors import ConfigError, closest_names

CHANGE_KEYS = (
    "dtype",
    "quant_min",
    "quant_max",
    "qscheme",
    "ch_axis",
    "observer",
    "method",
    "percentile",
    "quantize",
    "share_with",
    "scale",
    "zero_point",
)
_DTYPES = {str(d).removeprefix("torch."): d for d in DTYPE_RANGES}
_QSCHEMES = {
    str(q).removeprefix("torch."): q
    for q in (
        torch.per_tensor_affine,
        torch.per_tensor_symmetric,
        torch.per_channel_symmetric,
        torch.per_channel_affine,
    )
}
_OBSERVERS = {
    cls.__name__: cls
    for cls in (
        MinMaxObserver,
        MovingAverageMinMaxObserver,
        HistogramObserver,
        PerChannelMinMaxObserver,
        MovingAveragePerChannelMinMaxObserver,
    )
}
_PER_CHANNEL_TWIN = {
    "MinMaxObserver": "PerChannelMinMaxObserver",
    "HistogramObserver": "PerChannelMinMaxObserver",
    "MovingAverageMinMaxObserver": "MovingAveragePerChannelMinMaxObserver",
}
_PER_TENSOR_TWIN = {v: k for k, v in _PER_CHANNEL_TWIN.items() if k != "HistogramObserver"}
_PER_CHANNEL_SCHEMES = (torch.per_channel_symmetric, torch.per_channel_affine)
_EPS = 2**-12


def _name_of(value: Any, table: Mapping[str, Any], what: str, key: str) -> str:
    name = str(value).removeprefix("torch.") if not isinstance(value, str) else value
    name = name.removeprefix("torch.")
    if name not in table:
        raise ConfigError(f"overrides[{key!r}]: {what} {value!r} is not one of {sorted(table)}")
    return name


def _edge_text(value: Any, key: str) -> str:
    if isinstance(value, tuple | list) and len(value) == 2:
        return f"{_node_name(value[0])} -> {_node_name(value[1])}"
    if isinstance(value, str | Node):
        return _node_name(value)
    raise ConfigError(
        f"overrides[{key!r}]: share_with must be 'producer -> consumer', (producer, consumer) or "
        f"a node name, got {value!r}"
    )


def _node_name(value: Any) -> str:
    return value.name if isinstance(value, Node) else str(value)


def _normalize_change(key: str, name: str, value: Any) -> Any:
    if name == "dtype":
        return _name_of(value, _DTYPES, "dtype", key)
    if name == "qscheme":
        return _name_of(value, _QSCHEMES, "qscheme", key)
    if name == "observer":
        return _name_of(value, _OBSERVERS, "observer", key)
    if name == "method":
        if value not in HISTOGRAM_METHODS:
            raise ConfigError(
                f"overrides[{key!r}]: method {value!r} is not one of {list(HISTOGRAM_METHODS)}"
            )
        return value
    if name == "percentile":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 100:
            raise ConfigError(
                f"overrides[{key!r}]: percentile must be a number in (0, 100], got {value!r}"
            )
        return float(value)
    if name == "quantize":
        if not isinstance(value, bool):
            raise ConfigError(f"overrides[{key!r}]: quantize must be True or False, got {value!r}")
        return value
    if name == "share_with":
        return _edge_text(value, key)
    if name == "scale":
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"overrides[{key!r}]: scale must be a number > 0, got {value!r}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int):  # quant_min/max, ch_axis, zero_point
        raise ConfigError(f"overrides[{key!r}]: {name} must be an int, got {value!r}")
    return value


def normalize_overrides(overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Check overrides and return them as plain JSON data (dtypes, qschemes as names).

    Example:
        >>> normalize_overrides({"conv2d": {"dtype": torch.uint8, "share_with": ("a", "b")}})
        {'conv2d': {'dtype': 'uint8', 'share_with': 'a -> b'}}
        >>> normalize_overrides({"conv2d": {"bits": 4}})
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: overrides['conv2d']: unknown change 'bits'; the changes are dtype, quant_min, quant_max, qscheme, ch_axis, observer, method, percentile, quantize, share_with, scale, zero_point
    """  # noqa: E501
    if not isinstance(overrides, Mapping):
        raise ConfigError(
            f"overrides must be a dict {{node, edge or module: {{change: value}}}}, got "
            f"{type(overrides).__name__}"
        )
    out: dict[str, dict[str, Any]] = {}
    for key, changes in overrides.items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"overrides: key {key!r} must be a node, edge or module name")
        if not isinstance(changes, Mapping) or not changes:
            raise ConfigError(f"overrides[{key!r}] must be a non-empty dict of changes")
        for name in changes:
            if name not in CHANGE_KEYS:
                raise ConfigError(
                    f"overrides[{key!r}]: unknown change {name!r}; the changes are "
                    f"{', '.join(CHANGE_KEYS)}"
                )
        out[key] = {n: _normalize_change(key, n, v) for n, v in changes.items()}
        if ("scale" in out[key]) != ("zero_point" in out[key]):
            raise ConfigError(f"overrides[{key!r}]: fixed qparams need both scale and zero_point")
    json.dumps(out)  # plain data, by construction
    return out


class OverrideQuantizer(WrappingQuantizer):
    """``base``'s annotations with ``overrides`` applied (see the module docstring).

    Args:
        base: the quantizer to run first (or None: start from an unannotated graph).
        overrides: ``{key: {change: value}}``; kept as normalised JSON data in ``.overrides``.
        default_spec: the spec for tensors that had none (``quantize=True`` on an operator the
            base left in float); default: int8 per-tensor affine activations, HistogramObserver.

    Example:
        >>> q = OverrideQuantizer(None, {"linear": {"quantize": True}})
        >>> q.overrides
        {'linear': {'quantize': True}}
    """

    def __init__(
        self,
        base: Any,
        overrides: Mapping[str, Mapping[str, Any]],
        *,
        default_spec: QuantizationSpec | None = None,
    ) -> None:
        if base is not None and not callable(getattr(base, "annotate", None)):
            raise ConfigError(f"base must be a quantizer or None, got {type(base).__name__}")
        self.base = base
        self.overrides = normalize_overrides(overrides)
        self.default_spec = default_spec or QuantizationSpec(
            dtype=torch.int8,
            observer_or_fake_quant_ctr=HistogramObserver.with_args(eps=_EPS),
            quant_min=-128,
            quant_max=127,
            qscheme=torch.per_tensor_affine,
        )

    def __repr__(self) -> str:
        return f"OverrideQuantizer({self.base!r}, {self.overrides!r})"

    def annotate(self, model: GraphModule) -> GraphModule:
        if self.base is not None:
            self.base.annotate(model)
        for key, changes in self.overrides.items():
            _Edit(model, key, changes, self.default_spec).apply()
        return model


class _Edit:
    """One override applied to a graph: find the tensors, then change their specs."""

    def __init__(self, model: GraphModule, key: str, changes: dict[str, Any], default: Any):
        self.model, self.key, self.changes, self.default = model, key, changes, default
        self.nodes = {n.name: n for n in model.graph.nodes}

    def apply(self) -> None:
        before = _snapshot(self.model)
        gone: set[Node] = set()
        for target in self._targets():
            if self.changes.get("quantize") is False:
                self._leave_float(target, gone)
            else:
                self._set(target, self._new_spec(target, before))
        if gone:
            _repair(self.model, gone, before)

    # -- which tensors -------------------------------------------------------------------------
    def _node(self, name: str) -> Node:
        node = self.nodes.get(name.strip())
        if node is None:
            raise ConfigError(
                f"overrides[{self.key!r}]: no node {name.strip()!r} in this graph "
                f"({closest_names(name.strip(), self.nodes)})"
            )
        return node

    def _targets(self) -> list[Node | tuple[Node, Node]]:
        key = self.key
        if "->" in key:
            producer, _, consumer = (s.strip() for s in key.partition("->"))
            p, c = self._node(producer), self._node(consumer)
            if p not in c.all_input_nodes:
                raise ConfigError(
                    f"overrides[{key!r}]: {producer} is not an input of {consumer}; inputs: "
                    f"{[n.name for n in c.all_input_nodes]}"
                )
            return [(p, c)]
        ops = [n for n in self.model.graph.nodes if n.op == "call_function"]
        if key.startswith("op:"):
            found = [n for n in ops if op_name(n) == key[3:]]
        elif key in self.nodes:
            found = [self.nodes[key]]
        else:
            found = [n for n in ops if inside_module(module_path(n), key)]
        if not found:
            known = {n.name for n in ops} | {module_path(n) for n in ops} - {""}
            raise ConfigError(
                f"overrides[{key!r}]: names no node, edge ('a -> b'), module or op type ('op:"
                f"conv2d') of this graph ({closest_names(key, known)})"
            )
        return found

    # -- what spec -----------------------------------------------------------------------------
    def _current(self, target: Any, before: dict[Any, Any]) -> Any:
        spec = before.get(target)
        return _resolve(spec, before) if spec is not None else None

    def _new_spec(self, target: Any, before: dict[Any, Any]) -> Any:
        if "share_with" in self.changes:
            other = self._share_target(self.changes["share_with"])
            self._check_same_kind(target, other)
            return SharedQuantizationSpec(other)
        current = self._current(target, before)
        return edited_spec(
            self.key, self.changes, current, self.default,
            constant=_is_constant(target), tensor=_text(target),
        )  # fmt: skip

    def _check_same_kind(self, target: Any, other: Any) -> None:
        """A weight (a constant) and an activation cannot share one observer."""
        mine, theirs = _is_constant(target), _is_constant(other)
        if mine != theirs:
            kinds = {True: "a weight (constant)", False: "an activation"}
            raise ConfigError(
                f"overrides[{self.key!r}]: share_with {self.changes['share_with']!r} is "
                f"{kinds[theirs]} but {_text(target)} is {kinds[mine]}: one observer cannot "
                f"measure both; share with another {kinds[mine].split(' (')[0].split()[-1]}"
            )

    def _share_target(self, text: str) -> Any:
        if "->" in text:
            producer, _, consumer = (s.strip() for s in text.partition("->"))
            return (self._node(producer), self._node(consumer))
        return self._node(text)

    # -- write it ------------------------------------------------------------------------------
    def _annotation(self, node: Node) -> Any:
        ann = node.meta.get(Q_ANNOTATION_KEY)
        if ann is None:
            ann = QuantizationAnnotation(_annotated=True)
            node.meta[Q_ANNOTATION_KEY] = ann
        return ann

    def _set(self, target: Any, spec: Any) -> None:
        if isinstance(target, tuple):
            producer, consumer = target
            self._annotation(consumer).input_qspec_map[producer] = spec
            return
        ann = self._annotation(target)
        if self.changes.get("quantize") is True and not ann.input_qspec_map:
            for arg in target.all_input_nodes:  # activations in, not weights
                if arg.op != "get_attr":
                    ann.input_qspec_map[arg] = copy.copy(self.default)
        ann.output_qspec = spec

    def _leave_float(self, target: Any, gone: set[Node]) -> None:
        if isinstance(target, tuple):
            producer, consumer = target
            ann = consumer.meta.get(Q_ANNOTATION_KEY)
            if ann is not None and producer in ann.input_qspec_map:
                ann.input_qspec_map[producer] = None
            return
        target.meta.pop(Q_ANNOTATION_KEY, None)
        record_float_reason(target, USER_FALLBACK, f"override {self.key!r}: quantize=False")
        gone.add(target)


def edited_spec(
    key: str,
    changes: Mapping[str, Any],
    current: Any,
    default: Any,
    *,
    constant: bool,
    tensor: str,
) -> Any:
    """The spec the override ``{key: changes}`` gives one tensor whose spec is ``current``
    (``default`` when it had none, or a shared / derived one); ``share_with`` and ``quantize``
    are the caller's. What :class:`OverrideQuantizer` writes, for a caller that wants the spec
    without annotating a graph (``qviz.numeric.diagnose`` measuring a remedy on one layer).

    Args:
        key: the override's key, named by errors.
        changes: normalised changes (:func:`normalize_overrides`).
        constant: whether the tensor is a constant (a weight: per-channel along axis 0).
        tensor: the tensor as text, named by errors.

    Example:
        >>> default = OverrideQuantizer(None, {}).default_spec
        >>> spec = edited_spec("fc", {"dtype": "int16"}, None, default, constant=False, tensor="fc")
        >>> spec.dtype, spec.quant_min, spec.quant_max
        (torch.int16, -32768, 32767)
    """
    if current is None or not isinstance(current, QuantizationSpec | FixedQParamsQuantizationSpec):
        current = default
    fields = _fields_of(current)
    fields.update({k: v for k, v in changes.items() if k in ("quant_min", "quant_max", "ch_axis")})
    if "dtype" in changes:
        fields["dtype"] = _DTYPES[changes["dtype"]]
        if "quant_min" not in changes and "quant_max" not in changes:
            fields["quant_min"], fields["quant_max"] = DTYPE_RANGES[fields["dtype"]]
    if "qscheme" in changes:
        fields["qscheme"] = _QSCHEMES[changes["qscheme"]]
    try:
        if "scale" in changes:
            return FixedQParamsQuantizationSpec(
                dtype=fields["dtype"],
                scale=changes["scale"],
                zero_point=changes["zero_point"],
                quant_min=fields["quant_min"],
                quant_max=fields["quant_max"],
                qscheme=fields["qscheme"],
            )
        per_channel = fields.get("qscheme") in _PER_CHANNEL_SCHEMES
        if per_channel and fields.get("ch_axis") is None:
            fields["ch_axis"] = 0 if constant else 1  # out-channels / channels
        fields["observer_or_fake_quant_ctr"] = _observer(changes, fields, current)
        if per_channel and not constant and fields.get("ch_axis") == 0:
            raise ConfigError(
                f"{tensor} is an activation: ch_axis=0 is its batch dimension, which changes "
                f"from batch to batch; use ch_axis=1 (its channels) or a per-tensor qscheme"
            )
        return QuantizationSpec(**fields)
    except ConfigError as exc:
        raise ConfigError(f"overrides[{key!r}]: {exc}") from None


def _observer(changes: Mapping[str, Any], fields: dict[str, Any], current: Any) -> Any:
    """The observer constructor of an edited spec: the one asked for, or the current one (its
    per-channel / per-tensor twin when the qscheme changed kind), keeping its arguments."""
    old = getattr(current, "observer_or_fake_quant_ctr", None)
    name = changes.get("observer") or _observer_name(old)
    per_channel = fields.get("qscheme") in _PER_CHANNEL_SCHEMES
    if per_channel:
        name = _PER_CHANNEL_TWIN.get(name, name)
    else:
        name = _PER_TENSOR_TWIN.get(name, name)
    if name not in _OBSERVERS:
        name = "PerChannelMinMaxObserver" if per_channel else "HistogramObserver"
    extra: dict[str, Any] = {}
    for option in ("method", "percentile"):
        if option in changes:
            if name != "HistogramObserver":
                raise ConfigError(
                    f"{option}={changes[option]!r} needs observer='HistogramObserver', not {name}"
                )
            extra[option] = changes[option]
    if old is not None and _observer_name(old) == name and hasattr(old, "with_args"):
        return old.with_args(**extra) if extra else old  # keeps its own arguments
    return _OBSERVERS[name].with_args(eps=_EPS, **extra)


def _is_constant(target: Any) -> bool:
    """Whether a tensor (edge or node output) is a constant such as a weight."""
    producer = target[0] if isinstance(target, tuple) else target
    return producer.op == "get_attr"


def _text(target: Any) -> str:
    return f"{target[0].name} -> {target[1].name}" if isinstance(target, tuple) else target.name


def _fields_of(spec: Any) -> dict[str, Any]:
    names = ("dtype", "quant_min", "quant_max", "qscheme", "ch_axis", "is_dynamic")
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name in names}
    fields.setdefault("ch_axis", None)
    return fields


def _observer_name(ctr: Any) -> str:
    cls = getattr(ctr, "p", None)
    cls = getattr(cls, "func", cls) if cls is not None else ctr
    return getattr(cls, "__name__", "HistogramObserver")
