"""Why X86InductorQuantizer leaves an operator's tensors in float, for the QuantPlan.

Every operator node with no quantized input or output gets ``qviz_float_reason`` /
``qviz_float_detail`` (the plan reads them for the quantizable operators it lists as float):

* a setting with config None covers it: user fallback or filtered by module name;
* none, where it is part of an int8 fusion (the relu after a conv, the add after a linear):
  Inductor runs it inside the fused kernel, so it is not left in float; it gets
  ``qviz_fused_into`` (the conv / linear) instead, and its output is quantized only where an int8
  consumer reads it;
* a pooling / cat / flatten whose input is not the int8 output of a quantized pattern;
* anything else: the recipe has no int8 kernel for it.

Example:
    >>> import torch
    >>> g = torch.fx.Graph()
    >>> x = g.placeholder("x")
    >>> s = g.call_function(torch.ops.aten.sigmoid.default, (x,))
    >>> record_reasons(torch.fx.GraphModule(torch.nn.Module(), g), lambda node: None)
    >>> s.meta["qviz_float_reason"]
    'pattern unsupported'
"""

from __future__ import annotations

from collections.abc import Callable

from torch.fx import GraphModule, Node

from qviz.engine.quantizers.annotate import (
    FILTERED_BY_MODULE_NAME,
    PATTERN_UNSUPPORTED,
    USER_FALLBACK,
    record_float_reason,
)
from qviz.engine.quantizers.base import FUSED_INTO_KEY
from qviz.engine.quantizers.x86_inductor_patterns import INT8_IN_INT8_OUT, QUANTIZABLE, aten
from qviz.engine.specs import Q_ANNOTATION_KEY


def _quantizes_something(node: Node) -> bool:
    ann = node.meta.get(Q_ANNOTATION_KEY)
    if ann is None:
        return False
    specs = [*ann.input_qspec_map.values(), ann.output_qspec]
    return any(s is not None for s in specs)


def _fused_into(node: Node) -> Node | None:
    """The conv / linear whose int8 kernel ``node`` (a claimed post op) is fused into."""
    seen, todo = set(), list(node.all_input_nodes)
    while todo:
        n = todo.pop()
        if n in seen or n.op != "call_function":
            continue
        seen.add(n)
        if n.target in (aten.conv1d.default, aten.conv2d.default, aten.linear.default):
            return n if _quantizes_something(n) else None
        if n.meta.get(Q_ANNOTATION_KEY) is not None and not _quantizes_something(n):
            todo.extend(n.all_input_nodes)
    return None


def _recipe_detail(node: Node) -> str:
    op = getattr(node.target, "__name__", str(node.target))
    if node.target is aten.flatten.using_ints and not any(
        u.target in QUANTIZABLE for u in node.users
    ):
        return f"{op}: none of its users is an int8 operator, so it stays float"
    if node.target in INT8_IN_INT8_OUT:
        inputs = ", ".join(n.name for n in node.all_input_nodes)
        return f"{op} runs on int8 only when its input ({inputs}) is an int8 pattern's output"
    if node.target is aten.mul.Tensor:
        return f"{op}: only a product of two tensors of the same shape is quantized"
    return f"X86InductorQuantizer has no int8 recipe for {op} (Inductor runs it in float)"


def record_reasons(gm: GraphModule, none_setting: Callable[[Node], str | None]) -> None:
    """Give each operator node that quantizes nothing its reason (``none_setting``: the
    setting with config None that covers a node, or None)."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or _quantizes_something(node):
            continue
        setting = none_setting(node)
        if setting is not None:
            reason = (
                FILTERED_BY_MODULE_NAME if setting.startswith("set_module_name") else USER_FALLBACK
            )
            record_float_reason(node, reason, setting)
        elif (head := _fused_post_op(node)) is not None:
            node.meta[FUSED_INTO_KEY] = head.name  # runs inside head's int8 kernel
        else:
            record_float_reason(node, PATTERN_UNSUPPORTED, _recipe_detail(node))


def _fused_post_op(node: Node) -> Node | None:
    """The quantized conv / linear whose int8 kernel runs ``node`` as a fused post op."""
    return _fused_into(node) if node.meta.get(Q_ANNOTATION_KEY) is not None else None
