"""Finding the reference representation's patterns in a converted graph, besides linear / conv.

Each matcher is pure: it looks at one node and returns what a rewrite needs, or None. Each
rewrite is one call of :func:`replace_with_call`, which puts a call of the pattern's function
(:mod:`~qviz.engine.pt2e.passes.reference_ops`) where the pattern's last node was and erases
what is left unused. The patterns, in the order
:func:`~qviz.engine.pt2e.passes.reference_representation.to_reference_representation` applies
them after linear / conv:

* ``dq(x_q), dq(y_q) -> aten.add.Tensor [-> aten.relu] -> q``  →  :func:`quantized_add`;
* ``dq(x_q) -> aten.max_pool2d -> q``  →  :func:`quantized_max_pool2d`;
* ``dq.tensor(x_q, scale, zero_point), dq(w_int8) [, bias] -> aten.linear`` with float output
  (dynamic quantization)  →  :func:`dynamic_quantized_linear`;
* every 8-bit ``quantize_per_tensor`` / ``dequantize_per_tensor`` (both overloads) and
  ``quantize_per_channel`` / ``dequantize_per_channel`` still in the graph  →  its written-out
  function.

Example:
    >>> import torch
    >>> graph = torch.fx.Graph()
    >>> x = graph.placeholder("x")
    >>> q = graph.call_function(ops().quantize_per_tensor.default,
    ...                         (x, 0.1, 0, -128, 127, torch.int8))
    >>> qdq_rewrite(q) is not None
    True
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.fx import GraphModule, Node

from qviz.engine.compat import quantized_decomposed
from qviz.engine.graph.debug_handles import COMPARE_AS, HANDLE
from qviz.engine.pt2e.passes.reference_ops import (
    dynamic_quantized_linear,
    quantized_add,
    quantized_max_pool2d,
    reference_dequantize_per_channel,
    reference_dequantize_per_tensor,
    reference_quantize_per_channel,
    reference_quantize_per_tensor,
)

REPLACES = "qviz_replaces"
"""``node.meta`` key on each rewritten call: the name of the node whose value it computes."""

_INT8_TYPES = (torch.int8, torch.uint8)
_KEPT_META = ("nn_module_stack", "stack_trace", "source_fn_stack", HANDLE, COMPARE_AS)


def ops() -> Any:
    """``torch.ops.quantized_decomposed``, registered."""
    return quantized_decomposed()


def is_call(node: Any, *targets: Any) -> bool:
    """``node`` is a ``call_function`` of one of ``targets``."""
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def is_constant(node: Any) -> bool:
    """``node`` reads a stored tensor (``get_attr``)."""
    return isinstance(node, Node) and node.op == "get_attr"


def scalar_qparams(node: Node) -> bool:
    """A per-tensor q/dq node with Python-number qparams and an 8-bit integer dtype."""
    if len(node.args) < 6:
        return False
    scale, zero_point, dtype = node.args[1], node.args[2], node.args[5]
    numbers = isinstance(scale, float | int) and isinstance(zero_point, int)
    return numbers and dtype in _INT8_TYPES


def arguments(node: Node) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in (aten ops only)."""
    schema = node.target._schema
    values = {}
    for index, arg in enumerate(schema.arguments):
        if index < len(node.args):
            values[arg.name] = node.args[index]
        else:
            values[arg.name] = node.kwargs.get(arg.name, arg.default_value)
    return values


def replace_with_call(
    gm: GraphModule,
    call: tuple[Callable[..., Tensor], tuple, dict[str, Any]],
    replaced: Node,
    meta_from: Node,
    erasable: Sequence[Node | None],
) -> Node:
    """Put ``kernel(*args, **kwargs)`` where ``replaced`` was; erase ``erasable`` left unused.

    The new node takes ``meta_from``'s module stack, stack trace and debug handle, and
    ``meta[REPLACES] = replaced.name``.
    """
    kernel, args, kwargs = call
    with gm.graph.inserting_before(replaced):
        node = gm.graph.call_function(kernel, args, kwargs)
    node.meta[REPLACES] = replaced.name
    if "val" in replaced.meta:
        node.meta["val"] = replaced.meta["val"]
    for key in _KEPT_META:
        if key in meta_from.meta:
            node.meta[key] = meta_from.meta[key]
    replaced.replace_all_uses_with(node)
    for old in dict.fromkeys((replaced, *erasable)):
        if old is not None and not old.users and not getattr(old, "_erased", False):
            gm.graph.erase_node(old)
    return node


# --------------------------------------------------------------------------------------------
# add [+ relu], max_pool2d: dq inputs -> op -> q
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rewrite:
    """One matched pattern: the call that replaces ``replaced``, and the nodes it makes dead."""

    call: tuple[Callable[..., Tensor], tuple, dict[str, Any]]
    replaced: Node
    meta_from: Node
    erasable: tuple[Node | None, ...]


def _static_dq(node: Any) -> bool:
    return is_call(node, ops().dequantize_per_tensor.default) and scalar_qparams(node)


def _output(quantize: Node) -> dict[str, Any]:
    quant_min, quant_max, out_dtype = quantize.args[3:6]
    return {"quant_min": quant_min, "quant_max": quant_max, "out_dtype": out_dtype}


def _only_user(node: Any, *targets: Any) -> bool:
    return is_call(node, *targets) and len(node.users) == 1


def add_rewrite(quantize: Node) -> Rewrite | None:
    """``dq(x_q) + dq(y_q) [-> relu] -> q`` ending at ``quantize``, as a :func:`quantized_add`."""
    if not (is_call(quantize, ops().quantize_per_tensor.default) and scalar_qparams(quantize)):
        return None
    source, relu = quantize.args[0], None
    if _only_user(source, torch.ops.aten.relu.default):
        relu, source = source, source.args[0]
    if not _only_user(source, torch.ops.aten.add.Tensor) or source.kwargs.get("alpha", 1) != 1:
        return None
    x_dq, y_dq = source.args[:2]
    if not (_static_dq(x_dq) and _static_dq(y_dq)):
        return None
    args = (x_dq.args[0], *x_dq.args[1:3], y_dq.args[0], *y_dq.args[1:3], *quantize.args[1:3])
    kwargs = {**_output(quantize), "relu": relu is not None}
    return Rewrite((quantized_add, args, kwargs), quantize, source, (relu, source, x_dq, y_dq))


def max_pool_rewrite(quantize: Node) -> Rewrite | None:
    """``dq(x_q) -> max_pool2d -> q`` ending at ``quantize``, as a :func:`quantized_max_pool2d`."""
    if not (is_call(quantize, ops().quantize_per_tensor.default) and scalar_qparams(quantize)):
        return None
    pool = quantize.args[0]
    if not _only_user(pool, torch.ops.aten.max_pool2d.default):
        return None
    given = arguments(pool)
    x_dq = given["self"]
    if not _static_dq(x_dq):
        return None
    kwargs = {
        name: given[name] for name in ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
    }
    args = (x_dq.args[0], *x_dq.args[1:3], *quantize.args[1:3])
    call = (quantized_max_pool2d, args, {**kwargs, **_output(quantize)})
    return Rewrite(call, quantize, pool, (pool, x_dq))


# --------------------------------------------------------------------------------------------
# dynamic linear: choose_qparams -> q.tensor -> dq.tensor, dq(w) -> linear (float output)
# --------------------------------------------------------------------------------------------


def _dynamic_dq(node: Any) -> bool:
    """``dequantize_per_tensor.tensor`` of run-time qparams (``getitem`` of choose_qparams)."""
    if not is_call(node, ops().dequantize_per_tensor.tensor) or len(node.args) < 6:
        return False
    fetched = all(is_call(a, operator.getitem) for a in node.args[1:3])
    return fetched and node.args[5] in _INT8_TYPES and not node.kwargs.get("out_dtype")


def dynamic_linear_rewrite(linear: Node, weight_ok: Callable[[Any], bool]) -> Rewrite | None:
    """``dq.tensor(x_q) , dq(w_int8) [, bias] -> linear`` as a :func:`dynamic_quantized_linear`.

    ``weight_ok`` says whether a node is a weight dequantize of stored integers (the linear /
    conv matcher's own test, so both patterns accept the same weights).
    """
    if not is_call(linear, torch.ops.aten.linear.default):
        return None
    given = arguments(linear)
    x_dq, w_dq = given["input"], given["weight"]
    if not (_dynamic_dq(x_dq) and weight_ok(w_dq)):
        return None
    args = (*x_dq.args[:3], *w_dq.args[:3], given["bias"])
    val = linear.meta.get("val")
    kwargs = {"out_dtype": val.dtype} if isinstance(val, Tensor) else {}
    call = (dynamic_quantized_linear, args, kwargs)
    return Rewrite(call, linear, linear, (x_dq, w_dq))


# --------------------------------------------------------------------------------------------
# the q/dq ops left over
# --------------------------------------------------------------------------------------------


def _qdq_functions() -> dict[Any, tuple[Callable[..., Tensor], int]]:
    """Each q/dq op, its written-out function, and where its integer dtype argument is."""
    q = ops()
    return {
        q.quantize_per_tensor.default: (reference_quantize_per_tensor, 5),
        q.quantize_per_tensor.tensor: (reference_quantize_per_tensor, 5),
        q.dequantize_per_tensor.default: (reference_dequantize_per_tensor, 5),
        q.dequantize_per_tensor.tensor: (reference_dequantize_per_tensor, 5),
        q.quantize_per_channel.default: (reference_quantize_per_channel, 6),
        q.dequantize_per_channel.default: (reference_dequantize_per_channel, 6),
    }


def qdq_rewrite(node: Node) -> Rewrite | None:
    """An 8-bit quantize / dequantize op as a call of its written-out function."""
    if node.op != "call_function":
        return None
    found = _qdq_functions().get(node.target)
    if found is None:
        return None
    function, dtype_at = found
    if len(node.args) <= dtype_at or node.args[dtype_at] not in _INT8_TYPES:
        return None
    return Rewrite((function, tuple(node.args), dict(node.kwargs)), node, node, ())
