"""The quantize, dequantize and choose_qparams operators of converted graphs, in one place.

Converted graphs use ``torch.ops.quantized_decomposed`` (per tensor, per channel, dynamic
``.tensor`` variants) and, for affine (per-group / per-token) quantization, torchao's
``torch.ops.torchao`` ops when torchao has registered them. Every pass and view that asks "is
this node a quantize?" asks here.

Example:
    >>> quantized_decomposed().dequantize_per_channel.default in dequantize_ops()
    True
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from qviz.engine.compat import quantized_decomposed


def _affine(name: str) -> set:
    """torchao's affine op ``name`` if torchao registered it (never imported from here): the
    overload and the packet, which torchao's observers put in graphs as they are."""
    namespace = getattr(torch.ops, "torchao", None)
    try:
        op = getattr(namespace, name, None) if namespace is not None else None
    except (AttributeError, RuntimeError):
        op = None
    return {op, op.default} if op is not None else set()


def quantize_ops() -> frozenset:
    """Every quantize operator of a converted graph."""
    qd = quantized_decomposed()
    return frozenset(
        {
            qd.quantize_per_tensor.default,
            qd.quantize_per_tensor.tensor,
            qd.quantize_per_tensor.tensor2,
            qd.quantize_per_channel.default,
            *_affine("quantize_affine"),
        }
    )


def dequantize_ops() -> frozenset:
    """Every dequantize operator of a converted graph."""
    qd = quantized_decomposed()
    return frozenset(
        {
            qd.dequantize_per_tensor.default,
            qd.dequantize_per_tensor.tensor,
            qd.dequantize_per_tensor.tensor2,
            qd.dequantize_per_channel.default,
            *_affine("dequantize_affine"),
        }
    )


def choose_qparams_ops() -> frozenset:
    """The operators that compute qparams at run time (dynamic quantization)."""
    qd = quantized_decomposed()
    return frozenset(
        {
            qd.choose_qparams.tensor,
            qd.choose_qparams_symmetric.tensor,
            *_affine("choose_qparams_affine"),
        }
    )


def is_qdq(node: Node) -> bool:
    """``node`` calls a quantize, dequantize or choose_qparams operator."""
    return node.op == "call_function" and (
        node.target in quantize_ops()
        or node.target in dequantize_ops()
        or node.target in choose_qparams_ops()
    )


def is_sym_size(node: Node) -> bool:
    """``node`` reads a symbolic size (``aten.sym_size``), not a tensor's values."""
    return node.op == "call_function" and node.target in (
        torch.ops.aten.sym_size.default,
        torch.ops.aten.sym_size.int,
    )


def chosen_by(q: Node) -> Node | None:
    """The ``choose_qparams`` node whose scale quantize node ``q`` uses (dynamic quantization:
    ``choose_qparams -> getitem -> quantize``), or None."""
    scale = q.args[1] if len(q.args) > 1 else None
    if isinstance(scale, Node) and scale.target is operator.getitem:
        chosen = scale.args[0]
        if isinstance(chosen, Node) and chosen.target in choose_qparams_ops():
            return chosen
    return None
