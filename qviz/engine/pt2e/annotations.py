"""Read and check a quantizer's annotations: the ordered specs that sharing and prepare execute.

Annotations made with torchao's classes (or any look-alike) stay in ``node.meta`` as the quantizer
wrote them (a subclass keeps its own fields); qviz reads each through
:func:`~qviz.engine.specs.read_annotation`, a view in qviz's classes, so everything downstream
sees one set of types.

Example:
    >>> import torch
    >>> from qviz.engine.specs import QuantizationAnnotation, FixedQParamsQuantizationSpec
    >>> gm = torch.fx.symbolic_trace(torch.nn.Sigmoid())
    >>> x, sig = list(gm.graph.nodes)[:2]
    >>> out = FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=1 / 256, zero_point=0,
    ...     quant_min=0, quant_max=255)
    >>> sig.meta["quantization_annotation"] = QuantizationAnnotation({x: None}, out)
    >>> specs, implicit = collect_specs(gm)
    >>> [k.name for k in specs], implicit(sig)
    (['sigmoid'], True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.fx import GraphModule, Node

from qviz.engine.specs import (
    Q_ANNOTATION_KEY,
    EdgeOrNode,
    QuantizationSpecBase,
    map_spec_keys,
    read_annotation,
    with_specs,
)
from qviz.errors import AnnotationError


def out_arguments(node: Node) -> list[str]:
    """The keyword-only arguments ``node``'s operator writes its result into (``out=``)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    return [
        a.name
        for a in schema.arguments
        if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
    ]


def _check_edge(node: Node, producer: object) -> None:
    if not isinstance(producer, Node) or producer not in node.all_input_nodes:
        inputs = [n.name for n in node.all_input_nodes]
        raise AnnotationError(
            f"{node.format_node()}: input_qspec_map has a key {producer!r} that is not an input of "
            f"{node.name} (its inputs are {inputs}); key each input spec by the node that feeds it"
        )
    for name in out_arguments(node):
        if node.kwargs.get(name) is producer and producer not in node.args:
            raise AnnotationError(
                f"{node.format_node()}: input_qspec_map has a spec for {producer.name}, which "
                f"{node.name} only writes its result into ({name}=), so it is not an input; "
                f"quantize the result with output_qspec instead"
            )


def collect_specs(
    gm: GraphModule,
) -> tuple[dict[EdgeOrNode, QuantizationSpecBase], Callable[[Node], bool]]:
    """Every annotated edge and node output with its spec, in annotation order.

    Order: graph order; for each node its input edges (in ``input_qspec_map`` order), then its
    output. None specs (inputs left unquantized) are skipped.

    Returns:
        The specs, and whether a consumer allows implicit sharing on its input edges.

    Raises:
        AnnotationError: an input spec is keyed by a node that is not an input of the annotated
            node, or an annotation is not a QuantizationAnnotation.
    """
    specs: dict[EdgeOrNode, QuantizationSpecBase] = {}
    implicit: dict[Node, bool] = {}
    for node in gm.graph.nodes:
        annotation = read_annotation(node)
        if annotation is None:
            continue
        implicit[node] = annotation.allow_implicit_sharing
        for producer, spec in annotation.input_qspec_map.items():
            _check_edge(node, producer)
            if spec is not None:
                specs[(producer, node)] = spec
        if annotation.output_qspec is not None:
            specs[node] = annotation.output_qspec
    for key, spec in specs.items():
        _check_channel_axis(key, spec)
    return specs, lambda node: implicit.get(node, True)


_PER_CHANNEL = ("per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams")


def _reads_an_input(node: Node) -> bool:
    """Whether ``node``'s value is computed from a graph input (an activation), not only from
    parameters and constants."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n.op == "placeholder":
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return False


def _check_channel_axis(key: EdgeOrNode, spec: QuantizationSpecBase) -> None:
    """A per-channel spec on an activation's axis 0 (its batch axis) would give each sample
    its own scale, fixed at the calibration batch size: the converted model fails on any other
    batch. Refused, with the axis to use instead."""
    qscheme = str(getattr(spec, "qscheme", "")).replace("torch.", "")
    tensor = key[0] if isinstance(key, tuple) else key
    if qscheme not in _PER_CHANNEL or not _reads_an_input(tensor):
        return
    value = tensor.meta.get("val")
    ndim = getattr(value, "ndim", None)
    axis = getattr(spec, "ch_axis", None)
    if axis is None or ndim is None or axis % max(ndim, 1) != 0:
        return
    where = f"{key[0].name} -> {key[1].name}" if isinstance(key, tuple) else tensor.name
    raise AnnotationError(
        f"{where}: a per-channel spec ({qscheme}, ch_axis={axis}) on an activation's axis 0, "
        f"its batch axis (shape {list(value.shape)}): every sample would get its own scale, "
        f"fixed at the calibration batch size, and the converted model would fail on any other "
        f"batch; quantize activations per tensor, or per channel along the channel axis "
        f"(ch_axis=1 for NCHW)"
    )


def _rebind_key(key: Any, nodes: dict[str, Node]) -> Any:
    if isinstance(key, tuple):
        return tuple(_rebind_key(k, nodes) for k in key)
    if isinstance(key, Node):
        return nodes.get(key.name, key)
    return key


def rebind_annotations(gm: GraphModule) -> GraphModule:
    """Point the annotations of a copied graph at the copy's own nodes (in place).

    ``copy.deepcopy`` of a graph module copies ``node.meta`` but leaves the Node objects inside
    annotations (``input_qspec_map`` keys, shared and derived specs) pointing at the original
    graph; convert works on a copy, and the passes after it (one dequantize per consumer,
    metadata porting) follow annotation keys through the graph, so they are rebound by name.
    Each annotation keeps its own class and fields (see :func:`~qviz.engine.specs.with_specs`).

    Example:
        >>> import copy, torch
        >>> from qviz.engine.specs import QuantizationAnnotation
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> x, relu = list(gm.graph.nodes)[:2]
        >>> relu.meta["quantization_annotation"] = QuantizationAnnotation({x: None})
        >>> c = rebind_annotations(copy.deepcopy(gm))
        >>> key = next(iter(list(c.graph.nodes)[1].meta["quantization_annotation"].input_qspec_map))
        >>> key.graph is c.graph
        True
    """
    nodes = {n.name: n for n in gm.graph.nodes}

    def rebind(key: Any) -> Any:
        return _rebind_key(key, nodes)

    for node in gm.graph.nodes:
        annotation = node.meta.get(Q_ANNOTATION_KEY)
        if annotation is None:
            continue
        node.meta[Q_ANNOTATION_KEY] = with_specs(
            annotation,
            {
                _rebind_key(k, nodes): map_spec_keys(s, rebind)
                for k, s in annotation.input_qspec_map.items()
            },
            map_spec_keys(annotation.output_qspec, rebind),
        )
    return gm
