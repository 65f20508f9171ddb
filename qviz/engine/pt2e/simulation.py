"""A converted model's outputs, bit for bit, at about the cost of a float forward.

A converted model (:func:`qviz.convert_pt2e`) is the reference for what quantization does to
the numbers, but its quantize / dequantize operators run as separate eager ops: each stored
integer weight is dequantized again on every call, and each quantized activation makes an
integer tensor and a float one through eight allocating passes. Scoring many variants over the
same data pays that on every batch. :func:`simulated` rewrites a copy of the graph so that

* every integer constant's ``dequantize`` is computed once, with the same operator and
  arguments, and stored as a float constant (the value the converted model computes each call);
* every activation's ``quantize`` followed by ``dequantize``\\ s of the same parameters becomes
  one :func:`fake_quantize` call: the reference operators' own arithmetic (``x * (1.0 /
  scale)``, round half to even, ``+ zero_point``, clamp, ``- zero_point``, ``* scale``, all in
  float32) written as in-place steps on one new tensor, so no integer tensor is made.

Every integer on the way is exact in float32 (8- and 16-bit grids), so each step gives the
reference's value, and the outputs are the converted model's bit for bit (tested on every model
of the benchmarks). Anything else (dynamic quantization, per-channel activations, affine
per-group ops, tensor-valued qparams, loop bodies) is left as the converted model has it.

The converted model is not changed; the copy shares its other constants.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> x = torch.randn(8, 4)
    >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 2)).eval(), (x,))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> converted = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), x, progress=False))
    >>> fast = simulated(converted)
    >>> torch.equal(fast(x), converted(x))
    True
    >>> [n.target.__name__ for n in fast.graph.nodes if n.op == "call_function"]
    ['fake_quantize', 'linear.default', 'fake_quantize']
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from qviz.engine.compat import quantized_decomposed
from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.graph.memo import ContentDigest
from qviz.engine.graph.qdq_ops import dequantize_ops
from qviz.errors import ConfigError

#: Integer grids whose every value (and every value plus or minus a zero point on the grid) is
#: exact in float32: the quantize / dequantize pair can be computed without the integer tensor.
_EXACT_GRIDS = (torch.int8, torch.uint8, torch.int16, torch.uint16)

#: ``GraphModule.meta`` key marking a simulation (so it is never simulated twice).
SIMULATED_KEY = "qviz_simulated"


def fake_quantize(
    x: torch.Tensor, scale: float, zero_point: int, quant_min: int, quant_max: int, dtype: Any
) -> torch.Tensor:
    """``dequantize_per_tensor(quantize_per_tensor(x, ...), ...)`` with the same arguments, bit
    for bit, without the integer tensor in between.

    The steps are the reference operators' own, in float32 (``torch.round`` rounds half to
    even, as they do); a float input that is not float32 goes through the reference operators.

    Example:
        >>> x = torch.tensor([-1.0, -0.26, 0.0, 0.25, 0.5, 9.0])
        >>> fake_quantize(x, 0.5, 3, -128, 127, torch.int8).tolist()
        [-1.0, -0.5, 0.0, 0.0, 0.5, 9.0]
    """
    if x.dtype != torch.float32:  # bfloat16 / float16: the reference converts first
        qd = quantized_decomposed()
        q = qd.quantize_per_tensor.default(x, scale, zero_point, quant_min, quant_max, dtype)
        return qd.dequantize_per_tensor.default(q, scale, zero_point, quant_min, quant_max, dtype)
    inv_scale = 1.0 / scale  # as quantize_per_tensor computes it
    y = torch.mul(x, inv_scale)
    y.round_().add_(zero_point).clamp_(quant_min, quant_max)
    return y.sub_(zero_point).mul_(scale)


def simulated(converted: GraphModule, *, constants: Any = None) -> GraphModule:
    """A copy of ``converted`` that computes its outputs bit for bit, faster (see the module
    docstring): weights dequantized once, activations fake-quantized in one step each.

    Args:
        converted: a model from :func:`qviz.convert_pt2e` (any graph module works: what is not
            a quantize / dequantize pattern it knows is kept as it is).
        constants: a :class:`~qviz.engine.graph.memo.ContentMemo` that keeps each dequantized
            weight by the exact operator and arguments it came from: simulations of several
            variants of one model (most of their integer weights the same) dequantize each
            weight once and share the float tensor. None: every weight is dequantized.

    Returns:
        A new graph module sharing ``converted``'s other constants and submodules; its
        ``meta`` holds the converted model's (the plan: ``plan_of``). ``converted`` is not
        changed.

    Raises:
        ConfigError: ``converted`` is not a torch.fx graph module.

    Example:
        >>> import torch
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> torch.equal(simulated(gm)(torch.ones(2)), torch.ones(2))  # nothing to rewrite
        True
    """
    if not isinstance(converted, GraphModule):
        raise ConfigError(
            f"simulated() needs the graph module qviz.convert_pt2e returns, got "
            f"{type(converted).__name__}"
        )
    if converted.meta.get(SIMULATED_KEY):
        return converted
    # a Graph's deepcopy keeps its code generator (the pytree in/out specs of an exported
    # module) and copies each node's meta shallowly; the graph is rewritten first, so the module
    # is made (and its code generated) once
    graph = copy.deepcopy(converted.graph)
    constants = _fold_constant_dequantize(converted, graph, constants)
    _fuse_quantize_dequantize(graph)
    for node in reversed(graph.nodes):  # the integer weights (and their qparams) nobody reads
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)
    graph.lint()
    shared = {  # what the graph still reads of the converted model: the same objects
        str(n.target): get_attr_value(converted, n.target)
        for n in graph.nodes
        if n.op in ("get_attr", "call_module") and str(n.target) not in constants
    }
    gm = GraphModule({**shared, **constants}, graph)
    gm.meta = dict(converted.meta)  # its own dict (the plan in it): the converted model's stays
    gm.meta[SIMULATED_KEY] = True
    return gm


def _constant(gm: GraphModule, arg: Any) -> Any:
    """``arg``'s value when it is a constant (a ``get_attr`` node, or not a node); else a
    marker that it is not."""
    if not isinstance(arg, Node):
        return arg
    if arg.op != "get_attr":
        return _NOT_CONSTANT
    return get_attr_value(gm, arg, default=_NOT_CONSTANT)


_NOT_CONSTANT = object()


def _fold_constant_dequantize(
    converted: GraphModule, graph: Graph, memo: Any = None
) -> dict[str, torch.Tensor]:
    """Each ``dequantize`` of ``graph`` (a copy of ``converted``'s) whose inputs are all
    constants becomes a float constant: the same operator, called once with the same arguments
    (or taken from ``memo``, by them). Returns the new constants by name."""
    constants: dict[str, torch.Tensor] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in dequantize_ops():
            continue
        args = [_constant(converted, a) for a in node.args]
        kwargs = {k: _constant(converted, v) for k, v in node.kwargs.items()}
        if any(a is _NOT_CONSTANT for a in (*args, *kwargs.values())):
            continue
        value = _dequantized(node.target, args, kwargs, memo)
        name = f"_simulated_constant{len(constants)}"
        while hasattr(converted, name):
            name += "_"
        constants[name] = value
        with graph.inserting_before(node):
            constant = graph.get_attr(name)
        constant.meta.update(node.meta)
        node.replace_all_uses_with(constant)
        graph.erase_node(node)
    return constants


def _dequantized(target: Any, args: list[Any], kwargs: dict[str, Any], memo: Any) -> Any:
    """``target(*args, **kwargs)`` once: ``memo`` (if any) keeps it by the operator and the
    exact arguments (tensors by dtype, shape and bytes)."""
    key = None
    if memo is not None:
        digest = ContentDigest().add(str(target))
        for value in (*args, *sorted(kwargs.items())):
            digest.add(value)
        key = digest.hexdigest()
        kept = memo.get(key)
        if kept is not None:
            return kept
    with torch.no_grad():
        value = target(*args, **kwargs)
    if key is not None:
        memo[key] = value
    return value


def fusable(q: Node) -> bool:
    """``q`` quantizes a tensor per tensor with plain numbers onto an exact grid, and every
    user dequantizes it back with the same numbers (no other output dtype): the pair is
    :func:`fake_quantize` with ``q``'s arguments, bit for bit.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> x = torch.randn(8, 4)
        >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 2)).eval(), (x,))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> c = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), x, progress=False))
        >>> [n.name for n in c.graph.nodes if fusable(n)]
        ['quantize_per_tensor_default_1', 'quantize_per_tensor_default_2']
    """
    qd = quantized_decomposed()
    if q.op != "call_function" or q.target != qd.quantize_per_tensor.default or q.kwargs:
        return False
    _, scale, zero_point, quant_min, quant_max, dtype = q.args
    plain = isinstance(scale, float) and all(
        isinstance(v, int) for v in (zero_point, quant_min, quant_max)
    )
    if not plain or dtype not in _EXACT_GRIDS or not q.users:
        return False
    return all(
        u.op == "call_function"
        and u.target == qd.dequantize_per_tensor.default
        and tuple(u.args[1:]) == tuple(q.args[1:])
        and not u.kwargs
        for u in q.users
    )


def _fuse_quantize_dequantize(graph: Graph) -> None:
    """Each fusable quantize and its dequantizes become one :func:`fake_quantize` call."""
    for q in [n for n in graph.nodes if fusable(n)]:
        with graph.inserting_before(q):
            fused = graph.call_function(fake_quantize, tuple(q.args))
        fused.meta.update(q.meta)
        for dq in list(q.users):
            dq.replace_all_uses_with(fused)
            graph.erase_node(dq)
        graph.erase_node(q)
