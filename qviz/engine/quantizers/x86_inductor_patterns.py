"""X86InductorQuantizer's recipe: which node of each pattern Inductor's x86 lowering fuses gets
which spec.

The recipe quantizes the *inputs* of the int8 kernels (activation and weight); an output is
quantized where the next int8 kernel reads it. Each pattern's last node is flagged
``_is_output_of_quantized_pattern`` on its :class:`X86Annotation`, which is how the propagation
step below knows that a pooling or cat reads an int8 tensor.

==========================  ====================================================================
pattern                     annotation (act = the config's input activation spec)
==========================  ====================================================================
conv2d → add → relu         conv: act, weight, bias; add: act on its other input; relu: flagged
conv2d → add                conv: act, weight, bias; add: act on its other input, flagged
conv → unary                conv2d + relu / hardtanh (relu6) / hardswish / silu, conv1d + relu:
                            conv: act, weight, bias; the unary op: flagged
conv2d                      act, weight, bias; flagged
linear → add [→ relu]       linear: act, weight, bias; add (its other input stays float) and
                            relu: claimed, the last flagged
linear → unary              relu / leaky_relu / tanh / gelu: linear as above; unary flagged
linear, matmul, mul         every tensor input act (mul: two same-shape tensors); flagged
QAT conv2d → bn [...]       as above with the batch norm between; the last node's output act
max_pool2d, cat, avg pools  int8 in, int8 out: when every input is a flagged output, the first
flatten                     input act (cat: the others share it) and the output shares the input
==========================  ====================================================================

Patterns match on ATen operators, call site by call site. A pattern claims its nodes once; a node
a setting leaves in float (config None) is claimed with an empty annotation, as torchao's.

Example:
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()).eval()
    >>> gm = torch.export.export(model, (torch.randn(1, 1, 5, 5),)).module()
    >>> [[n.name for n in chain] for chain in chains(gm, [CONV2D, RELU])]
    [['conv2d', 'relu']]
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from qviz.engine.graph.module_stack import module_names
from qviz.engine.quantizers.annotate import mark_annotated
from qviz.engine.specs import (
    Q_ANNOTATION_KEY,
    QuantizationAnnotation,
    QuantizationConfig,
    SharedQuantizationSpec,
)

aten = torch.ops.aten
#: A pattern's nodes (its output nodes, as torchao's filters see them) → may it be claimed?
Filter = Callable[[list[Node]], bool]

RELU = (aten.relu.default, aten.relu_.default)
ADD = (aten.add.Tensor, aten.add_.Tensor)
CONV2D = (aten.conv2d.default,)
CONV2D_UNARY = (
    *RELU,
    aten.hardtanh.default,
    aten.hardtanh_.default,
    aten.hardswish.default,
    aten.hardswish_.default,
    aten.silu.default,
    aten.silu_.default,
)
LINEAR_UNARY = (
    *RELU,
    aten.leaky_relu.default,
    aten.leaky_relu_.default,
    aten.tanh.default,
    aten.tanh_.default,
    aten.gelu.default,
    aten.gelu_.default,
)
BN_TRAIN = (
    aten.batch_norm.default,
    aten._native_batch_norm_legit.default,
    aten.cudnn_batch_norm.default,
)
#: Inductor runs these on int8 when their input is int8, and returns int8.
INT8_IN_INT8_OUT = (
    aten.max_pool2d.default,
    aten.cat.default,
    aten.avg_pool2d.default,
    aten.adaptive_avg_pool2d.default,
    aten.flatten.using_ints,
)
#: Quantized by the default recipe (a pattern is governed by set_global when it holds one).
DEFAULT_QUANTIZABLE = (
    *INT8_IN_INT8_OUT,
    aten.conv1d.default,
    aten.conv2d.default,
    aten.linear.default,
    aten.mul.Tensor,
)
#: Also quantizable, on request (set_function_type_qconfig(torch.matmul, ...)).
QUANTIZABLE = (*DEFAULT_QUANTIZABLE, aten.matmul.default)


@dataclass
class X86Annotation(QuantizationAnnotation):
    """qviz's annotation with the x86 recipe's flag (see the module docstring); prepare and
    convert keep it as it is, so the flag can be read on the prepared and converted graphs."""

    _is_output_of_quantized_pattern: bool = False


def is_claimed(node: Node) -> bool:
    """Whether a pattern has claimed ``node`` (``_annotated``)."""
    ann = node.meta.get(Q_ANNOTATION_KEY)
    return ann is not None and bool(getattr(ann, "_annotated", False))


def is_int8_output(node: Node) -> bool:
    """``node`` is claimed and flagged as the output of a quantized pattern."""
    ann = node.meta.get(Q_ANNOTATION_KEY)
    return is_claimed(node) and bool(getattr(ann, "_is_output_of_quantized_pattern", False))


def may_claim(nodes: Sequence[Node], allowed: Filter) -> bool:
    """Whether no node of the pattern is claimed yet and ``allowed`` lets it be."""
    return not any(is_claimed(n) for n in nodes) and allowed(list(nodes))


def set_annotation(node: Node, inputs: dict | None = None, output=None, flag=False) -> None:
    """Give ``node`` a claimed :class:`X86Annotation` with these specs and flag."""
    node.meta[Q_ANNOTATION_KEY] = X86Annotation(
        dict(inputs or {}), output, _annotated=True, _is_output_of_quantized_pattern=flag
    )


def keep_float(nodes: Iterable[Node]) -> None:
    """Claim ``nodes`` without quantizing them (a setting with config None)."""
    for node in nodes:
        set_annotation(node)


def mark_claimed(nodes: Iterable[Node | None]) -> None:
    """Claim ``nodes`` (the batch norm of a QAT pattern too), keeping annotations."""
    mark_annotated(nodes, X86Annotation)


def weighted_inputs(node: Node, config: QuantizationConfig) -> dict:
    """conv / linear: the activation, weight and (if any) bias specs."""
    inputs = {node.args[0]: config.input_activation, node.args[1]: config.weight}
    bias = node.args[2] if len(node.args) > 2 else None
    if isinstance(bias, Node):
        inputs[bias] = config.bias
    return inputs


def annotate_weighted(node: Node, config: QuantizationConfig, flag: bool) -> None:
    """conv / linear: quantize its inputs; ``flag``: it ends its pattern."""
    set_annotation(node, weighted_inputs(node, config), flag=flag)


# -- finding chains ----------------------------------------------------------------------------


def _users(node: Node, ops: Sequence[object], order: dict[Node, int]) -> list[Node]:
    found = [u for u in node.users if u.op == "call_function" and u.target in ops]
    return sorted(found, key=order.__getitem__)


def _bn_output(bn: Node) -> Node | None:
    """A training batch norm's value: itself, or ``getitem(bn, 0)`` for a tuple output."""
    if bn.target is aten.batch_norm.default:
        return bn
    items = [u for u in bn.users if u.target is operator.getitem and u.args[1] == 0]
    return items[0] if len(items) == 1 else None


def chains(gm: GraphModule, steps: Sequence[Sequence[object]]) -> list[list[Node]]:
    """Every ``n0 → n1 → ...`` with ``n_i``'s operator in ``steps[i]``, in graph order of
    ``n0``, then of ``n1``, ... (a batch-norm step stands for its value node)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    found: list[list[Node]] = []

    def extend(chain: list[Node], step: int) -> None:
        if step == len(steps):
            found.append(chain)
            return
        for user in _users(chain[-1], steps[step], order):
            value = _bn_output(user) if steps[step] is BN_TRAIN else user
            if value is not None:
                extend([*chain, value], step + 1)

    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in steps[0]:
            extend([node], 1)
    return found


def other_input(binary: Node, node: Node) -> Node | None:
    """The add's input that is not ``node`` (None if ``node`` is not a direct argument, or the
    other operand is not a tensor node)."""
    args = binary.args[:2]
    if len(args) < 2 or node not in args:
        return None
    other = args[1] if args[0] is node else args[0]
    return other if isinstance(other, Node) else None


# -- the int8-in int8-out propagation ----------------------------------------------------------


def _annotate_cat(node: Node, config: QuantizationConfig) -> None:
    inputs = list(node.args[0])
    first = inputs[0]
    specs = {first: config.input_activation}
    for other in inputs[1:]:
        specs.setdefault(other, SharedQuantizationSpec((first, node)))
    set_annotation(node, specs, flag=True)


def _reads_int8(node: Node) -> bool:
    if node.target is aten.max_pool2d.default:
        return is_int8_output(node.all_input_nodes[0])
    if node.target is aten.cat.default:
        return all(is_int8_output(n) for n in node.all_input_nodes)
    if node.target is aten.flatten.using_ints and node.users:
        if not any(u.target in QUANTIZABLE for u in node.users):
            return False
    return is_int8_output(node.all_input_nodes[0])


def propagate(gm: GraphModule, config: QuantizationConfig | None, allowed: Filter) -> None:
    """Claim the int8-in int8-out operators whose inputs are all flagged outputs."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in INT8_IN_INT8_OUT:
            continue
        if not may_claim([node], allowed):
            continue
        if config is None:
            keep_float([node])
        elif _reads_int8(node):
            if node.target is aten.cat.default:
                _annotate_cat(node, config)
            else:
                source = node.all_input_nodes[0]
                set_annotation(node, {source: config.input_activation}, flag=True)


def share_outputs(gm: GraphModule) -> None:
    """An int8-in int8-out operator's output shares its (first) input's quantization."""
    for node in gm.graph.nodes:
        if node.target not in INT8_IN_INT8_OUT or not is_int8_output(node):
            continue
        source = node.args[0] if node.target is aten.max_pool2d.default else None
        source = source if isinstance(source, Node) else node.all_input_nodes[0]
        node.meta[Q_ANNOTATION_KEY].output_qspec = SharedQuantizationSpec((source, node))


# -- which setting a pattern falls under -------------------------------------------------------


def module_name_filter(name: str) -> Filter:
    """Every node of the pattern was called inside the module ``name``."""
    return lambda nodes: all(name in module_names(n) for n in nodes)


def operator_filter(op: object) -> Filter:
    """Exactly one node of the pattern calls ``op``."""
    return lambda nodes: sum(n.target == op for n in nodes) == 1


def global_filter(nodes: list[Node]) -> bool:
    """Exactly one node of the pattern is a default-quantizable operator."""
    return sum(n.target in DEFAULT_QUANTIZABLE for n in nodes) == 1
