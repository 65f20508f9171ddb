"""Conv + BatchNorm kept trainable for QAT, then folded at convert (graph passes, in place).

During quantization-aware training the BatchNorm after a conv stays a training BatchNorm (its
statistics keep updating) while the conv's weight is fake-quantized as it will be after folding,
the approximation of torch's ``nniqat.ConvBn2d._forward_approximate`` that torchao's
``qat_utils`` uses::

    running_std  = sqrt(running_var + eps)
    scale_factor = bn.weight / running_std
    y = conv(x, fake_quant(weight * scale_factor[:, None, None, None]), zeros_like(bias))
    y = y / scale_factor[None, :, None, None] + bias[None, :, None, None]
    y = batch_norm(y, ..., training=True)

:func:`fuse_conv_bn_for_qat` rewrites each annotated ``conv → batch_norm(training=True)`` pair
so (the same ATen ops as torchao's, so the arithmetic agrees bit for bit); the conv and the
BatchNorm stay the same nodes, their annotations move from the weight (and bias) to the scaled
weight (and zero bias), as torchao moves them. Unlike torchao, the BatchNorm's own ``eps`` is
used (torchao always uses 1e-5 and momentum 0.1). Each rewritten conv records the nodes of the
rewrite in ``node.meta[QAT_CONV_BN]``; :func:`fold_qat_conv_bn` (convert, before the
fake-quantize modules become q/dq) folds the BatchNorm's current statistics into the conv as
PTQ's BatchNorm folding does, and the weight's fake-quantize module then quantizes the folded
weight with the qparams it learned on the scaled weight.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)).train()
    >>> gm = qviz.export(model, (torch.randn(2, 1, 5, 5),))
    >>> [n.name for n in fuse_conv_bn_for_qat(gm)]
    ['conv2d']
    >>> [n.target.__name__ for n in gm.graph.nodes if n.op == "call_function"][:6]
    ['add.Tensor', 'sqrt.default', 'div.Tensor', 'reshape.default', 'mul.Tensor', 'zeros_like.default']
"""  # noqa: E501

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node

from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.pt2e.passes.bn_fold import BN_OPS, CONV_OPS, TRANSPOSED_CONV_OPS, fold_conv_bn_pair
from qviz.engine.specs import (
    Q_ANNOTATION_KEY,
    map_spec_keys,
    with_specs,
)
from qviz.errors import ConfigError

#: Node meta key marking the nodes the QAT conv-BatchNorm rewrite added (the plan skips them).
QAT_PART = "qviz_qat_part"
#: ``node.meta`` key of a conv rewritten for QAT: ``{"bn", "weight", "bias", "scaled_weight",
#: "zero_bias"}``, the names of those nodes (None where there is none).
QAT_CONV_BN = "qviz_qat_conv_bn"

aten = torch.ops.aten
#: the ATen forms a BatchNorm after a QAT conv can take by convert: prepare's own training
#: ``batch_norm`` and the forms other passes (exported-mode switches) rewrite it to.
QAT_BN_OPS = BN_OPS | {aten._native_batch_norm_legit.default, aten.cudnn_batch_norm.default}
_EPS_INDEX = 7  # aten.batch_norm.default(input, w, b, mean, var, training, momentum, eps, cudnn)


def _training_bn(conv: Node) -> Node | None:
    """The training batch_norm that is the only user of ``conv``, if any."""
    if len(conv.users) != 1:
        return None
    bn = next(iter(conv.users))
    if bn.op != "call_function" or bn.target != aten.batch_norm.default:
        return None
    return bn if bn.args[5] is True else None


def _is_eval_bn(node: Node) -> bool:
    if node.target == aten._native_batch_norm_legit_no_training.default:
        return True
    return node.target == aten.batch_norm.default and node.args[5] is False


def qat_conv_bn_pairs(gm: GraphModule) -> list[tuple[Node, Node]]:
    """The ``(conv, batch_norm)`` pairs QAT keeps trainable: the conv's only user is a training
    BatchNorm and its weight is a constant of its own.

    Raises:
        ConfigError: a conv feeds an inference BatchNorm (the model was exported in eval mode).

    Example:
        >>> import torch, qviz
        >>> m = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2)).train()
        >>> [(c.name, b.name) for c, b in qat_conv_bn_pairs(qviz.export(m, (torch.ones(2, 1, 4, 4),)))]
        [('conv2d', 'batch_norm')]
    """  # noqa: E501
    pairs = []
    for conv in gm.graph.nodes:
        if conv.op != "call_function" or conv.target not in CONV_OPS | TRANSPOSED_CONV_OPS:
            continue
        user = next(iter(conv.users), None) if len(conv.users) == 1 else None
        if user is not None and _is_eval_bn(user):
            raise ConfigError(
                f"{user.format_node()}: this BatchNorm was exported in eval mode; QAT trains "
                f"with BatchNorm statistics updating: export the model in train() mode "
                f"(model.train() before qviz.export) and prepare that with prepare_qat_pt2e"
            )
        bn = _training_bn(conv)
        weight = conv.args[1]
        if bn is None or not isinstance(weight, Node) or weight.op != "get_attr":
            continue
        if len(weight.users) == 1:
            pairs.append((conv, bn))
    return pairs


def _call(
    gm: GraphModule, target: Any, args: tuple, meta: dict, name: str | None = None, **kwargs: Any
) -> Node:
    node = gm.graph.create_node("call_function", target, args, kwargs, name=name)
    node.meta[QAT_PART] = True
    if "nn_module_stack" in meta:
        node.meta["nn_module_stack"] = dict(meta["nn_module_stack"])
    return node


def _rewrite(gm: GraphModule, conv: Node, bn: Node) -> dict[str, Node | None]:
    """Insert the scaled-weight ops before ``conv`` and the rescale after it."""
    x, weight = conv.args[0], conv.args[1]
    bias = conv.args[2] if len(conv.args) > 2 else None
    bn_weight, var, eps = bn.args[1], bn.args[4], bn.args[_EPS_INDEX]
    ndim = get_attr_value(gm, weight).dim()
    weight_shape, bias_shape = [1] * ndim, [1] * ndim
    weight_shape[1 if conv.target in TRANSPOSED_CONV_OPS else 0] = -1
    bias_shape[1] = -1
    meta = conv.meta
    with gm.graph.inserting_before(conv):
        std = _call(gm, aten.sqrt.default, (_call(gm, aten.add.Tensor, (var, eps), meta),), meta)
        factor = _call(gm, aten.div.Tensor, (bn_weight, std), meta)
        shaped = _call(gm, aten.reshape.default, (factor, weight_shape), meta)
        scaled = _call(gm, aten.mul.Tensor, (weight, shaped), meta, f"{weight.name}_scaled")
        zero_bias = None
        if bias is not None:
            dtype = getattr(x.meta.get("val"), "dtype", torch.float32)
            zero_bias = _call(
                gm, aten.zeros_like.default, (bias,), meta, dtype=dtype, pin_memory=False
            )
    conv.args = (x, scaled, zero_bias, *conv.args[3:])
    with gm.graph.inserting_before(conv.next):  # after conv, in this order
        out = _call(gm, aten.reshape.default, (factor, bias_shape), meta)
        y = _call(gm, aten.div.Tensor, (conv, out), meta)
        if bias is not None:
            shaped_bias = _call(gm, aten.reshape.default, (bias, bias_shape), meta)
            y = _call(gm, aten.add.Tensor, (y, shaped_bias), meta)
    bn.replace_input_with(conv, y)
    return {"weight": weight, "bias": bias, "scaled_weight": scaled, "zero_bias": zero_bias}


def _move_annotations(gm: GraphModule, conv: Node, moved: dict[Node, Node]) -> None:
    """Key ``conv``'s input specs, and every shared / derived spec naming an edge into
    ``conv``, by the scaled weight and zero bias instead of the weight and bias."""

    def edge(key: Any) -> Any:
        if isinstance(key, tuple) and len(key) == 2 and key[1] is conv and key[0] in moved:
            return (moved[key[0]], conv)
        return key

    for node in gm.graph.nodes:
        annotation = node.meta.get(Q_ANNOTATION_KEY)
        if annotation is None:
            continue
        inputs = {
            (moved.get(k, k) if node is conv else k): map_spec_keys(s, edge)
            for k, s in annotation.input_qspec_map.items()
        }
        node.meta[Q_ANNOTATION_KEY] = with_specs(
            annotation, inputs, map_spec_keys(annotation.output_qspec, edge)
        )


def fuse_conv_bn_for_qat(gm: GraphModule) -> list[Node]:
    """Rewrite every QAT conv + training BatchNorm pair of ``gm`` in place; the convs rewritten.

    Annotations keep their own classes (a quantizer's, or qviz's); only their keys move.
    """
    rewritten = []
    for conv, bn in qat_conv_bn_pairs(gm):
        nodes = _rewrite(gm, conv, bn)
        moved = {nodes["weight"]: nodes["scaled_weight"]}
        if nodes["bias"] is not None:
            moved[nodes["bias"]] = nodes["zero_bias"]
        _move_annotations(gm, conv, moved)
        for node in (bn, *_num_batches_updates(gm, bn)):
            node.meta[QAT_PART] = True
        conv.meta[QAT_CONV_BN] = {"bn": bn.name} | {
            k: None if v is None else v.name for k, v in nodes.items()
        }
        rewritten.append(conv)
    gm.graph.lint()
    gm.recompile()
    return rewritten


def _num_batches_updates(gm: GraphModule, bn: Node) -> list[Node]:
    """The in-place ``add_(num_batches_tracked, 1)`` of ``bn``'s module (export records it)."""
    mean = bn.args[3]
    owner = str(mean.target).rpartition(".")[0] if isinstance(mean, Node) else None
    target = f"{owner}.num_batches_tracked" if owner else "num_batches_tracked"
    return [
        n
        for n in gm.graph.nodes
        if n.target == aten.add_.Tensor
        and isinstance(n.args[0], Node)
        and n.args[0].op == "get_attr"
        and n.args[0].target == target
    ]


def _behind_modules(node: Any) -> Any:
    """``node`` with any fake-quantize module calls in front of it stepped over."""
    while isinstance(node, Node) and node.op == "call_module" and node.args:
        node = node.args[0]
    return node


def _qat_bn(conv: Node) -> Node:
    """The BatchNorm after a QAT-rewritten conv, found by structure: conv -> div (-> add) ->
    BatchNorm (any ATen form: the mode functions of torchao rewrite and rename it)."""
    node = conv
    for _ in range(3):
        users = [u for u in node.users if u.op == "call_function"]
        if len(users) != 1:
            break
        node = users[0]
        if node.target in QAT_BN_OPS:
            return node
    raise ConfigError(
        f"{conv.format_node()}: prepare_qat_pt2e kept this conv's BatchNorm trainable, but no "
        f"BatchNorm follows its rescale any more (the graph was edited after prepare): convert "
        f"the model prepare_qat_pt2e returned, after training, without rewriting the BatchNorm"
    )


def _qat_parts(conv: Node) -> dict[str, Node | None]:
    """The nodes of ``conv``'s QAT rewrite, found by structure (names change when other passes
    rewrite the graph): BatchNorm, weight, scaled weight, bias and zero bias."""
    scaled = _behind_modules(conv.args[1])
    zero_bias = _behind_modules(conv.args[2]) if len(conv.args) > 2 else None
    if not (isinstance(scaled, Node) and scaled.target == aten.mul.Tensor):
        raise ConfigError(
            f"{conv.format_node()}: its weight input is no longer the BatchNorm-scaled weight "
            f"prepare_qat_pt2e inserted; convert the model prepare_qat_pt2e returned"
        )
    bias = None
    if isinstance(zero_bias, Node):
        bias = zero_bias.args[0]
    return {
        "bn": _qat_bn(conv),
        "weight": scaled.args[0],
        "scaled_weight": scaled,
        "bias": bias,
        "zero_bias": zero_bias if isinstance(zero_bias, Node) else None,
    }


def fold_qat_conv_bn(gm: GraphModule) -> dict[str, str]:
    """Fold the BatchNorm of every QAT-rewritten conv of ``gm`` (in place).

    The weight's fake-quantize call (or the scaled weight) then reads the folded weight, the
    conv the folded bias, the BatchNorm's users the conv. The BatchNorm and the other nodes of
    the rewrite are found by structure, so a pass that renamed them in between (torchao's
    ``move_exported_model_to_eval``, for one) does not matter.

    Returns:
        ``removed node name -> the node that now computes its value`` (BatchNorm -> conv,
        scaled weight -> weight, zero bias -> bias), for the plan's records.
    """
    renamed: dict[str, str] = {}
    convs = [n for n in gm.graph.nodes if QAT_CONV_BN in n.meta]
    for conv in convs:
        recorded = conv.meta.pop(QAT_CONV_BN)
        parts = _qat_parts(conv)
        bn, weight, scaled, bias = (parts[k] for k in ("bn", "weight", "scaled_weight", "bias"))
        weight_input = conv.args[1]  # the fake-quantize call on the scaled weight, or it
        bias_input = conv.args[2] if len(conv.args) > 2 else None  # a derived spec's, or zeros
        conv.args = (conv.args[0], weight, bias, *conv.args[3:])
        bn.replace_input_with(bn.args[0], conv)
        for update in _num_batches_updates(gm, bn):
            gm.graph.erase_node(update)
        fold_conv_bn_pair(gm, conv, bn)
        if weight_input is not scaled:
            weight_input.replace_input_with(scaled, weight)
            conv.args = (conv.args[0], weight_input, *conv.args[2:])
        if isinstance(bias_input, Node) and bias_input is not parts["zero_bias"]:
            # the bias was annotated (a derived spec, say): quantize the folded bias with it
            bias_input.replace_input_with(parts["zero_bias"], conv.args[2])
            conv.args = (*conv.args[:2], bias_input, *conv.args[3:])
        # the plan recorded the names prepare gave; map those (and any new name) to the survivors
        for key, survivor in (("bn", conv), ("scaled_weight", weight), ("zero_bias", bias)):
            if survivor is None:
                continue
            for name in {recorded.get(key), getattr(parts[key], "name", None)} - {None}:
                renamed[name] = survivor.name
    if gm.graph.eliminate_dead_code() or convs:  # the code only when the graph changed
        gm.graph.lint()
        gm.recompile()
    return renamed
