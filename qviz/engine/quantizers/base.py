"""The Quantizer contract, and ComposableQuantizer to run several quantizers on one graph.

A quantizer decides *what* to quantize: it writes a
:class:`~qviz.engine.specs.QuantizationAnnotation` into ``node.meta["quantization_annotation"]``
of the nodes it claims. prepare then executes the annotations. The contract is PyTorch 2 export
quantization's, so torchao-style quantizers port by changing imports.

A node a quantizer leaves in float may say why in ``node.meta["qviz_float_reason"]`` (one of
:data:`FLOAT_REASONS`) with a short ``node.meta["qviz_float_detail"]``; the QuantPlan reports it.

Example:
    >>> import torch
    >>> from qviz.engine.specs import QuantizationAnnotation
    >>> class Outputs(Quantizer):
    ...     '''Claims every relu's output (no observer: spec None, for the example).'''
    ...     def annotate(self, model):
    ...         for node in model.graph.nodes:
    ...             if node.target == torch.relu:
    ...                 node.meta["quantization_annotation"] = QuantizationAnnotation(
    ...                     _annotated=True)
    ...         return model
    ...     def validate(self, model):
    ...         pass
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.relu(x))
    >>> ComposableQuantizer([Outputs(), Outputs()]).annotate(gm)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    qviz.errors.AnnotationError: %relu ... was annotated by quantizer #0 (Outputs) and then ...
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from torch.fx import GraphModule, Node

from qviz.engine.specs import Q_ANNOTATION_KEY
from qviz.errors import AnnotationError, ConfigError

#: ``node.meta`` key: why a quantizer left the node in float (one of :data:`FLOAT_REASONS`).
FLOAT_REASON_KEY = "qviz_float_reason"
#: ``node.meta`` key: a short human-readable detail for the float reason.
FLOAT_DETAIL_KEY = "qviz_float_detail"
#: ``node.meta`` key: the quantized operator whose int8 kernel runs this node as a fused post
#: op (a relu or add after a conv); the QuantPlan does not count such a node as left in float.
FUSED_INTO_KEY = "qviz_fused_into"
#: The reasons a quantizer may record (the QuantPlan's vocabulary).
FLOAT_REASONS = (
    "filtered by module name",
    "filtered by module type",
    "dtype constraint violated",
    "pattern unsupported",
    "user fallback",
)


class Quantizer(ABC):
    """Base class of quantizers: annotate a captured graph with quantization specs.

    Subclasses implement :meth:`annotate` and :meth:`validate`; :meth:`transform_for_annotation`
    and :meth:`prepare_obs_or_fq_callback` are optional hooks.

    Example:
        >>> class Nothing(Quantizer):
        ...     def annotate(self, model):
        ...         return model
        ...     def validate(self, model):
        ...         pass
        >>> Nothing().transform_for_annotation("graph")
        'graph'
    """

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Rewrite ``model`` before annotation (e.g. scalars into tensors); default: unchanged.

        Example:
            >>> class Q(Quantizer):
            ...     annotate = validate = lambda self, model: model
            >>> Q().transform_for_annotation(1)
            1
        """
        return model

    @abstractmethod
    def annotate(self, model: GraphModule) -> GraphModule:
        """Write ``quantization_annotation`` into the nodes to quantize; return ``model``.

        Example: see the module docstring (a quantizer claiming every relu).
        """

    @abstractmethod
    def validate(self, model: GraphModule) -> None:
        """Check the annotated ``model`` can be executed by this quantizer's backend.

        Raise a :class:`~qviz.errors.QvizError` subclass naming the node and the fix.

        Example: ``XNNPACKQuantizer().validate(gm)`` (nothing to check there).
        """

    def prepare_obs_or_fq_callback(
        self, model: GraphModule, edge_or_node_to_obs_or_fq: dict[Any, Any]
    ) -> None:
        """Adjust the observers prepare created (keyed by edge or node) before they are inserted.

        Default: nothing.

        Example:
            >>> class Q(Quantizer):
            ...     annotate = validate = lambda self, model: model
            >>> Q().prepare_obs_or_fq_callback(None, {}) is None
            True
        """
        return None


def _fingerprint(annotation: Any) -> tuple:
    """What identifies an annotation's content: the object, its specs (by identity) and flags."""
    inputs = getattr(annotation, "input_qspec_map", None) or {}
    return (
        id(annotation),
        tuple((id(node), id(spec)) for node, spec in inputs.items()),
        id(getattr(annotation, "output_qspec", None)),
        getattr(annotation, "allow_implicit_sharing", True),
        getattr(annotation, "_annotated", False),
    )


def _label(index: int, quantizer: Quantizer) -> str:
    return f"quantizer #{index} ({type(quantizer).__name__})"


class ComposableQuantizer(Quantizer):
    """Run several quantizers in order on one graph, each annotating the nodes it claims.

    A later quantizer must leave alone what an earlier one annotated: changing, replacing or
    removing an annotation raises :class:`~qviz.errors.AnnotationError` naming the node and both
    quantizers (torchao's ComposableQuantizer only notices replaced annotation objects).

    Args:
        quantizers: the quantizers, highest priority first.

    Example:
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> dynamic = XNNPACKQuantizer().set_global(
        ...     get_symmetric_quantization_config(is_dynamic=True))
        >>> static = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> len(ComposableQuantizer([dynamic, static]).quantizers)
        2
    """

    def __init__(self, quantizers: Sequence[Quantizer]) -> None:
        quantizers = list(quantizers)
        for index, quantizer in enumerate(quantizers):
            if not callable(getattr(quantizer, "annotate", None)):
                raise ConfigError(
                    f"ComposableQuantizer: item #{index} ({type(quantizer).__name__}) has no "
                    f"annotate() method; pass Quantizer instances"
                )
        self.quantizers = quantizers

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Apply every quantizer's transform, in order.

        Example:
            >>> import torch
            >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
            >>> ComposableQuantizer([]).transform_for_annotation(gm) is gm
            True
        """
        for quantizer in self.quantizers:
            model = quantizer.transform_for_annotation(model)
        return model

    def annotate(self, model: GraphModule) -> GraphModule:
        """Let each quantizer annotate in turn; raise if one changes another's annotation.

        Raises:
            AnnotationError: a quantizer changed, replaced or removed the annotation of a node
                that an earlier quantizer annotated.

        Example: see the module docstring (two quantizers claiming the same relu).
        """
        owners: dict[Node, tuple[int, tuple]] = {}
        for index, quantizer in enumerate(self.quantizers):
            model = quantizer.annotate(model) or model
            self._claim(model, index, owners)
        _clear_reasons_of_annotated(model)
        return model

    def _claim(self, model: GraphModule, index: int, owners: dict[Node, tuple[int, tuple]]) -> None:
        for node in model.graph.nodes:
            annotation = node.meta.get(Q_ANNOTATION_KEY)
            previous = owners.get(node)
            if previous is not None and (
                annotation is None or _fingerprint(annotation) != previous[1]
            ):
                raise self._conflict(node, previous[0], index, annotation is None)
            if previous is None and annotation is not None:
                owners[node] = (index, _fingerprint(annotation))

    def _conflict(self, node: Node, first: int, later: int, removed: bool) -> AnnotationError:
        done = "removed" if removed else "re-annotated"
        return AnnotationError(
            f"{node.format_node()} was annotated by {_label(first, self.quantizers[first])} and "
            f"then {done} by {_label(later, self.quantizers[later])}; a node belongs to one "
            f"quantizer. Restrict one of them (e.g. set_module_name / set_module_type / "
            f"set_operator_type with None on the other), or make the later quantizer skip nodes "
            f"whose annotation has _annotated=True"
        )

    def quantization_capabilities(self) -> list[Any]:
        """Every member's capability records, in order; a member that does not declare its
        capabilities gets one row saying so (nothing is hidden).

        Example:
            >>> ComposableQuantizer([]).quantization_capabilities()
            []
        """
        from qviz.engine.quantizers.capabilities import Capability

        rows: list[Any] = []
        for quantizer in self.quantizers:
            declare = getattr(quantizer, "quantization_capabilities", None)
            if callable(declare):
                rows.extend(declare())
            else:
                name = type(quantizer).__name__
                rows.append(
                    Capability(
                        quantizer=name,
                        pattern="(not declared)",
                        observation="unknown",
                        input="?",
                        output="?",
                        weight="?",
                        bias="?",
                    )
                )
        return rows

    def validate(self, model: GraphModule) -> None:
        """Run every quantizer's validate.

        Example:
            >>> ComposableQuantizer([]).validate(None)
        """
        for quantizer in self.quantizers:
            quantizer.validate(model)

    def prepare_obs_or_fq_callback(
        self, model: GraphModule, edge_or_node_to_obs_or_fq: dict[Any, Any]
    ) -> None:
        """Run every quantizer's callback, in order.

        Example:
            >>> ComposableQuantizer([]).prepare_obs_or_fq_callback(None, {})
        """
        for quantizer in self.quantizers:
            quantizer.prepare_obs_or_fq_callback(model, edge_or_node_to_obs_or_fq)


def _clear_reasons_of_annotated(model: GraphModule) -> None:
    """Drop float reasons an earlier quantizer left on nodes a later one annotated."""
    for node in model.graph.nodes:
        if node.meta.get(Q_ANNOTATION_KEY) is not None:
            node.meta.pop(FLOAT_REASON_KEY, None)
            node.meta.pop(FLOAT_DETAIL_KEY, None)
