"""FallbackQuantizer: another quantizer's annotations, minus the nodes the user keeps in float.

The base quantizer annotates first; then every named node loses its annotation and records the
float reason ``"user fallback"`` (the QuantPlan shows it). A name is a node name (``"conv2d_2"``)
or a module path (``"block.conv1"``: every node whose ``nn_module_stack`` is that module or
inside it).

Removing a node's annotation can leave others pointing at it: max pooling shares its input's
observer with the relu before it (``SharedQuantizationSpec(relu)``). When the relu falls back,
that edge keeps the spec it resolved to (its own observer, the same settings), so the rest of
the model is quantized as before. A DerivedQuantizationSpec that derives from a removed tensor
cannot be kept: that is an AnnotationError naming both nodes.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    >>> gm = qviz.export(model, (torch.randn(2, 4),))
    >>> base = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> plan = qviz.prepare_pt2e(gm, FallbackQuantizer(base, ["2"])).plan
    >>> [(f.node, f.reason.value) for f in plan.float_nodes]
    [('linear_1', 'user fallback')]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch.fx import GraphModule, Node

from qviz.engine.quantizers.annotate import USER_FALLBACK, record_float_reason
from qviz.engine.quantizers.base import Quantizer
from qviz.engine.specs import Q_ANNOTATION_KEY
from qviz.errors import AnnotationError, ConfigError, closest_names


def module_path(node: Node) -> str:
    """The innermost module path of ``node`` (``""`` for the top level).

    Example:
        >>> import torch, qviz
        >>> gm = qviz.export(torch.nn.Sequential(torch.nn.ReLU()), (torch.randn(2),))
        >>> [module_path(n) for n in gm.graph.nodes if n.op == "call_function"]
        ['0']
    """
    path = ""
    for value in (node.meta.get("nn_module_stack") or {}).values():
        if isinstance(value, tuple) and len(value) == 2:
            path = str(value[0])
    return path


def inside_module(path: str, prefix: str) -> bool:
    """Whether the module ``path`` is ``prefix`` or one of its submodules.

    Example:
        >>> inside_module("block.conv1", "block"), inside_module("blocks", "block")
        (True, False)
    """
    return bool(path) and (path == prefix or path.startswith(f"{prefix}."))


class WrappingQuantizer(Quantizer):
    """A quantizer that edits what ``base`` annotates (``base`` None: an unannotated graph);
    the transform, validation and observer callback are ``base``'s.

    Example:
        >>> from qviz.engine.quantizers import XNNPACKQuantizer
        >>> FallbackQuantizer(XNNPACKQuantizer(), "fc").base.__class__.__name__
        'XNNPACKQuantizer'
    """

    base: Any = None

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        transform = getattr(self.base, "transform_for_annotation", None)
        return transform(model) if transform is not None else model

    def validate(self, model: GraphModule) -> None:
        if self.base is not None:
            self.base.validate(model)

    def prepare_obs_or_fq_callback(self, model: GraphModule, edge_or_node_to_obs: Any) -> None:
        callback = getattr(self.base, "prepare_obs_or_fq_callback", None)
        if callback is not None:
            callback(model, edge_or_node_to_obs)


def _names(nodes_or_module_names: Any) -> tuple[str, ...]:
    if isinstance(nodes_or_module_names, str | Node):
        nodes_or_module_names = [nodes_or_module_names]
    if not isinstance(nodes_or_module_names, Iterable):
        raise ConfigError(
            f"fallback needs node names or module paths (a string or a list of them), got "
            f"{type(nodes_or_module_names).__name__}"
        )
    names = []
    for item in nodes_or_module_names:
        name = item.name if isinstance(item, Node) else item
        if not isinstance(name, str) or not name:
            raise ConfigError(f"fallback: {item!r} is not a node name or module path")
        names.append(name)
    if not names:
        raise ConfigError("fallback needs at least one node name or module path")
    return tuple(dict.fromkeys(names))


class FallbackQuantizer(WrappingQuantizer):
    """``base``'s annotations with the named nodes (or modules) left in float.

    Args:
        base: the quantizer to run first.
        names: node names and/or module paths to keep in float.

    Example:
        >>> from qviz.engine.quantizers import XNNPACKQuantizer
        >>> FallbackQuantizer(XNNPACKQuantizer(), ["conv2d_2", "head"]).names
        ('conv2d_2', 'head')
    """

    def __init__(self, base: Any, names: Sequence[str] | str) -> None:
        for method in ("annotate", "validate"):
            if not callable(getattr(base, method, None)):
                raise ConfigError(
                    f"fallback needs a quantizer to start from; {type(base).__name__} has no "
                    f"{method}() method"
                )
        self.base = base
        self.names = _names(names)

    def __repr__(self) -> str:
        return f"FallbackQuantizer({self.base!r}, {list(self.names)!r})"

    def annotate(self, model: GraphModule) -> GraphModule:
        self.base.annotate(model)
        targets = self._targets(model)
        before = _snapshot(model)
        for node in targets:
            node.meta.pop(Q_ANNOTATION_KEY, None)
            record_float_reason(node, USER_FALLBACK, f"fallback({self._reason(node)!r})")
        _repair(model, set(targets), before)
        return model

    def _reason(self, node: Node) -> str:
        if node.name in self.names:
            return node.name
        path = module_path(node)
        return next(n for n in self.names if inside_module(path, n))

    def _targets(self, model: GraphModule) -> list[Node]:
        ops = [n for n in model.graph.nodes if n.op == "call_function"]
        paths = {module_path(n) for n in ops}
        unknown = [
            name
            for name in self.names
            if not any(n.name == name for n in ops)
            and not any(inside_module(p, name) for p in paths)
        ]
        if unknown:
            known = {n.name for n in ops} | {p for p in paths if p}
            hints = "; ".join(f"{u!r}: {closest_names(u, known)}" for u in unknown)
            raise ConfigError(
                f"fallback: {unknown} name no operator or module of this graph ({hints}); give "
                f"node names as in the plan (e.g. 'conv2d_2') or module paths (e.g. 'block.conv1')"
            )
        return [
            n
            for n in ops
            if n.name in self.names or any(inside_module(module_path(n), m) for m in self.names)
        ]


def _snapshot(model: GraphModule) -> dict[Any, Any]:
    """Every annotated tensor's spec: edges ``(producer, consumer)`` and node outputs."""
    specs: dict[Any, Any] = {}
    for node in model.graph.nodes:
        ann = node.meta.get(Q_ANNOTATION_KEY)
        if ann is None:
            continue
        for arg, spec in ann.input_qspec_map.items():
            specs[(arg, node)] = spec
        if ann.output_qspec is not None:
            specs[node] = ann.output_qspec
    return specs


def _resolve(spec: Any, before: dict[Any, Any]) -> Any:
    """Follow SharedQuantizationSpec links to the concrete spec they end in (None if none)."""
    seen = set()
    while spec is not None and hasattr(spec, "edge_or_node"):
        key = spec.edge_or_node
        if key in seen:
            return None
        seen.add(key)
        spec = before.get(key)
    return spec


def _removed(key: Any, gone: set[Node]) -> bool:
    return key[1] in gone if isinstance(key, tuple) else key in gone


def _repair(model: GraphModule, gone: set[Node], before: dict[Any, Any]) -> None:
    """Re-point specs that shared with (or derived from) a removed tensor."""
    for node in model.graph.nodes:
        ann = node.meta.get(Q_ANNOTATION_KEY)
        if ann is None:
            continue
        for arg, spec in list(ann.input_qspec_map.items()):
            ann.input_qspec_map[arg] = _repaired(spec, node, gone, before)
        ann.output_qspec = _repaired(ann.output_qspec, node, gone, before)


def _repaired(spec: Any, node: Node, gone: set[Node], before: dict[Any, Any]) -> Any:
    if spec is None:
        return None
    if hasattr(spec, "derived_from"):
        lost = [k for k in spec.derived_from if _removed(k, gone)]
        if lost:
            raise AnnotationError(
                f"{node.format_node()} has a DerivedQuantizationSpec computed from "
                f"{[str(k) for k in lost]}, which fell back to float: fall back "
                f"{node.name!r} too, or keep those nodes quantized"
            )
        return spec
    if hasattr(spec, "edge_or_node") and _removed(spec.edge_or_node, gone):
        return _resolve(spec, before)
    return spec
