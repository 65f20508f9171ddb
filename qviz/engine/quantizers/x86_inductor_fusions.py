"""X86InductorQuantizer's conv / linear fusions (see :mod:`.x86_inductor_patterns` for the table).

Each ``annotate_*`` claims every unclaimed occurrence of its pattern that ``allowed`` lets it
take, with ``config`` (None: claimed, left in float). :func:`annotate_with_config` runs them in
the recipe's order: fused patterns before their parts, conv before linear, then matmul, mul and
the int8-in int8-out propagation.

Example:
    >>> from torch import nn
    >>> from qviz.engine.quantizers.x86_inductor import (
    ...     get_default_x86_inductor_quantization_config)
    >>> from qviz.engine.quantizers.x86_inductor_patterns import global_filter
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    >>> gm = torch.export.export(model, (torch.randn(2, 4),)).module()
    >>> annotate_linear(gm, get_default_x86_inductor_quantization_config(), global_filter)
    >>> relu = next(n for n in gm.graph.nodes if n.name == "relu")
    >>> relu.meta["quantization_annotation"]._is_output_of_quantized_pattern
    True
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from qviz.engine.quantizers.x86_inductor_patterns import (
    ADD,
    BN_TRAIN,
    CONV2D,
    RELU,
    Filter,
    annotate_weighted,
    aten,
    chains,
    keep_float,
    mark_claimed,
    may_claim,
    other_input,
    propagate,
    set_annotation,
)
from qviz.engine.specs import QuantizationConfig

_CONV_UNARY = (
    (CONV2D, RELU),
    (CONV2D, (aten.hardtanh.default, aten.hardtanh_.default)),
    (CONV2D, (aten.hardswish.default, aten.hardswish_.default)),
    (CONV2D, (aten.silu.default, aten.silu_.default)),
    ((aten.conv1d.default,), RELU),
)
#: linear's unary post ops, in the recipe's order (each with its in-place form)
_LINEAR_UNARY = (
    RELU,
    (aten.leaky_relu.default, aten.leaky_relu_.default),
    (aten.tanh.default, aten.tanh_.default),
    (aten.gelu.default, aten.gelu_.default),
)


def _conv_binary(gm, config, allowed, tail: tuple, qat: bool) -> None:
    """conv2d [→ bn] → add [→ relu]: the conv's inputs and the add's other input quantized."""
    for chain in chains(gm, [CONV2D, *([BN_TRAIN] if qat else []), ADD, *tail]):
        producer, add, last = chain[int(qat)], chain[1 + qat], chain[-1]
        extra = other_input(add, producer)
        if len(producer.users) != 1 or extra is None or not may_claim(chain[::-1], allowed):
            continue
        if config is None:
            keep_float([chain[0], *chain[1 + qat :]])
        else:
            annotate_weighted(chain[0], config, flag=False)
            output = config.output_activation if qat else None
            inputs = {extra: config.input_activation}
            set_annotation(add, inputs, output if last is add else None, flag=last is add)
            if last is not add:
                set_annotation(last, None, output, flag=True)
        if qat:
            mark_claimed([chain[0], *_bn_nodes(chain[1]), *chain[2:]])


def _bn_nodes(value: Node) -> list[Node]:
    """The batch norm node(s) behind a batch-norm value (itself, or the op and its getitem)."""
    return [value] if value.target is aten.batch_norm.default else [value.args[0], value]


def _conv_unary(gm, config, allowed, qat: bool) -> None:
    for heads, unary in _CONV_UNARY:
        if qat and heads is not CONV2D:
            continue
        for chain in chains(gm, [heads, *([BN_TRAIN] if qat else []), unary]):
            conv, last = chain[0], chain[-1]
            if not may_claim(chain[::-1], allowed):
                continue
            if config is None:
                keep_float([conv, last])
            else:
                annotate_weighted(conv, config, flag=False)
                output = config.output_activation if qat else None
                set_annotation(last, None, output, flag=True)
            if qat:
                mark_claimed([conv, *_bn_nodes(chain[1]), last])


def _qat_conv_bn(gm, config, allowed) -> None:
    for conv, value in chains(gm, [CONV2D, BN_TRAIN]):
        if not may_claim([value, conv], allowed):
            continue
        if config is None:
            keep_float([conv, value])
        else:
            annotate_weighted(conv, config, flag=False)
            set_annotation(value, None, config.output_activation, flag=True)
        mark_claimed([conv, *_bn_nodes(value)])


def _single(gm, ops: tuple, config, allowed) -> None:
    """conv2d or linear on its own: inputs quantized, flagged."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in ops:
            continue
        if not may_claim([node], allowed):
            continue
        if config is None:
            keep_float([node])
        else:
            annotate_weighted(node, config, flag=True)


def annotate_conv(gm: GraphModule, config: QuantizationConfig | None, allowed: Filter) -> None:
    """conv2d / conv1d patterns, fused first (QAT conv-bn ones for QAT or None configs)."""
    if config is None or config.is_qat:
        _conv_binary(gm, config, allowed, (RELU,), qat=True)
        _conv_binary(gm, config, allowed, (), qat=True)
        _conv_unary(gm, config, allowed, qat=True)
        _qat_conv_bn(gm, config, allowed)
    _conv_binary(gm, config, allowed, (RELU,), qat=False)
    _conv_binary(gm, config, allowed, (), qat=False)
    _conv_unary(gm, config, allowed, qat=False)
    _single(gm, CONV2D, config, allowed)


def _reused(node: Node) -> bool:
    """``node``'s module is called more than once and the graph has no per-call source record
    (non-strict export): torchao's source partitions then hold several calls, and its linear
    fusions leave such a module to the single-linear recipe; so does qviz."""
    if "source_fn_stack" in node.meta or not node.meta.get("nn_module_stack"):
        return False
    fqn = list(node.meta["nn_module_stack"].values())[-1][0]
    return any(
        other is not node
        and other.target == node.target
        and other.meta.get("nn_module_stack")
        and list(other.meta["nn_module_stack"].values())[-1][0] == fqn
        for other in node.graph.nodes
    )


def _linear_binary(gm, config, allowed, tail: tuple) -> None:
    """linear → add [→ relu]: the linear's inputs quantized; the add's other input stays float
    (for accuracy, as torchao's recipe)."""
    for chain in chains(gm, [(aten.linear.default,), ADD, *tail]):
        linear, add, last = chain[0], chain[1], chain[-1]
        if any(_reused(n) for n in (linear, *chain[2:])) or len(linear.users) != 1:
            continue
        if other_input(add, linear) is None or not may_claim(chain[::-1], allowed):
            continue
        if config is None:
            keep_float(chain[::-1])
            continue
        annotate_weighted(linear, config, flag=False)
        set_annotation(add, {}, flag=last is add)
        if last is not add:
            set_annotation(last, flag=True)


def _linear_unary(gm, config, allowed) -> None:
    for ops in _LINEAR_UNARY:
        for linear, unary in chains(gm, [(aten.linear.default,), ops]):
            if _reused(linear) or _reused(unary) or not may_claim([unary, linear], allowed):
                continue
            if config is None:
                keep_float([linear, unary])
            else:
                annotate_weighted(linear, config, flag=False)
                set_annotation(unary, flag=True)


def annotate_linear(gm: GraphModule, config: QuantizationConfig | None, allowed: Filter) -> None:
    """linear patterns: linear + add [+ relu], linear + unary, then linear alone."""
    _linear_binary(gm, config, allowed, (RELU,))
    _linear_binary(gm, config, allowed, ())
    _linear_unary(gm, config, allowed)
    _single(gm, (aten.linear.default,), config, allowed)


def _annotate_all_inputs(gm, op, config, allowed, accept) -> None:
    """matmul / mul: every input activation quantized, output flagged."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not op:
            continue
        if not may_claim([node], allowed):
            continue
        if config is None:
            keep_float([node])
        elif accept(node):
            set_annotation(node, dict.fromkeys(node.args, config.input_activation), flag=True)


def _same_shape_tensors(node: Node) -> bool:
    args = node.args[:2]
    vals = [a.meta.get("val") if isinstance(a, Node) else None for a in args]
    if len(node.args) != 2 or not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    return vals[0].shape == vals[1].shape


def annotate_with_config(gm: GraphModule, config: QuantizationConfig | None, allowed: Filter):
    """One setting's pass: the fusions, matmul, mul, then the int8-in int8-out propagation."""
    annotate_conv(gm, config, allowed)
    annotate_linear(gm, config, allowed)
    _annotate_all_inputs(gm, aten.matmul.default, config, allowed, lambda node: True)
    _annotate_all_inputs(gm, aten.mul.Tensor, config, allowed, _same_shape_tensors)
    propagate(gm, config, allowed)
