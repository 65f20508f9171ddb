"""Debug handles: a stable number per operator, shared by a float graph and its quantized copies.

``qviz.export`` numbers every ``call_function`` node of the captured graph in graph order and
stores the number in ``node.meta["qviz_handle"]``. ``prepare_pt2e`` works on a deep copy, so the
prepared and converted models carry the same numbers on the same operators (a graph module that
did not come from ``qviz.export`` is numbered the same way, on prepare's copy); quantize and
dequantize nodes inserted later have none. The numeric suite matches an operator of the
quantized model with its float counterpart by this number, never by node name.

One operator can stand for several float ones: when prepare folds a BatchNorm into the conv
before it, the conv's output becomes the BatchNorm's, so the conv also records the handle of the
float node whose output it now computes (``node.meta["qviz_compare_as"]``).
:func:`float_handle` gives the handle to compare with.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU()).eval()
    >>> gm = qviz.export(model, (torch.randn(1, 1, 5, 5),))
    >>> [(n.name, handle(n)) for n in gm.graph.nodes if handle(n) is not None]
    [('conv2d', 0), ('batch_norm', 1), ('relu', 2)]
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> conv = next(n for n in prepared.graph.nodes if n.name == "conv2d")
    >>> handle(conv), float_handle(conv)  # the folded conv computes the BatchNorm's output
    (0, 1)
"""

from __future__ import annotations

from torch.fx import GraphModule, Node

#: ``node.meta`` key of an operator's debug handle (an int).
HANDLE = "qviz_handle"
#: ``node.meta`` key of the handle of the float node whose output this node now computes.
COMPARE_AS = "qviz_compare_as"


def assign_handles(gm: GraphModule) -> GraphModule:
    """Number every ``call_function`` node without a handle, in graph order, after the others.

    Numbering a fresh graph gives 0, 1, 2, ... in graph order, so the same program numbered twice
    (or a copy of it) gets the same numbers. Returns ``gm``, changed in place.

    Example:
        >>> import torch
        >>> gm = torch.export.export(torch.nn.ReLU(), (torch.randn(2),)).module()
        >>> [handle(n) for n in assign_handles(gm).graph.nodes if n.op == "call_function"]
        [0]
    """
    taken = [n.meta[HANDLE] for n in gm.graph.nodes if isinstance(n.meta.get(HANDLE), int)]
    nxt = max(taken, default=-1) + 1
    for node in gm.graph.nodes:
        if node.op == "call_function" and not isinstance(node.meta.get(HANDLE), int):
            node.meta[HANDLE] = nxt
            nxt += 1
    return gm


def handle(node: Node) -> int | None:
    """The node's debug handle, or None (placeholders, weights, inserted quantize ops).

    Example:
        >>> import torch
        >>> gm = assign_handles(torch.export.export(torch.nn.ReLU(), (torch.randn(2),)).module())
        >>> [(n.op, handle(n)) for n in gm.graph.nodes if n.op != "call_module"]
        [('placeholder', None), ('call_function', 0), ('output', None)]
    """
    value = node.meta.get(HANDLE)
    return value if isinstance(value, int) else None


def float_handle(node: Node) -> int | None:
    """The handle of the float node whose output ``node`` computes (itself unless folded).

    Example:
        >>> import torch
        >>> gm = assign_handles(torch.export.export(torch.nn.ReLU(), (torch.randn(2),)).module())
        >>> relu = next(n for n in gm.graph.nodes if n.op == "call_function")
        >>> float_handle(relu) == handle(relu)
        True
    """
    value = node.meta.get(COMPARE_AS)
    return value if isinstance(value, int) else handle(node)
