"""One dequantize per consumer: the converted-graph layout backends pattern-match on.

After convert, a quantized tensor read by several quantized operators would have one
``dequantize`` feeding all of them. A backend partitioner (XNNPACK / ExecuTorch lowering, the
x86 Inductor passes) matches ``dequantize -> op -> quantize`` per operator and lowers each
match on its own, so each annotated consumer gets its own copy of the dequantize node; consumers
without an annotation (float operators, the graph output) keep sharing the original one. The
arithmetic is unchanged: every copy has the same input and arguments.

Dynamic quantization (``choose_qparams -> getitem -> quantize -> dequantize``) is left shared,
as in the reference: its dequantize computes nothing a second consumer could not reuse.

Example:
    ``conv -> q -> dq`` read by ``add`` and ``mul`` (both annotated) and by the output becomes
    ``conv -> q -> dq_1 -> add``, ``q -> dq_2 -> mul`` and ``q -> dq -> output``.

    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> class M(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ...     def forward(self, x):
    ...         return self.a(x), self.b(x)
    >>> gm = qviz.export(M().eval(), (torch.randn(2, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> _ = qviz.calibrate(prepared, torch.randn(2, 4), progress=False)
    >>> converted = qviz.convert_pt2e(prepared)
    >>> x = next(n for n in converted.graph.nodes if n.op == "placeholder")
    >>> q = next(u for u in x.users if "quantize" in u.name)
    >>> len(q.users)  # one dequantize for each linear
    2
"""

from __future__ import annotations

from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from qviz.engine.graph.qdq_ops import chosen_by, dequantize_ops, is_sym_size, quantize_ops
from qviz.engine.specs import Q_ANNOTATION_KEY


def has_valid_annotation(node: Node) -> bool:
    """``node`` carries a quantization annotation that asks for something (an input or output)."""
    annotation = node.meta.get(Q_ANNOTATION_KEY)
    if annotation is None:
        return False
    return bool(annotation.input_qspec_map) or annotation.output_qspec is not None


def _is_dynamic(dq: Node) -> bool:
    """``dq`` ends ``choose_qparams -> getitem -> quantize -> dequantize``."""
    q = dq.args[0]
    if not (isinstance(q, Node) and q.op == "call_function" and q.target in quantize_ops()):
        return False
    return chosen_by(q) is not None


def _give_own_copy(gm: GraphModule, dq: Node, user: Node) -> None:
    with gm.graph.inserting_after(dq):
        copy = gm.graph.node_copy(dq)
    user.args = map_arg(user.args, lambda n: copy if n is dq else n)
    user.kwargs = map_arg(user.kwargs, lambda n: copy if n is dq else n)


def duplicate_dequantize(gm: GraphModule) -> GraphModule:
    """Give every annotated consumer of a shared dequantize node its own copy (in place).

    Returns:
        ``gm``, its graph linted (recompile it before running it, as convert does once).
    """
    dequantize = dequantize_ops()
    for dq in list(gm.graph.nodes):
        if dq.op != "call_function" or dq.target not in dequantize:
            continue
        users = [u for u in dq.users if not is_sym_size(u)]
        if len(users) <= 1 or _is_dynamic(dq):
            continue
        for user in users:
            if has_valid_annotation(user):
                _give_own_copy(gm, dq, user)
        if not dq.users:
            gm.graph.erase_node(dq)
    gm.graph.lint()
    return gm
