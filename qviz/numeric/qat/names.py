"""What each fake-quantize module of a QAT-prepared graph quantizes, named from the graph.

A prepared model calls its fake-quantize modules ``activation_post_process_N``, which says
nothing about the tensor. The graph does: each ``call_module`` node of such a module has the
tensor it quantizes as its argument and the ops that read the result as its users. A tensor
computed from constants only (parameters and buffers, e.g. a conv's weight scaled by its
BatchNorm's running std) is a **weight**, named after the op that reads it
(``conv2d_1 weight``, or ``bias`` for a conv's or linear's third argument); anything else is an
**activation**, named after the op that produced it (``relu output``; ``input x`` for a model
input). One module that quantizes several tensors (a sharing group, e.g. a ReLU's output and the
max-pool after it) is named after the first and says how many more it covers.

Example:
    >>> import torch
    >>> from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e
    >>> from torchao.testing.pt2e._xnnpack_quantizer import (XNNPACKQuantizer,
    ...     get_symmetric_quantization_config)
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    >>> gm = torch.export.export(model, (torch.randn(2, 4),)).module()
    >>> prepared = prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config(is_qat=True)))
    >>> names = [n for n, _ in prepared.named_children() if "post_process" in n]
    >>> sorted(t.label for t in tensor_labels(prepared, names).values())
    ['input input_1', 'linear weight', 'relu output']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import fx, nn

_BIAS_ARG = 2  # conv2d / linear: (input, weight, bias)


@dataclass(frozen=True)
class TensorLabel:
    """What one fake-quantize module quantizes.

    Attributes:
        label: a short name for tables and legends (``conv2d_1 weight``, ``relu output``).
        is_weight: whether the tensor comes from constants only (a weight or bias).
        tensors: every tensor the module quantizes, as ``producer -> consumer`` edges.
    """

    label: str
    is_weight: bool
    tensors: tuple[str, ...] = ()


def _constant(node: fx.Node, memo: dict[fx.Node, bool]) -> bool:
    """Whether ``node`` is computed without any model input (no placeholder upstream)."""
    stack, order = [node], []
    while stack:  # iterative: a long chain of ops must not exhaust the recursion limit
        current = stack.pop()
        if current in memo or current in order:
            continue
        order.append(current)
        stack.extend(n for n in current.all_input_nodes if n not in memo)
    for current in reversed(order):
        if current.op == "placeholder":
            memo[current] = False
        else:
            memo[current] = all(memo.get(n, True) for n in current.all_input_nodes)
    return memo[node]


def _one(node: fx.Node, memo: dict[fx.Node, bool]) -> tuple[str, bool, str]:
    """``(label, is_weight, edge)`` of one call_module node of a fake-quantize module."""
    producer = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    users = list(node.users)
    edge = f"{producer.name if producer else '?'} -> {', '.join(u.name for u in users) or '-'}"
    if producer is not None and _constant(producer, memo) and users:
        consumer = users[0]
        index = next((i for i, a in enumerate(consumer.args) if a is node), 1)
        return f"{consumer.name} {'bias' if index == _BIAS_ARG else 'weight'}", True, edge
    if producer is None:
        return node.name, False, edge
    if producer.op == "placeholder":
        return f"input {producer.name}", False, edge
    return f"{producer.name} output", False, edge


def tensor_labels(model: nn.Module, names: Iterable[str]) -> dict[str, TensorLabel]:
    """Name the tensor each fake-quantize module of ``model`` quantizes, from its graph.

    Args:
        model: the prepared model (a ``torch.fx.GraphModule``; another module gets every name
            back as its own label).
        names: the module paths to label (a module reached under several paths is labelled
            under the path given here).

    Returns:
        ``{path: TensorLabel}`` for every path in ``names``.

    Example:
        >>> tensor_labels(nn.Linear(2, 2), ["weight_fake_quant"])["weight_fake_quant"].label
        'weight_fake_quant'
    """
    names = list(names)
    plain = {n: TensorLabel(n, False) for n in names}
    graph = getattr(model, "graph", None)
    if not isinstance(graph, fx.Graph):
        return plain
    path_of = {id(model.get_submodule(n)): n for n in names}
    found: dict[str, list[tuple[str, bool, str]]] = {}
    memo: dict[fx.Node, bool] = {}
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        try:
            module = model.get_submodule(str(node.target))
        except AttributeError:
            continue
        if id(module) in path_of:
            found.setdefault(path_of[id(module)], []).append(_one(node, memo))
    labels = dict(plain)
    for path, seen in found.items():
        label, is_weight, _ = seen[0]
        if len(seen) > 1:
            label += f" (+{len(seen) - 1} shared)"
        labels[path] = TensorLabel(label, is_weight, tuple(edge for _, _, edge in seen))
    return labels
