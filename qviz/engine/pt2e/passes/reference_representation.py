"""Reference representation: a converted model's quantized ops written out as integer arithmetic.

A converted model computes ``dq(x_q)``, ``dq(w_q)`` → float ``linear``/``conv`` → ``q(out)``: the
integers are only implied. :func:`to_reference_representation` rewrites each such pattern into
one call of a small Python function that shows what an integer backend does::

    x = x_q - x_zero_point                      int8 → int16, exact
    w = w_q - w_zero_point                      int8 → int16, per output channel
    acc = sum(x * w)                            int32 multiply-accumulate
    acc = acc + round(bias / (x_scale * w_scale))           bias quantized to int32
    out = clamp(round(acc * x_scale * w_scale / out_scale) + out_zero_point, quant_min, quant_max)

Worked example with one input and one weight: ``x_q = 10, x_zero_point = 2, x_scale = 0.5``
(x = 4.0), ``w_q = 3, w_scale = 0.25`` (w = 0.75), no bias, ``out_scale = 0.1, out_zero_point =
0``: ``acc = (10 - 2) * 3 = 24``, ``24 * 0.5 * 0.25 / 0.1 = 30``, so ``out_q = 30``, which is
``3.0 / 0.1``: the float product 4.0 * 0.75 = 3.0 quantized, with no float tensor in between.

**Exact int32 accumulation.** PyTorch on CPU has no integer matmul or convolution, so the
multiply-accumulate runs in float64 on integer-valued tensors and is then cast to int32. This is
exact: after the zero points are subtracted every factor lies in [-255, 255], so each product is
an integer of magnitude at most 65,025 < 2**16, and every partial sum is an integer no larger
than the sum of the products' magnitudes, which the rewrite checks is below 2**31, far below
2**53, the limit up to which float64 holds every integer.
Each multiplication and addition therefore produces an exactly representable integer, whatever
order or blocking the BLAS or im2col convolution routine uses, and the cast to int32 loses
nothing. (This needs routines that multiply and add the values themselves, as PyTorch's CPU
float64 matmul and convolution do; an FFT or Winograd convolution would round.)
That the sum fits int32 is checked when the graph is rewritten, from the stored int8 weights: a
pattern that could overflow is left unchanged, with a warning.

The requantization multiplies by ``x_scale * w_scale / out_scale`` in float64; an integer
backend stores it instead as an int32 fixed-point multiplier and a right shift.

``relu`` between the op and the output quantize is fused: in the integer domain it is a clamp at
``out_zero_point`` (the integer that stands for 0.0), which gives exactly ``q(relu(y))``.

The other patterns torchao's reference representation rewrites (add, add + ReLU, max pooling,
dynamically quantized linear, and the quantize / dequantize ops left over) have their functions
in :mod:`~qviz.engine.pt2e.passes.reference_ops` and their matchers in
:mod:`~qviz.engine.pt2e.passes.reference_patterns`. Where torchao's arithmetic differs, qviz's
follows the q/dq model (one rounding, half to even; the bias rounded, not truncated), so a
rewritten model stays within one step of the q/dq model it came from; each function's docstring
says where torchao's gives other integers. torchao's 4-bit groupwise dynamic linear (its own
``torchao::*_affine`` ops and a float ``torchao::reference_dqlinear_int4`` custom op) is not
rewritten: its pattern, and its bfloat16 rounding of the weight scales, belong to torchao.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> _ = qviz.calibrate(prepared, torch.randn(8, 4), progress=False)
    >>> model = to_reference_representation(qviz.convert_pt2e(prepared))
    >>> sorted({getattr(n.target, "__name__", "") for n in model.graph.nodes
    ...         if n.op == "call_function"})
    ['quantized_linear', 'reference_dequantize_per_tensor', 'reference_quantize_per_tensor']
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.fx import GraphModule, Node

from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.pt2e.passes.reference_ops import (
    Scale,
    ZeroPoint,
    _Output,
    exact_linear,
    per_channel,
    quantize_bias,
    requantize,
    shift,
)
from qviz.engine.pt2e.passes.reference_patterns import (
    REPLACES,  # noqa: F401  (re-exported)
    Rewrite,
    add_rewrite,
    arguments,
    dynamic_linear_rewrite,
    is_call,
    is_constant,
    max_pool_rewrite,
    ops,
    qdq_rewrite,
    replace_with_call,
    scalar_qparams,
)
from qviz.errors import ConfigError

_INT8_TYPES = (torch.int8, torch.uint8)
_INT32_MAX = 2**31 - 1

# --------------------------------------------------------------------------------------------
# The integer kernels of linear and conv: what the rewritten graph calls.
# --------------------------------------------------------------------------------------------


def _finish(
    acc: Tensor, bias: Tensor | None, x_scale: Scale, w_scale: Scale, out: _Output, dims_after: int
) -> Tensor:
    """Add the int32 bias to the accumulator, then requantize: the tail of every kernel."""
    if bias is not None:
        acc = acc + per_channel(quantize_bias(bias, x_scale, w_scale), dims_after, torch.int32)
    multiplier = float(x_scale) * per_channel(w_scale, dims_after, torch.float64) / out.scale
    return requantize(
        acc, multiplier, out.zero_point, out.quant_min, out.quant_max, out.dtype, relu=out.relu
    )


def quantized_linear(
    x_q: Tensor,
    x_scale: float,
    x_zero_point: int,
    w_q: Tensor,
    w_scale: Scale,
    w_zero_point: ZeroPoint,
    bias: Tensor | None,
    out_scale: float,
    out_zero_point: int,
    *,
    quant_min: int = -128,
    quant_max: int = 127,
    out_dtype: torch.dtype = torch.int8,
    relu: bool = False,
) -> Tensor:
    """``q(linear(dq(x_q), dq(w_q), bias))`` computed with integers only.

    Shift by the zero points (int16), multiply-accumulate in int32 (run exactly in float64,
    see the module docstring), add the int32 bias, requantize.

    Args:
        x_q: int8/uint8 input, features last.
        x_scale: the input's scale.
        x_zero_point: the input's zero_point.
        w_q: int8 weight ``(out_features, in_features)``.
        w_scale: the weight's scale, a float or one per output feature.
        w_zero_point: the weight's zero_point, an int or one per output feature.
        bias: float bias ``(out_features,)``, or None.
        out_scale: the output's scale.
        out_zero_point: the output's zero_point.
        quant_min: the output's smallest integer.
        quant_max: the output's largest integer.
        out_dtype: the output's integer dtype.
        relu: fuse a ReLU (clamp at ``out_zero_point``).

    Returns:
        The quantized output ``(..., out_features)`` of ``out_dtype``.

    Example:
        >>> x_q = torch.tensor([[10, 2]], dtype=torch.int8)
        >>> w_q = torch.tensor([[3, 5]], dtype=torch.int8)
        >>> quantized_linear(x_q, 0.5, 2, w_q, 0.25, 0, None, 0.1, 0)
        tensor([[30]], dtype=torch.int8)
    """
    x = shift(x_q, torch.as_tensor(x_zero_point), "x_q")
    w = shift(w_q, per_channel(w_zero_point, 1, torch.int64), "w_q")
    acc = exact_linear(x, w)
    out = _Output(
        scale=out_scale,
        zero_point=out_zero_point,
        quant_min=quant_min,
        quant_max=quant_max,
        dtype=out_dtype,
        relu=relu,
    )
    return _finish(acc, bias, x_scale, w_scale, out, dims_after=0)


def _quantized_conv(
    conv: Callable[..., Tensor],
    spatial: int,
    x_q: Tensor,
    x_qparams: tuple[float, int],
    w_q: Tensor,
    w_qparams: tuple[Scale, ZeroPoint],
    bias: Tensor | None,
    geometry: tuple[Any, Any, Any, int],
    out: _Output,
) -> Tensor:
    """The convolution kernels' shared body; ``spatial`` is 1 for conv1d, 2 for conv2d.

    Zero padding of the shifted input ``x_q - x_zero_point`` is padding with ``x_zero_point`` in
    the integer domain, i.e. padding with 0.0 in the float one, as the float convolution does.
    """
    x = shift(x_q, torch.as_tensor(x_qparams[1]), "x_q")
    w = shift(w_q, per_channel(w_qparams[1], spatial + 1, torch.int64), "w_q")
    stride, padding, dilation, groups = geometry
    exact = conv(x.to(torch.float64), w.to(torch.float64), None, stride, padding, dilation, groups)
    return _finish(exact.to(torch.int32), bias, x_qparams[0], w_qparams[0], out, dims_after=spatial)


def quantized_conv1d(
    x_q: Tensor,
    x_scale: float,
    x_zero_point: int,
    w_q: Tensor,
    w_scale: Scale,
    w_zero_point: ZeroPoint,
    bias: Tensor | None,
    out_scale: float,
    out_zero_point: int,
    *,
    stride: Sequence[int] | int = 1,
    padding: Sequence[int] | int = 0,
    dilation: Sequence[int] | int = 1,
    groups: int = 1,
    quant_min: int = -128,
    quant_max: int = 127,
    out_dtype: torch.dtype = torch.int8,
    relu: bool = False,
) -> Tensor:
    """``q(conv1d(dq(x_q), dq(w_q), bias))`` computed with integers only.

    Arguments as in :func:`quantized_conv2d`, with ``x_q`` of shape ``(N, C_in, L)`` and ``w_q``
    of shape ``(C_out, C_in / groups, K)``.

    Example:
        >>> x_q = torch.tensor([[[1, 2, 3]]], dtype=torch.int8)
        >>> w_q = torch.tensor([[[1, 1]]], dtype=torch.int8)
        >>> quantized_conv1d(x_q, 1.0, 0, w_q, 1.0, 0, None, 1.0, 0)
        tensor([[[3, 5]]], dtype=torch.int8)
    """
    out = _Output(
        scale=out_scale,
        zero_point=out_zero_point,
        quant_min=quant_min,
        quant_max=quant_max,
        dtype=out_dtype,
        relu=relu,
    )
    return _quantized_conv(
        torch.nn.functional.conv1d,
        1,
        x_q,
        (x_scale, x_zero_point),
        w_q,
        (w_scale, w_zero_point),
        bias,
        (stride, padding, dilation, groups),
        out,
    )


def quantized_conv2d(
    x_q: Tensor,
    x_scale: float,
    x_zero_point: int,
    w_q: Tensor,
    w_scale: Scale,
    w_zero_point: ZeroPoint,
    bias: Tensor | None,
    out_scale: float,
    out_zero_point: int,
    *,
    stride: Sequence[int] | int = 1,
    padding: Sequence[int] | int = 0,
    dilation: Sequence[int] | int = 1,
    groups: int = 1,
    quant_min: int = -128,
    quant_max: int = 127,
    out_dtype: torch.dtype = torch.int8,
    relu: bool = False,
) -> Tensor:
    """``q(conv2d(dq(x_q), dq(w_q), bias))`` computed with integers only.

    Args:
        x_q: int8/uint8 input ``(N, C_in, H, W)``.
        x_scale: the input's scale.
        x_zero_point: the input's zero_point.
        w_q: int8 weight ``(C_out, C_in / groups, kH, kW)``.
        w_scale: the weight's scale, a float or one per output channel.
        w_zero_point: the weight's zero_point, an int or one per output channel.
        bias: float bias ``(C_out,)``, or None.
        out_scale: the output's scale.
        out_zero_point: the output's zero_point.
        stride: as in ``torch.nn.functional.conv2d``.
        padding: as in ``torch.nn.functional.conv2d`` (zeros in the float domain).
        dilation: as in ``torch.nn.functional.conv2d``.
        groups: as in ``torch.nn.functional.conv2d``.
        quant_min: the output's smallest integer.
        quant_max: the output's largest integer.
        out_dtype: the output's integer dtype.
        relu: fuse a ReLU (clamp at ``out_zero_point``).

    Returns:
        The quantized output ``(N, C_out, H_out, W_out)`` of ``out_dtype``.

    Example:
        >>> x_q = torch.full((1, 1, 2, 2), 4, dtype=torch.int8)
        >>> w_q = torch.ones(2, 1, 2, 2, dtype=torch.int8)
        >>> quantized_conv2d(x_q, 0.5, 0, w_q, torch.tensor([0.5, 1.0]), torch.zeros(2), None,
        ...                  1.0, 0).flatten()
        tensor([4, 8], dtype=torch.int8)
    """
    out = _Output(
        scale=out_scale,
        zero_point=out_zero_point,
        quant_min=quant_min,
        quant_max=quant_max,
        dtype=out_dtype,
        relu=relu,
    )
    return _quantized_conv(
        torch.nn.functional.conv2d,
        2,
        x_q,
        (x_scale, x_zero_point),
        w_q,
        (w_scale, w_zero_point),
        bias,
        (stride, padding, dilation, groups),
        out,
    )


# --------------------------------------------------------------------------------------------
# The graph pass: find the patterns (pure), then rewrite each with one short function.
# --------------------------------------------------------------------------------------------


def _kernels() -> dict[Any, Callable[..., Tensor]]:
    aten = torch.ops.aten
    return {
        aten.linear.default: quantized_linear,
        aten.conv1d.default: quantized_conv1d,
        aten.conv2d.default: quantized_conv2d,
    }


@dataclass(frozen=True)
class _Match:
    """One rewritable pattern ``dq(x_q), dq(w_q) [, bias] -> op [-> relu] -> q``."""

    quantize: Node
    op: Node
    relu: Node | None
    x_dq: Node
    w_dq: Node


def _is_weight_dq(node: Any) -> bool:
    """A dequantize of stored 8-bit integers: per tensor, or per channel along axis 0."""
    if is_call(node, ops().dequantize_per_tensor.default):
        return scalar_qparams(node) and is_constant(node.args[0])
    if is_call(node, ops().dequantize_per_channel.default) and len(node.args) >= 7:
        per_channel_qparams = isinstance(node.args[1], Node) and isinstance(node.args[2], Node)
        axis_ok = node.args[3] == 0 and node.args[6] in _INT8_TYPES
        return per_channel_qparams and axis_ok and is_constant(node.args[0])
    return False


def _producer(quantize: Node) -> tuple[Node, Node | None] | None:
    """The linear/conv (and an optional relu after it) feeding ``quantize`` and nothing else."""
    source = quantize.args[0]
    relu = None
    if is_call(source, torch.ops.aten.relu.default) and len(source.users) == 1:
        relu, source = source, source.args[0]
    if is_call(source, *_kernels()) and len(source.users) == 1:
        return source, relu
    return None


def _match(quantize: Node) -> _Match | None:
    """The pattern ending at an output ``quantize_per_tensor`` node, or None if it is not one."""
    if not is_call(quantize, ops().quantize_per_tensor.default) or not scalar_qparams(quantize):
        return None
    found = _producer(quantize)
    if found is None:
        return None
    op, relu = found
    given = arguments(op)
    x_dq, w_dq = given["input"], given["weight"]
    x_ok = is_call(x_dq, ops().dequantize_per_tensor.default) and scalar_qparams(x_dq)
    if not (x_ok and _is_weight_dq(w_dq)):
        return None
    return _Match(quantize, op, relu, x_dq, w_dq)


def _accumulator_bound(gm: GraphModule, w_dq: Node, x_reach: int) -> int:
    """The largest |sum of x * w| any input can produce, from the stored integer weight;
    ``x_reach`` is the largest |x_q - x_zero_point|."""
    weight = get_attr_value(gm, w_dq.args[0]).to(torch.int64)
    w_zero_point = w_dq.args[2]
    if isinstance(w_zero_point, Node):
        w_zero_point = per_channel(get_attr_value(gm, w_zero_point), weight.dim() - 1, torch.int64)
    shifted = (weight - torch.as_tensor(w_zero_point)).abs()
    return int(shifted.reshape(shifted.shape[0], -1).sum(dim=1).max()) * x_reach


def _fits_int32(gm: GraphModule, op: Node, w_dq: Node, x_dq: Node, dynamic: bool) -> bool:
    """Whether the int32 accumulator cannot overflow; if it can, a warning says so."""
    x_zero_point, x_min, x_max = x_dq.args[2:5]
    reach = x_max - x_min if dynamic else max(x_max - x_zero_point, x_zero_point - x_min)
    bound = _accumulator_bound(gm, w_dq, reach)
    if bound <= _INT32_MAX:
        return True
    warnings.warn(
        f"left {op.format_node()} in float: its int32 accumulator could reach "
        f"{bound:,} > {_INT32_MAX:,}; use fewer input channels per output or 8-bit "
        f"inputs with a smaller range",
        stacklevel=3,
    )
    return False


def _kernel_call(match: _Match) -> tuple[Callable[..., Tensor], tuple, dict[str, Any]]:
    """The kernel, its positional arguments (tensors and qparams) and keyword arguments."""
    given = arguments(match.op)
    x_q, x_scale, x_zero_point = match.x_dq.args[:3]
    w_q, w_scale, w_zero_point = match.w_dq.args[:3]
    out_scale, out_zero_point, quant_min, quant_max, out_dtype = match.quantize.args[1:6]
    args = (x_q, x_scale, x_zero_point, w_q, w_scale, w_zero_point, given["bias"])
    kwargs: dict[str, Any] = {
        name: given[name] for name in ("stride", "padding", "dilation", "groups") if name in given
    }
    kwargs.update(quant_min=quant_min, quant_max=quant_max, out_dtype=out_dtype)
    kwargs["relu"] = match.relu is not None
    return _kernels()[match.op.target], (*args, out_scale, out_zero_point), kwargs


def _rewrite_linear_conv(gm: GraphModule) -> None:
    """Every quantized linear / conv whose accumulator fits int32, as one kernel call."""
    for match in [m for m in map(_match, gm.graph.nodes) if m is not None]:
        if _fits_int32(gm, match.op, match.w_dq, match.x_dq, dynamic=False):
            erasable = (match.relu, match.op, match.x_dq, match.w_dq)
            replace_with_call(gm, _kernel_call(match), match.quantize, match.op, erasable)


def _dynamic_linear(gm: GraphModule) -> Callable[[Node], Rewrite | None]:
    def rewrite(node: Node) -> Rewrite | None:
        found = dynamic_linear_rewrite(node, _is_weight_dq)
        if found is None or not _fits_int32(gm, node, node.args[1], node.args[0], dynamic=True):
            return None
        return found

    return rewrite


def _rewrite_each(gm: GraphModule, matcher: Callable[[Node], Rewrite | None]) -> None:
    """Walk the graph in order; rewrite each node ``matcher`` recognises, as soon as it is
    matched (a rewrite changes the inputs of the patterns after it)."""
    for node in list(gm.graph.nodes):
        found = None if getattr(node, "_erased", False) else matcher(node)
        if found is not None:
            replace_with_call(gm, found.call, found.replaced, found.meta_from, found.erasable)


def to_reference_representation(gm: GraphModule) -> GraphModule:
    """Rewrite the quantized ops of a converted model into integer math, one call per pattern.

    In this order:

    1. ``dequantize_per_tensor(x_q)``, ``dequantize_per_tensor|channel(w_int8)``, optional float
       bias → ``aten.linear|conv1d|conv2d`` → optional ``aten.relu`` → ``quantize_per_tensor``
       becomes one call of :func:`quantized_linear`, :func:`quantized_conv1d` or
       :func:`quantized_conv2d`, which returns the integer tensor the ``quantize_per_tensor``
       node produced;
    2. a dynamically quantized linear (``choose_qparams`` → ``quantize_per_tensor.tensor`` →
       ``dequantize_per_tensor.tensor``, an int8 weight, float output) becomes a call of
       :func:`~qviz.engine.pt2e.passes.reference_ops.dynamic_quantized_linear`;
    3. ``dq(x_q) + dq(y_q)`` → optional ``aten.relu`` → ``q`` becomes
       :func:`~qviz.engine.pt2e.passes.reference_ops.quantized_add`;
    4. ``dq(x_q)`` → ``aten.max_pool2d`` → ``q`` becomes
       :func:`~qviz.engine.pt2e.passes.reference_ops.quantized_max_pool2d`;
    5. every 8-bit quantize / dequantize op left (the model's input and output, the ops around
       what stays in float) becomes its written-out function, e.g.
       :func:`~qviz.engine.pt2e.passes.reference_ops.reference_quantize_per_tensor`, which
       gives the same bits as the op.

    Each call's ``node.meta[REPLACES]`` names the node whose value it computes (the output
    quantize of a pattern, the float linear of a dynamic one, the q/dq op itself). Patterns
    that do not match (no output quantize, a float or non-constant weight, an op output read
    elsewhere, per-channel weights with ``axis != 0``) are left in float between written-out
    q/dq; so is one whose int32 accumulator could overflow, with a warning. Works in place and
    returns ``gm``.

    Args:
        gm: a model returned by :func:`qviz.convert_pt2e` (weights folded, the default).

    Returns:
        ``gm``, rewritten, linted and recompiled.

    Raises:
        ConfigError: ``gm`` is not a torch.fx GraphModule.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU()).eval()
        >>> gm = qviz.export(model, (torch.randn(4, 1, 5, 5),))
        >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
        ...     get_symmetric_quantization_config(is_per_channel=True)))
        >>> _ = qviz.calibrate(prepared, torch.randn(4, 1, 5, 5), progress=False)
        >>> reference = to_reference_representation(qviz.convert_pt2e(prepared))
        >>> [n.name for n in reference.graph.nodes if REPLACES in n.meta]
        ['reference_quantize_per_tensor', 'quantized_conv2d', 'reference_dequantize_per_tensor']
        >>> reference(torch.randn(4, 1, 5, 5)).shape
        torch.Size([4, 2, 3, 3])
    """
    if not isinstance(gm, GraphModule):
        raise ConfigError(
            f"to_reference_representation needs a torch.fx GraphModule from qviz.convert_pt2e, "
            f"got {type(gm).__name__}"
        )
    _rewrite_linear_conv(gm)
    for matcher in (_dynamic_linear(gm), add_rewrite, max_pool_rewrite, qdq_rewrite):
        _rewrite_each(gm, matcher)
    gm.graph.lint()
    gm.recompile()
    return gm
