"""Metadata of quantized operators copied onto the quantize/dequantize nodes around them.

Lowering and debugging tools group a converted graph's nodes by metadata: a backend's
quantizer tags each partition it annotates (``node.meta["quantization_tag"]``), and its
partitioner then needs the q/dq nodes of that partition to carry the same tag; error messages
and profilers read ``stack_trace``. Convert creates the q/dq nodes, so it copies these keys
onto them by the reference's rules:

* the dequantize node on an annotated input edge takes the consumer's metadata (a dynamic
  edge's ``choose_qparams`` and quantize too); the quantize node on a weight (a ``get_attr``,
  possibly through view ops such as ``permute``) takes the weight's metadata, so the stored
  integer weight keeps it after folding;
* the quantize node on an annotated output takes the producer's metadata;
* nothing else: q/dq nodes around an operator the quantizer did not annotate stay untagged.

Example:
    ``[conv -> q] -> [dq -> avgpool -> q] -> [dq -> linear -> q]``: each bracket shares the
    tag of its operator, the first quantize and the last dequantize have none.
"""

from __future__ import annotations

from torch.fx import GraphModule, Node

from qviz.engine.graph.qdq_ops import chosen_by, dequantize_ops, is_qdq, quantize_ops
from qviz.engine.pt2e.passes.duplicate_dq import has_valid_annotation
from qviz.engine.specs import Q_ANNOTATION_KEY

#: The ``node.meta`` keys copied onto quantize/dequantize nodes.
METADATA_TO_PORT = ("stack_trace", "quantization_tag")

#: View-like ops between a weight and its quantize node that take the weight's metadata too.
_WEIGHT_VIEWS = (
    "flatten.using_ints", "permute.default", "permute_copy.default", "slice_copy.Tensor",
    "squeeze.dim", "squeeze_copy.dim", "transpose.int", "transpose_.default", "t.default",
    "view_copy.default", "view.default", "_mkldnn_transpose.default",
)  # fmt: skip


def _copy_meta(to_node: Node, from_node: Node) -> None:
    for key in METADATA_TO_PORT:
        if key in from_node.meta:
            to_node.meta[key] = from_node.meta[key]


def _source_of(dq: Node) -> Node:
    """The tensor a chain of quantize/dequantize ops starts from."""
    node = dq
    while is_qdq(node) and isinstance(node.args[0], Node):
        node = node.args[0]
    return node


def _input_dq(producer: Node, consumer: Node) -> Node | None:
    dequantize = dequantize_ops()
    for arg in consumer.all_input_nodes:
        if arg.op == "call_function" and arg.target in dequantize and _source_of(arg) is producer:
            return arg
    return None


def _weight_chain(q: Node) -> tuple[list[Node], Node | None]:
    """View ops from ``q`` back to a ``get_attr`` (and that get_attr), or ([], None)."""
    chain, node = [], q.args[0]
    while (
        isinstance(node, Node)
        and node.op == "call_function"
        and getattr(node.target, "__name__", "") in _WEIGHT_VIEWS
    ):
        chain.append(node)
        node = node.args[0]
    if isinstance(node, Node) and node.op == "get_attr":
        return chain, node
    return [], None


def _port_input(producer: Node, consumer: Node) -> None:
    dq = _input_dq(producer, consumer)
    if dq is None:
        return
    q = dq.args[0]
    if not (isinstance(q, Node) and q.op == "call_function" and q.target in quantize_ops()):
        return
    chosen = chosen_by(q)
    if chosen is not None:
        for node in (chosen, q, dq):
            _copy_meta(node, consumer)
        return
    chain, weight = _weight_chain(q)
    if weight is not None:
        for node in (q, *chain):
            _copy_meta(node, weight)
    _copy_meta(dq, consumer)


def _port_output(node: Node) -> None:
    quantize = quantize_ops()
    for user in node.users:
        if user.op == "call_function" and user.target in quantize:
            _copy_meta(user, node)


def port_metadata(gm: GraphModule) -> GraphModule:
    """Copy :data:`METADATA_TO_PORT` from annotated operators onto their q/dq nodes (in place).

    Run on a converted graph after
    :func:`qviz.engine.pt2e.passes.duplicate_dq.duplicate_dequantize`, so
    each consumer's dequantize is its own, and before weights are folded.
    """
    for node in gm.graph.nodes:
        if not has_valid_annotation(node):
            continue
        annotation = node.meta[Q_ANNOTATION_KEY]
        for producer, spec in annotation.input_qspec_map.items():
            if spec is not None and isinstance(producer, Node):
                _port_input(producer, node)
        if annotation.output_qspec is not None:
            _port_output(node)
    return gm
