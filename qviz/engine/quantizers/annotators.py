"""XNNPACK's annotation rules: for each operator pattern, which node gets which spec.

Each annotator (``annotate_linear``, ``_annotate_conv``, ...) claims every unclaimed occurrence
of its pattern inside a :class:`~qviz.engine.quantizers.scope.Scope` with one QuantizationConfig
and returns the claimed partitions. They run in :data:`STATIC_ANNOTATORS` order (fused patterns
before their parts, as torchao's XNNPACKQuantizer), then :func:`propagate_shared` lets shape and
pooling operators share their producer's quantization.

=================  ==========================================================================
pattern            annotation (act = input/output activation spec of the config)
=================  ==========================================================================
conv → bn [→relu]  conv: input act, weight, bias; bn (or relu): output act (also transposed)
linear [→ relu]    linear: input act, weight, bias; linear (or relu): output act
conv [→ relu]      conv1d/2d: input act, weight, bias; conv (or relu): output act
convT → relu       conv_transpose: input act, weight, bias; relu: output act
adaptive avg pool  input act (shared with the producer if it is quantized); output shares input
add/mul [→ relu]   both tensor inputs act (skipped for non-float32 inputs); add/mul (or relu): act
cat                first input act; other inputs and output share the first input edge
sigmoid/softmax    input act; output FixedQParams scale 1/256, zero_point qmin (int8: -128)
tanh               input act; output FixedQParams scale 2/256, zero_point middle (int8: 0)
shape/pool ops     output and input share the producer's output (when it is quantized)
=================  ==========================================================================

Example:
    >>> import torch
    >>> from torch import nn
    >>> from qviz.engine.quantizers.scope import Scope
    >>> from qviz.engine.quantizers.config import get_symmetric_quantization_config
    >>> gm = torch.export.export(nn.Linear(2, 2).eval(), (torch.randn(1, 2),)).module()
    >>> [[n.name for n in p] for p in annotate_linear(gm, get_symmetric_quantization_config(),
    ...                                                Scope())]
    [['linear', 'weight', 'bias']]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.fx import GraphModule, Node

from qviz.engine.qparams import DTYPE_RANGES
from qviz.engine.quantizers.annotate import (
    DTYPE_CONSTRAINT,
    annotate,
    float_input_problem,
    is_annotated,
    mark_annotated,
    output_is_annotated,
    record_float_reason,
)
from qviz.engine.quantizers.patterns import (
    ADD_OPS,
    BN_OPS,
    CONV_ACT_OPS,
    CONV_BN_OPS,
    CONV_OPS,
    CONV_TRANSPOSE_BN_OPS,
    CONV_TRANSPOSE_OPS,
    LINEAR_OPS,
    MUL_OPS,
    RELU_OPS,
    PatternMatch,
    find_chains,
    nodes_calling,
)
from qviz.engine.quantizers.scope import Scope
from qviz.engine.specs import (
    FixedQParamsQuantizationSpec,
    QuantizationConfig,
    QuantizationSpec,
    SharedQuantizationSpec,
)

aten = torch.ops.aten
Partition = list[Node]
Annotator = Callable[[GraphModule, QuantizationConfig, Scope], list[Partition]]

#: Operators whose output shares the producer's quantization in torchao's XNNPACKQuantizer.
REFERENCE_SHARE_OPS = (
    aten.relu.default,
    aten.hardtanh.default,
    aten.hardtanh_.default,
    aten.max_pool2d.default,
    aten.mean.default,
    aten.mean.dim,
    aten.permute.default,
    aten.permute_copy.default,
    aten.squeeze.dim,
    aten.squeeze_copy.dim,
    aten.adaptive_avg_pool2d.default,
    aten.view_copy.default,
    aten.view.default,
    aten.slice_copy.Tensor,
    aten.flatten.using_ints,
)
#: qviz also lets these share: they move or average values without changing their range.
SHARE_OPS = (
    *REFERENCE_SHARE_OPS,
    aten.relu_.default,
    aten.avg_pool2d.default,
    aten.reshape.default,
    aten.unsqueeze.default,
    aten.squeeze.default,
    aten.squeeze.dims,
    aten.transpose.int,
    aten.slice.Tensor,
)
#: Operators with a known output range, quantized with fixed qparams: op → (range low, high).
FIXED_QPARAMS_OPS = {
    aten.sigmoid.default: (0.0, 1.0),
    aten.softmax.int: (0.0, 1.0),
    aten._softmax.default: (0.0, 1.0),
    aten.tanh.default: (-1.0, 1.0),
}


def _arg(node: Node, index: int) -> Node | None:
    value = node.args[index] if len(node.args) > index else None
    return value if isinstance(value, Node) else None


def _weighted_inputs(
    config: QuantizationConfig, op: Node, bias: Node | None
) -> dict[Node, QuantizationSpec | None]:
    inputs = {op.args[0]: config.input_activation, op.args[1]: config.weight}
    if bias is not None:
        inputs[bias] = config.bias
    return inputs


def _claim_fused(match: PatternMatch, config: QuantizationConfig, scope: Scope) -> Partition:
    """conv/linear (+ bn) (+ relu): inputs on the op, the output spec on the last node."""
    op, out, weight, bias = (match.roles[r] for r in ("op", "output", "weight", "bias"))
    bias = bias if isinstance(bias, Node) else None
    inner = [match.roles.get("bn"), match.roles.get("bn_item")]
    partition = list(dict.fromkeys(n for n in (out, *inner, op, weight, bias) if n is not None))
    if is_annotated(partition) or not scope.accepts(op, partition):
        return []
    annotate(op, _weighted_inputs(config, op, bias), None)
    annotate(out, {}, config.output_activation)
    mark_annotated([weight, bias])
    return partition


def _fused(heads: tuple, tail: list) -> Annotator:
    def annotator(gm: GraphModule, config: QuantizationConfig, scope: Scope) -> list[Partition]:
        claimed = (_claim_fused(m, config, scope) for m in find_chains(gm.graph, heads, tail))
        return [p for p in claimed if p]

    return annotator


_annotate_conv_bn_relu = _fused(CONV_BN_OPS, [BN_OPS, RELU_OPS])
_annotate_conv_bn = _fused(CONV_BN_OPS, [BN_OPS])
_annotate_conv_transpose_bn_relu = _fused(CONV_TRANSPOSE_BN_OPS, [BN_OPS, RELU_OPS])
_annotate_conv_transpose_bn = _fused(CONV_TRANSPOSE_BN_OPS, [BN_OPS])
_annotate_linear_relu = _fused(LINEAR_OPS, [RELU_OPS])
_annotate_conv_relu = _fused(CONV_ACT_OPS, [RELU_OPS])
_annotate_conv_transpose_relu = _fused(CONV_TRANSPOSE_OPS, [RELU_OPS])


def annotate_linear(gm: GraphModule, config: QuantizationConfig, scope: Scope) -> list[Partition]:
    """Each linear alone: input act, weight, bias; output act (None for dynamic configs).

    Returns the claimed partitions (see the module example).
    """
    out = []
    for linear in nodes_calling(gm.graph, LINEAR_OPS):
        if is_annotated([linear]) or not scope.accepts(linear, [linear]):
            continue
        bias = _arg(linear, 2)
        annotate(linear, _weighted_inputs(config, linear, bias), config.output_activation)
        mark_annotated([linear, _arg(linear, 1), bias])
        out.append([n for n in (linear, _arg(linear, 1), bias) if n is not None])
    return out


def _annotate_conv(gm: GraphModule, config: QuantizationConfig, scope: Scope) -> list[Partition]:
    """Each conv1d/conv2d alone: input act, weight, bias; output act."""
    out = []
    for conv in nodes_calling(gm.graph, CONV_OPS):
        bias = _arg(conv, 2)
        partition = [n for n in (conv, _arg(conv, 1), bias) if n is not None]
        if is_annotated(partition) or not scope.accepts(conv, partition):
            continue
        annotate(conv, _weighted_inputs(config, conv, bias), config.output_activation)
        mark_annotated(partition)
        out.append(partition)
    return out


def _annotate_adaptive_avg_pool2d(
    gm: GraphModule, config: QuantizationConfig, scope: Scope
) -> list[Partition]:
    """Output shares the input edge; the input shares its producer when that is quantized."""
    out = []
    for pool in nodes_calling(gm.graph, [aten.adaptive_avg_pool2d.default]):
        source = _arg(pool, 0)
        if source is None or is_annotated([pool]) or not scope.accepts(pool, [pool]):
            continue
        shared = output_is_annotated(source)
        in_spec = SharedQuantizationSpec(source) if shared else config.input_activation
        if in_spec is None:  # a weight-only config: no activation to share
            continue
        annotate(pool, {source: in_spec}, SharedQuantizationSpec((source, pool)))
        out.append([pool])
    return out


def _binary_inputs(
    gm: GraphModule, op: Node, spec: QuantizationSpec | None
) -> dict[Node, QuantizationSpec | None] | None:
    """Both tensor inputs of add/mul with ``spec``; None (and a float reason) if not float32."""
    inputs: dict[Node, QuantizationSpec | None] = {}
    for arg in op.args[:2]:
        if not isinstance(arg, Node):
            continue
        problem = float_input_problem(gm, arg)
        if problem is not None:
            record_float_reason(op, DTYPE_CONSTRAINT, problem)
            return None
        inputs[arg] = spec
    return inputs


def _binary_pairs(gm: GraphModule, ops: tuple, with_relu: bool) -> list[tuple[Node, Node]]:
    """(add/mul, node carrying the output spec): the relu when fused, else the op itself."""
    if not with_relu:
        return [(op, op) for op in nodes_calling(gm.graph, ops)]
    roles = [("input", "other"), ("input", "input")]
    matches = find_chains(gm.graph, ops, [RELU_OPS], roles)
    return [(m.roles["op"], m.roles["output"]) for m in matches]


def _binary(ops: tuple, with_relu: bool) -> Annotator:
    def annotator(gm: GraphModule, config: QuantizationConfig, scope: Scope) -> list[Partition]:
        out = []
        for op, last in _binary_pairs(gm, ops, with_relu):
            partition = list(dict.fromkeys([last, op]))
            if is_annotated(partition) or not scope.accepts(op, partition):
                continue
            inputs = _binary_inputs(gm, op, config.input_activation)
            if inputs is None:
                continue
            annotate(op, inputs, None if with_relu else config.output_activation)
            if with_relu:
                annotate(last, {}, config.output_activation)
            out.append(partition)
        return out

    return annotator


_annotate_add_relu = _binary(ADD_OPS, with_relu=True)
_annotate_add = _binary(ADD_OPS, with_relu=False)
_annotate_mul_relu = _binary(MUL_OPS, with_relu=True)
_annotate_mul = _binary(MUL_OPS, with_relu=False)


def _annotate_cat(gm: GraphModule, config: QuantizationConfig, scope: Scope) -> list[Partition]:
    """The first input gets act; the other inputs and the output share that first input edge."""
    out = []
    if config.input_activation is None:  # a weight-only config: no activation to share
        return out
    for cat in nodes_calling(gm.graph, [aten.cat.default]):
        tensors = [t for t in cat.args[0] if isinstance(t, Node)]
        if not tensors or is_annotated([cat]) or not scope.accepts(cat, [cat]):
            continue
        problems = [p for p in (float_input_problem(gm, t) for t in tensors) if p]
        if problems:
            record_float_reason(cat, DTYPE_CONSTRAINT, problems[0])
            continue
        shared = SharedQuantizationSpec((tensors[0], cat))
        inputs = {tensors[0]: config.input_activation}
        inputs.update({t: shared for t in tensors[1:] if t not in inputs})
        annotate(cat, inputs, shared)
        out.append([cat])
    return out


def fixed_qparams_spec(op: object, spec: QuantizationSpec) -> FixedQParamsQuantizationSpec:
    """The fixed output qparams of ``op`` on ``spec``'s integer grid (e.g. sigmoid: 1/256, -128).

    The op's output range [low, high] is spread over the whole grid: scale = (high - low) /
    (quant_max - quant_min + 1), and zero_point maps ``low`` to quant_min. This is the fixed-qparams
    convention of torch's ``default_fixed_qparams_range_*`` (sigmoid: 1/256 over 256 levels), not
    the observers' affine formula (:func:`qviz.engine.qparams.affine_qparams`, 1/255).

    Example:
        >>> from qviz.engine.quantizers.config import get_symmetric_quantization_config
        >>> act = get_symmetric_quantization_config().output_activation
        >>> s = fixed_qparams_spec(torch.ops.aten.tanh.default, act)
        >>> s.scale, s.zero_point, s.quant_min, s.quant_max
        (0.0078125, 0, -128, 127)
    """
    low, high = FIXED_QPARAMS_OPS[op]
    default_min, default_max = DTYPE_RANGES.get(spec.dtype, (-128, 127))
    qmin = spec.quant_min if spec.quant_min is not None else default_min
    qmax = spec.quant_max if spec.quant_max is not None else default_max
    scale = (high - low) / (qmax - qmin + 1)
    zero_point = qmin - round(low / scale)
    return FixedQParamsQuantizationSpec(
        dtype=spec.dtype,
        scale=scale,
        zero_point=zero_point,
        quant_min=qmin,
        quant_max=qmax,
        qscheme=torch.per_tensor_affine,
    )


def _annotate_fixed_qparams(
    gm: GraphModule, config: QuantizationConfig, scope: Scope
) -> list[Partition]:
    """sigmoid / softmax / tanh: input act; output with the fixed qparams XNNPACK expects."""
    out = []
    if config.output_activation is None:
        return out
    for node in nodes_calling(gm.graph, FIXED_QPARAMS_OPS):
        source = _arg(node, 0)
        if source is None or is_annotated([node]) or not scope.accepts(node, [node]):
            continue
        problem = float_input_problem(gm, source)
        if problem is not None:
            record_float_reason(node, DTYPE_CONSTRAINT, problem)
            continue
        fixed = fixed_qparams_spec(node.target, config.output_activation)
        annotate(node, {source: config.input_activation}, fixed)
        out.append([node])
    return out


#: Static patterns, in the order they claim nodes (fused patterns first).
STATIC_ANNOTATORS: tuple[Annotator, ...] = (
    _annotate_conv_bn_relu,
    _annotate_conv_bn,
    _annotate_conv_transpose_bn_relu,
    _annotate_conv_transpose_bn,
    _annotate_linear_relu,
    annotate_linear,
    _annotate_conv_relu,
    _annotate_conv,
    _annotate_conv_transpose_relu,
    _annotate_adaptive_avg_pool2d,
    _annotate_add_relu,
    _annotate_add,
    _annotate_mul_relu,
    _annotate_mul,
    _annotate_cat,
    _annotate_fixed_qparams,
)
#: Dynamic quantization covers linear only.
DYNAMIC_ANNOTATORS: tuple[Annotator, ...] = (annotate_linear,)


def propagate_shared(gm: GraphModule, keep_float: Callable[[Node], bool]) -> None:
    """Let each :data:`SHARE_OPS` node share its producer's quantized output, in graph order.

    A node is skipped when it is already claimed, when its producer's output is not quantized,
    or when ``keep_float(node)`` (a scope set to None covers it).

    Example:
        >>> from torch import nn
        >>> from qviz.engine.quantizers.scope import Scope
        >>> from qviz.engine.quantizers.config import get_symmetric_quantization_config
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Flatten()).eval()
        >>> gm = torch.export.export(model, (torch.randn(1, 2),)).module()
        >>> _ = annotate_linear(gm, get_symmetric_quantization_config(), Scope())
        >>> propagate_shared(gm, keep_float=lambda node: False)
        >>> flatten = next(n for n in gm.graph.nodes if n.name == "flatten")
        >>> flatten.meta["quantization_annotation"].output_qspec
        SharedQuantizationSpec(edge_or_node=linear)
    """
    for node in nodes_calling(gm.graph, SHARE_OPS):
        source = _arg(node, 0)
        if source is None or is_annotated([node]) or keep_float(node):
            continue
        annotation = source.meta.get("quantization_annotation")
        if annotation is None or annotation.output_qspec is None:
            continue
        shared = SharedQuantizationSpec(source)
        annotate(node, {source: shared}, shared)
