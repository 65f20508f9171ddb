"""Writing annotations: claim nodes, attach specs, and say why a node stays in float.

The helpers follow the PT2E conventions: a pattern is claimed once (``_annotated=True`` on every
node of it, weights included, so later patterns skip it), input specs are keyed by the producer
node, and a node left in float records its reason under ``node.meta["qviz_float_reason"]``.

Example:
    >>> import torch
    >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    >>> x, relu = list(gm.graph.nodes)[:2]
    >>> is_annotated([relu])
    False
    >>> annotate(relu, {x: None}, None)
    >>> is_annotated([relu]), is_annotated([x])
    (True, False)
    >>> record_float_reason(x, PATTERN_UNSUPPORTED, "a placeholder")
    >>> x.meta["qviz_float_reason"]
    'pattern unsupported'
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.fx import GraphModule, Node

from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.quantizers.base import FLOAT_DETAIL_KEY, FLOAT_REASON_KEY
from qviz.engine.specs import Q_ANNOTATION_KEY, QuantizationAnnotation, QuantizationSpecBase

FILTERED_BY_MODULE_NAME = "filtered by module name"
FILTERED_BY_MODULE_TYPE = "filtered by module type"
DTYPE_CONSTRAINT = "dtype constraint violated"
PATTERN_UNSUPPORTED = "pattern unsupported"
USER_FALLBACK = "user fallback"

#: torch.histc (inside HistogramObserver) works up to this magnitude.
_HISTC_UPPER_BOUND = 3.4028235e15


def is_annotated(nodes: Iterable[Node | None]) -> bool:
    """Whether any of ``nodes`` is already claimed (``_annotated=True``) by a pattern.

    Example:
        >>> is_annotated([None])
        False
    """
    for node in nodes:
        if node is None:
            continue
        annotation = node.meta.get(Q_ANNOTATION_KEY)
        if annotation is not None and getattr(annotation, "_annotated", False):
            return True
    return False


def output_is_annotated(node: Node) -> bool:
    """Whether ``node`` is claimed and its output has a spec (so consumers can share it).

    Example:
        >>> import torch
        >>> output_is_annotated(torch.fx.Graph().placeholder("x"))
        False
    """
    annotation = node.meta.get(Q_ANNOTATION_KEY)
    return (
        annotation is not None
        and getattr(annotation, "_annotated", False)
        and annotation.output_qspec is not None
    )


def mark_annotated(
    nodes: Iterable[Node | None], annotation: type[QuantizationAnnotation] = QuantizationAnnotation
) -> None:
    """Claim ``nodes`` (weights and biases too), creating empty ``annotation`` objects (a
    quantizer's own annotation class, if it has one) where needed; existing ones are kept.

    Example:
        >>> import torch
        >>> w = torch.fx.Graph().placeholder("w")
        >>> mark_annotated([w, None])
        >>> w.meta["quantization_annotation"]._annotated
        True
    """
    for node in nodes:
        if node is None:
            continue
        if node.meta.get(Q_ANNOTATION_KEY) is None:
            node.meta[Q_ANNOTATION_KEY] = annotation()
        node.meta[Q_ANNOTATION_KEY]._annotated = True


def annotate(
    node: Node,
    input_qspec_map: dict[Node, QuantizationSpecBase | None],
    output_qspec: QuantizationSpecBase | None,
) -> None:
    """Give ``node`` a fresh, claimed annotation with these input and output specs.

    Example:
        >>> import torch
        >>> n = torch.fx.Graph().placeholder("x")
        >>> annotate(n, {}, None)
        >>> n.meta["quantization_annotation"]
        QuantizationAnnotation(input_qspec_map={}, output_qspec=None, allow_implicit_sharing=True, _annotated=True)
    """  # noqa: E501
    node.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
        input_qspec_map=dict(input_qspec_map), output_qspec=output_qspec, _annotated=True
    )
    node.meta.pop(FLOAT_REASON_KEY, None)
    node.meta.pop(FLOAT_DETAIL_KEY, None)


def record_float_reason(node: Node, reason: str, detail: str) -> None:
    """Say why ``node`` stays in float (read by the QuantPlan).

    Example:
        >>> import torch
        >>> n = torch.fx.Graph().placeholder("x")
        >>> record_float_reason(n, USER_FALLBACK, "no global config")
        >>> n.meta["qviz_float_detail"]
        'no global config'
    """
    node.meta[FLOAT_REASON_KEY] = reason
    node.meta[FLOAT_DETAIL_KEY] = detail


def _constant(gm: GraphModule, node: Node) -> torch.Tensor | None:
    value = get_attr_value(gm, node, default=None)
    return value if isinstance(value, torch.Tensor) else None


def float_input_problem(gm: GraphModule, node: Node) -> str | None:
    """Why observers cannot watch the tensor ``node`` produces (None when they can).

    Observers need float32 tensors, and torch.histc (inside HistogramObserver) fails on
    scalars beyond about 3.4e15.

    Example:
        >>> import torch
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> float_input_problem(gm, list(gm.graph.nodes)[0])
        "input_1 has no example value (meta['val']); its dtype is unknown"
    """
    if node.op == "get_attr":
        value = _constant(gm, node)
        if value is not None and value.numel() == 1 and abs(value.item()) > _HISTC_UPPER_BOUND:
            return f"{node.name} is the scalar {value.item():.3g}, too large for the histogram"
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return f"{node.name} has no example value (meta['val']); its dtype is unknown"
    if val.dtype != torch.float32:
        return f"{node.name} is a {val.dtype} tensor; observers need torch.float32"
    return None
