"""Fold inference BatchNorm into the convolution or linear that feeds it (a graph pass, in place).

``bn(conv(x, w, b))`` becomes ``conv(x, w', b')`` through
``torch.nn.utils.fusion.fuse_conv_bn_weights`` (``fuse_linear_bn_weights`` for ``linear``), the
same arithmetic the reference uses, so folded weights agree bit for bit. A pair is folded only
when it is safe: the conv output feeds nothing but the BatchNorm, and its weight is not shared
with another conv. Other pairs stay as they are (the reference folds them anyway, which changes
what the conv's other users or the weight's other convs compute); :func:`fold_batch_norm`
returns them so the plan can say why. A linear on a 3-D input is not folded either (and a
warning says so): Linear transforms the last dimension, BatchNorm1d normalizes dimension 1.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from qviz.engine.graph.capture import export
    >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)).eval()
    >>> gm = export(model, (torch.randn(1, 1, 5, 5),))
    >>> fold_batch_norm(gm)
    []
    >>> any(n.target == torch.ops.aten.batch_norm.default for n in gm.graph.nodes)
    False
"""

from __future__ import annotations

import operator
import warnings

import torch
from torch.fx import GraphModule, Node
from torch.nn.utils.fusion import fuse_conv_bn_weights, fuse_linear_bn_weights

from qviz.engine.graph.debug_handles import COMPARE_AS, handle
from qviz.engine.graph.get_attr import get_attr_value, set_constant
from qviz.engine.graph.module_stack import module_type_names

#: ``node.meta`` key of a conv / linear: the classes (``module.qualname``) of the BatchNorm
#: modules folded into it, so pattern matchers still see them (``(Conv2d, BatchNorm2d, ReLU)``).
FOLDED_BN = "qviz_folded_batch_norm"

aten = torch.ops.aten
CONV_OPS = {
    aten.conv1d.default,
    aten.conv1d.padding,
    aten.conv2d.default,
    aten.conv2d.padding,
    aten.conv3d.default,
    aten.conv3d.padding,
}
TRANSPOSED_CONV_OPS = {
    aten.conv_transpose1d.default,
    aten.conv_transpose2d.input,
    aten.conv_transpose3d.input,
}
LINEAR_OPS = {aten.linear.default}
BN_OPS = {aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default}
_EPS_INDEX = {
    aten.batch_norm.default: 7,
    aten._native_batch_norm_legit_no_training.default: 6,
    aten._native_batch_norm_legit.default: 7,
    aten.cudnn_batch_norm.default: 7,
}


def _constant(gm: GraphModule, node: Node | None) -> torch.Tensor | None:
    """The parameter or buffer a ``get_attr`` node reads (None for a missing optional input)."""
    return None if node is None else get_attr_value(gm, node)


def _bias_target(weight: str) -> str:
    """Where a folded conv without bias keeps its new bias: ``stem.0.weight_bias``, as torchao
    names it (so a prepared model's state_dict loads into torchao's and back)."""
    return f"{weight}_bias"


def _linear_on_3d(linear: Node) -> str | None:
    val = linear.args[0].meta.get("val") if isinstance(linear.args[0], Node) else None
    if isinstance(val, torch.Tensor) and val.ndim > 2:
        return (
            f"Not fusing linear+bn for node '{linear.name}': the linear input is {val.ndim}-D, so "
            f"Linear (last dimension) and BatchNorm (dimension 1) act on different dimensions"
        )
    return None


def _foldable(bn: Node) -> tuple[Node, str | None]:
    """The conv (or linear) feeding ``bn`` and why it cannot be folded (None when it can)."""
    conv = bn.args[0]
    if not isinstance(conv, Node) or conv.target not in CONV_OPS | TRANSPOSED_CONV_OPS | LINEAR_OPS:
        return conv, "not preceded by a convolution or linear"
    if conv.target in LINEAR_OPS and _linear_on_3d(conv):
        warnings.warn(_linear_on_3d(conv), stacklevel=4)
        return conv, _linear_on_3d(conv)
    if len(conv.users) != 1:
        return (
            conv,
            f"{conv.name}'s output also feeds {[u.name for u in conv.users if u is not bn]}",
        )
    weight = conv.args[1]
    shared = [u.name for u in weight.users if u is not conv] if isinstance(weight, Node) else []
    if not isinstance(weight, Node) or weight.op != "get_attr" or shared:
        return conv, f"{conv.name}'s weight is not a constant of its own (also used by {shared})"
    return conv, None


def fused_conv_bn_params(
    gm: GraphModule, conv: Node, bn: Node
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and bias of ``conv`` (or a linear) with ``bn`` folded in, from ``gm``'s constants.

    Example:
        >>> import torch, qviz
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)).eval()
        >>> gm = qviz.export(model, (torch.randn(1, 1, 5, 5),))
        >>> conv, bn = [n for n in gm.graph.nodes if n.op == "call_function"]
        >>> w, b = fused_conv_bn_params(gm, conv, bn)
        >>> w.shape, b.shape
        (torch.Size([2, 1, 3, 3]), torch.Size([2]))
    """
    weight_node = conv.args[1]
    bias_node = conv.args[2] if len(conv.args) > 2 else None
    args = list(bn.args) + [None] * (8 - len(bn.args))
    bn_w, bn_b, mean, var = (_constant(gm, a) for a in args[1:5])
    eps = bn.args[_EPS_INDEX[bn.target]]
    if conv.target in LINEAR_OPS:
        return fuse_linear_bn_weights(
            _constant(gm, weight_node), _constant(gm, bias_node), mean, var, eps, bn_w, bn_b
        )
    return fuse_conv_bn_weights(
        _constant(gm, weight_node),
        _constant(gm, bias_node),
        mean,
        var,
        eps,
        bn_w,
        bn_b,
        transpose=conv.target in TRANSPOSED_CONV_OPS,
    )


def _bn_class(bn: Node) -> str:
    types = module_type_names(bn)
    return types[-1] if types else "torch.nn.functional.batch_norm"


def fold_conv_bn_pair(gm: GraphModule, conv: Node, bn: Node) -> None:
    """Fold ``bn`` into ``conv`` (or a linear) in place: fused weight and bias from ``gm``'s
    current constants, ``bn``'s users read ``conv``. The caller checks the pair is foldable
    (QAT's convert folds its trained pairs with it).

    Example:
        >>> import torch, qviz
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)).eval()
        >>> gm = qviz.export(model, (torch.randn(1, 1, 5, 5),))
        >>> conv, bn = [n for n in gm.graph.nodes if n.op == "call_function"]
        >>> fold_conv_bn_pair(gm, conv, bn)
        >>> [n.name for n in gm.graph.nodes if n.op == "output"][0], len(bn.users)
        ('output', 0)
    """
    conv.meta[FOLDED_BN] = (*conv.meta.get(FOLDED_BN, ()), _bn_class(bn))
    weight_node = conv.args[1]
    bias_node = conv.args[2] if len(conv.args) > 2 else None
    fused_w, fused_b = fused_conv_bn_params(gm, conv, bn)
    set_constant(gm, str(weight_node.target), fused_w)
    if bias_node is None:
        target = _bias_target(str(weight_node.target))
        set_constant(gm, target, fused_b)
        with gm.graph.inserting_before(conv):
            bias_node = gm.graph.get_attr(target)
        conv_args = list(conv.args) + [None] * (3 - len(conv.args))
        conv_args[2] = bias_node
        conv.args = tuple(conv_args)
    else:
        set_constant(gm, str(bias_node.target), fused_b)
    if bn.target == aten.batch_norm.default:
        replaced = bn
    else:
        getitems = (u for u in bn.users if u.target is operator.getitem and u.args[1] == 0)
        replaced = next(getitems, None)
        if replaced is None:  # the BatchNorm's output is unused
            return
    if handle(replaced) is not None:  # the conv now computes this node's float output
        conv.meta[COMPARE_AS] = handle(replaced)
    replaced.replace_all_uses_with(conv)


def fold_batch_norm(gm: GraphModule) -> list[tuple[str, str]]:
    """Fold every safe conv → BatchNorm (and 2-D linear → BatchNorm) pair of ``gm`` in place.

    Returns:
        ``(batch_norm_node_name, reason)`` for each BatchNorm left unfolded.
    """
    left, folded = [], False
    for bn in [n for n in gm.graph.nodes if n.op == "call_function" and n.target in BN_OPS]:
        conv, why = _foldable(bn)
        if why is None:
            fold_conv_bn_pair(gm, conv, bn)
            folded = True
        else:
            left.append((bn.name, why))
    if gm.graph.eliminate_dead_code() or folded:  # the code only when the graph changed
        gm.graph.lint()
        gm.recompile()
    return left
