"""Quantization specs and annotations: how each tensor of a graph should be quantized.

The classes mirror PyTorch 2 export quantization (field names and order included), so a quantizer
written for torchao ports by changing imports. A quantizer attaches a
:class:`QuantizationAnnotation` to ``node.meta["quantization_annotation"]``: one spec per input
edge ``(producer, node)`` and one for the node's output.

* :class:`QuantizationSpec`: observe this tensor and quantize it with the observed qparams.
* :class:`SharedQuantizationSpec`: use the same observer (hence qparams) as another edge or node.
* :class:`FixedQParamsQuantizationSpec`: known qparams, no observation (e.g. sigmoid's output).
* :class:`DerivedQuantizationSpec`: qparams computed from other observers (e.g. int32 bias with
  ``scale = act_scale * weight_scale``).

Specs and annotations made by torchao (or any look-alike) are accepted too: :func:`as_qspec`
recognises them by their fields and converts them. The quantizer's annotation object itself stays
in ``node.meta`` (a subclass keeps its extra fields, e.g. torchao's X86 annotation's
``_is_output_of_quantized_pattern``); qviz reads it through :func:`read_annotation`, a normalised
view, and rewrites its keys with :func:`with_specs`, which keeps the object's own type.

Example:
    >>> import torch
    >>> from qviz.engine.observers import MinMaxObserver
    >>> act = QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver,
    ...     quant_min=-128, quant_max=127,
    ...                        qscheme=torch.per_tensor_affine)
    >>> act.is_per_channel, act.is_symmetric
    (False, False)
    >>> QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver, quant_min=5,
    ...     quant_max=1)
    Traceback (most recent call last):
    ...
    qviz.errors.ConfigError: QuantizationSpec: quant_min 5 must be <= quant_max 1
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

import torch
from torch.fx import Node

from qviz.engine.qparams import DTYPE_RANGES
from qviz.errors import ConfigError

__all__ = [
    "Q_ANNOTATION_KEY",
    "DerivedQuantizationSpec",
    "EdgeOrNode",
    "FixedQParamsQuantizationSpec",
    "QuantizationAnnotation",
    "QuantizationConfig",
    "QuantizationSpec",
    "QuantizationSpecBase",
    "SharedQuantizationSpec",
    "as_annotation",
    "as_qspec",
    "map_spec_keys",
    "read_annotation",
    "with_specs",
]

Q_ANNOTATION_KEY = "quantization_annotation"

#: An input edge ``(producer, consumer)`` or a node (its output).
EdgeOrNode = Union[tuple[Node, Node], Node]  # noqa: UP007  (a runtime alias, like torchao's)

_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_symmetric)
_SYMMETRIC = (torch.per_tensor_symmetric, torch.per_channel_symmetric)


class QuantizationSpecBase:
    """Base of every spec type."""


def _check_range(owner: str, dtype: torch.dtype, quant_min, quant_max) -> None:
    if not isinstance(dtype, torch.dtype):
        raise ConfigError(f"{owner}: dtype must be a torch.dtype, got {dtype!r}")
    if quant_min is not None and quant_max is not None and quant_min > quant_max:
        raise ConfigError(f"{owner}: quant_min {quant_min} must be <= quant_max {quant_max}")
    limits = DTYPE_RANGES.get(dtype)
    if limits is None:
        return
    for name, value in (("quant_min", quant_min), ("quant_max", quant_max)):
        if value is not None and not limits[0] <= value <= limits[1]:
            raise ConfigError(
                f"{owner}: {name}={value} does not fit {dtype} (range {limits[0]}..{limits[1]}); "
                f"choose a range inside it, or a wider dtype"
            )


@dataclass(eq=True, frozen=True)
class QuantizationSpec(QuantizationSpecBase):
    """Observe a tensor and quantize it with the qparams its observer computes.

    Args:
        dtype: storage dtype of the quantized tensor (``torch.int8``, ``torch.uint8``, ...).
        observer_or_fake_quant_ctr: observer class (or ``.with_args(...)`` partial) to create.
        quant_min, quant_max: integer range (defaults: the dtype's full range).
        qscheme: ``torch.per_tensor_affine``, ``per_tensor_symmetric``, ``per_channel_affine`` or
            ``per_channel_symmetric``.
        ch_axis: channel axis for per-channel schemes.
        is_dynamic: qparams are computed at run time from each input (dynamic quantization).
    """

    dtype: torch.dtype
    observer_or_fake_quant_ctr: Callable[..., Any]
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: torch.qscheme | None = None
    ch_axis: int | None = None
    is_dynamic: bool = False

    def __post_init__(self) -> None:
        _check_range("QuantizationSpec", self.dtype, self.quant_min, self.quant_max)
        if self.ch_axis is not None and self.ch_axis < 0:
            raise ConfigError(f"QuantizationSpec: ch_axis must be >= 0, got {self.ch_axis}")
        if self.qscheme in _PER_CHANNEL and self.ch_axis is None:
            raise ConfigError(
                f"QuantizationSpec: qscheme {self.qscheme} needs ch_axis (e.g. 0 for conv weights)"
            )

    @property
    def is_per_channel(self) -> bool:
        return self.qscheme in _PER_CHANNEL

    @property
    def is_symmetric(self) -> bool:
        return self.qscheme in _SYMMETRIC


@dataclass(eq=True, frozen=True)
class FixedQParamsQuantizationSpec(QuantizationSpecBase):
    """Quantize with known ``scale`` and ``zero_point``; nothing is observed."""

    dtype: torch.dtype
    scale: float
    zero_point: int
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: torch.qscheme | None = None
    is_dynamic: bool = False

    def __post_init__(self) -> None:
        _check_range("FixedQParamsQuantizationSpec", self.dtype, self.quant_min, self.quant_max)
        if not self.scale > 0:
            raise ConfigError(f"FixedQParamsQuantizationSpec: scale must be > 0, got {self.scale}")


@dataclass(eq=True, frozen=True)
class SharedQuantizationSpec(QuantizationSpecBase):
    """Use the same observer as ``edge_or_node``: an edge ``(producer, consumer)`` or a node."""

    edge_or_node: EdgeOrNode


@dataclass(eq=True, frozen=True)
class DerivedQuantizationSpec(QuantizationSpecBase):
    """qparams computed by ``derive_qparams_fn(observers)`` from those of ``derived_from``."""

    derived_from: list[EdgeOrNode]
    derive_qparams_fn: Callable[[list[Any]], tuple[torch.Tensor, torch.Tensor]]
    dtype: torch.dtype
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: torch.qscheme | None = None
    ch_axis: int | None = None
    is_dynamic: bool = False

    def __post_init__(self) -> None:
        _check_range("DerivedQuantizationSpec", self.dtype, self.quant_min, self.quant_max)
        if not self.derived_from:
            raise ConfigError("DerivedQuantizationSpec: derived_from names no edge or node")

    def __hash__(self) -> int:  # derived_from is a list, as in torchao
        return hash((tuple(self.derived_from), self.derive_qparams_fn, self.dtype))


@dataclass
class QuantizationAnnotation:
    """How a node's inputs (per producer node) and output are quantized."""

    input_qspec_map: dict[Node, QuantizationSpecBase | None] = field(default_factory=dict)
    output_qspec: QuantizationSpecBase | None = None
    allow_implicit_sharing: bool = True
    _annotated: bool = False


@dataclass(eq=True, frozen=True)
class QuantizationConfig:
    """The specs a quantizer applies to an operator pattern: activations, weight, bias."""

    input_activation: QuantizationSpec | None
    output_activation: QuantizationSpec | None
    weight: QuantizationSpec | None
    bias: QuantizationSpec | Callable[..., Any] | None
    is_qat: bool = False

    def get_input_act_qspec(self) -> QuantizationSpec | None:
        return self.input_activation

    def get_output_act_qspec(self) -> QuantizationSpec | None:
        return self.output_activation

    def get_weight_qspec(self) -> QuantizationSpec | None:
        return self.weight

    def get_bias_qspec(self) -> QuantizationSpec | Callable[..., Any] | None:
        return self.bias


_KINDS: tuple[tuple[type, tuple[str, ...]], ...] = (
    (SharedQuantizationSpec, ("edge_or_node",)),
    (DerivedQuantizationSpec, ("derived_from", "derive_qparams_fn")),
    (FixedQParamsQuantizationSpec, ("scale", "zero_point", "dtype")),
    (QuantizationSpec, ("observer_or_fake_quant_ctr", "dtype")),
)


def as_qspec(spec: Any, where: str = "") -> QuantizationSpecBase | None:
    """qviz's spec for ``spec``: itself, or a converted look-alike (e.g. torchao's), or None.

    Example:
        >>> as_qspec(None) is None
        True
    """
    if spec is None or isinstance(spec, QuantizationSpecBase):
        return spec
    for cls, required in _KINDS:
        if all(hasattr(spec, name) for name in required):
            names = cls.__dataclass_fields__
            fields = {n: getattr(spec, n) for n in names if hasattr(spec, n)}
            return cls(**_default_ch_axis(fields, where))
    raise ConfigError(
        f"{where or 'annotation'}: {type(spec).__name__} is not a quantization spec; use "
        f"QuantizationSpec, SharedQuantizationSpec, FixedQParamsQuantizationSpec or "
        f"DerivedQuantizationSpec"
    )


def _default_ch_axis(fields: dict[str, Any], where: str) -> dict[str, Any]:
    """A foreign per-channel spec without ``ch_axis`` gets 0, with a warning naming the edge.

    torchao accepts such a spec and its per-channel observers then use their own default axis,
    0 (the output channels of conv and linear weights, the input channels of a transposed conv
    weight); qviz's own QuantizationSpec asks for the axis instead.
    """
    if fields.get("qscheme") not in _PER_CHANNEL or fields.get("ch_axis") is not None:
        return fields
    warnings.warn(
        f"{where or 'annotation'}: a per-channel spec ({fields['qscheme']}) without ch_axis; "
        f"using ch_axis=0 as torchao's per-channel observers do (the output channels of a conv "
        f"or linear weight, the input channels of a transposed conv's): set ch_axis in the "
        f"quantizer's spec to choose",
        stacklevel=4,
    )
    return fields | {"ch_axis": 0}


def _is_native(annotation: Any) -> bool:
    """An annotation of qviz's class (or a subclass) whose specs are all qviz's."""
    if not isinstance(annotation, QuantizationAnnotation):
        return False
    specs = [*annotation.input_qspec_map.values(), annotation.output_qspec]
    return all(s is None or isinstance(s, QuantizationSpecBase) for s in specs)


def as_annotation(annotation: Any, node: Node) -> QuantizationAnnotation:
    """qviz's view of a node's ``quantization_annotation`` meta (any look-alike).

    A qviz annotation with qviz specs is returned as it is; any other (torchao's, a subclass
    with fields of its own) gets a new qviz annotation with converted specs, keyed by the same
    nodes. The original object is not changed.

    Example:
        >>> import torch
        >>> x = torch.fx.Graph().placeholder("x")
        >>> ann = QuantizationAnnotation()
        >>> as_annotation(ann, x) is ann
        True
    """
    if _is_native(annotation):
        return annotation
    where = node.format_node()
    if not hasattr(annotation, "input_qspec_map") or not hasattr(annotation, "output_qspec"):
        raise ConfigError(
            f"{where}: meta['{Q_ANNOTATION_KEY}'] is a {type(annotation).__name__}, not a "
            f"QuantizationAnnotation"
        )
    return QuantizationAnnotation(
        input_qspec_map={
            arg: as_qspec(spec, f"{where} input {arg}")
            for arg, spec in annotation.input_qspec_map.items()
        },
        output_qspec=as_qspec(annotation.output_qspec, f"{where} output"),
        allow_implicit_sharing=bool(getattr(annotation, "allow_implicit_sharing", True)),
        _annotated=bool(getattr(annotation, "_annotated", False)),
    )


def read_annotation(node: Node) -> QuantizationAnnotation | None:
    """qviz's view of ``node``'s annotation (see :func:`as_annotation`), or None.

    Example:
        >>> import torch
        >>> read_annotation(torch.fx.Graph().placeholder("x")) is None
        True
    """
    raw = node.meta.get(Q_ANNOTATION_KEY)
    return None if raw is None else as_annotation(raw, node)


def with_specs(annotation: Any, input_qspec_map: dict[Any, Any], output_qspec: Any) -> Any:
    """A shallow copy of ``annotation`` (its own class, every other field kept) with these specs.

    Example:
        >>> ann = QuantizationAnnotation(_annotated=True)
        >>> new = with_specs(ann, {}, None)
        >>> new is not ann and new == ann
        True
    """
    new = copy.copy(annotation)
    try:
        new.input_qspec_map = input_qspec_map
        new.output_qspec = output_qspec
    except (AttributeError, TypeError):  # a frozen look-alike
        object.__setattr__(new, "input_qspec_map", input_qspec_map)
        object.__setattr__(new, "output_qspec", output_qspec)
    return new


def map_spec_keys(spec: Any, key: Callable[[Any], Any]) -> Any:
    """``spec`` with the edges / nodes it refers to (shared, derived) passed through ``key``;
    the spec keeps its own class (qviz's or a look-alike's).

    Example:
        >>> map_spec_keys(None, lambda k: k) is None
        True
    """
    if spec is None:
        return None
    if hasattr(spec, "edge_or_node"):
        return _replaced(spec, edge_or_node=key(spec.edge_or_node))
    if hasattr(spec, "derived_from"):
        return _replaced(spec, derived_from=[key(k) for k in spec.derived_from])
    return spec


def _replaced(spec: Any, **changes: Any) -> Any:
    if dataclasses.is_dataclass(spec):
        return dataclasses.replace(spec, **changes)
    new = copy.copy(spec)
    for name, value in changes.items():
        object.__setattr__(new, name, value)
    return new
