"""Reference representation: quantized linear and conv written out as integer arithmetic.

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
    ['dequantize_per_tensor.default', 'quantize_per_tensor.default', 'quantized_linear']
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.fx import GraphModule, Node

from qviz.engine.compat import quantized_decomposed
from qviz.engine.graph.debug_handles import COMPARE_AS, HANDLE
from qviz.engine.graph.get_attr import get_attr_value
from qviz.errors import ConfigError, QuantizationError

REPLACES = "qviz_replaces"
"""``node.meta`` key on each rewritten call: the name of the output quantize node it replaces."""

_INT8_TYPES = (torch.int8, torch.uint8)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
Scale = float | Tensor
ZeroPoint = int | Tensor

# --------------------------------------------------------------------------------------------
# The integer kernels: what the rewritten graph calls.
# --------------------------------------------------------------------------------------------


def _per_channel(value: Scale | ZeroPoint, dims_after: int, dtype: torch.dtype) -> Tensor:
    """A scalar, or a per-channel vector shaped ``(C, 1, ..., 1)`` to broadcast over channels."""
    tensor = torch.as_tensor(value)
    return tensor.to(dtype).reshape(-1, *(1,) * dims_after)


def _shift(q: Tensor, zero_point: Tensor, name: str) -> Tensor:
    """``q - zero_point`` widened to int16, so the difference of two int8 values cannot wrap."""
    if q.dtype not in _INT8_TYPES:
        raise QuantizationError(
            f"the reference kernels take int8 or uint8 tensors, got {name} of dtype {q.dtype}; "
            f"pass the output of quantize_per_tensor / the stored integer weight"
        )
    return q.to(torch.int16) - zero_point.to(torch.int16)


def _to_int32(exact: Tensor) -> Tensor:
    """Cast the float64 accumulator (integer-valued, exact, inside int32's range) to int32."""
    return exact.to(torch.int32)


def quantize_bias(bias: Tensor, x_scale: Scale, w_scale: Scale) -> Tensor:
    """Quantize a float bias to int32 with scale ``x_scale * w_scale``, zero_point 0.

    The accumulator of ``x_q * w_q`` counts units of ``x_scale * w_scale``, so the bias has to be
    counted in the same units before it can be added. Values beyond int32 are clamped.

    Args:
        bias: float bias, one value per output channel.
        x_scale: the input's scale.
        w_scale: the weight's scale, a float or one value per output channel.

    Returns:
        The int32 bias, same shape as ``bias``.

    Example:
        >>> quantize_bias(torch.tensor([0.3, -1.0]), 0.5, torch.tensor([0.1, 0.2]))
        tensor([  6, -10], dtype=torch.int32)
    """
    scale = torch.as_tensor(x_scale, dtype=torch.float64) * torch.as_tensor(
        w_scale, dtype=torch.float64
    )
    counted = torch.round(bias.to(torch.float64) / scale)
    return counted.clamp(_INT32_MIN, _INT32_MAX).to(torch.int32)


def requantize(
    acc: Tensor,
    multiplier: Tensor | float,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype = torch.int8,
    *,
    relu: bool = False,
) -> Tensor:
    """Scale an int32 accumulator to the output's integers: round, add zero_point, clamp.

    ``multiplier`` is ``x_scale * w_scale / out_scale`` (float64; a per-channel tensor broadcasts).
    Rounding is half to even, as in ``quantize_per_tensor``. With ``relu`` the lower bound is
    ``zero_point``, the integer that stands for 0.0, which equals quantizing ``relu(y)``.

    Args:
        acc: int32 accumulator.
        multiplier: the requantization multiplier.
        zero_point: the output's zero_point.
        quant_min: the output's smallest integer.
        quant_max: the output's largest integer.
        dtype: the output's integer dtype.
        relu: clamp at ``zero_point`` from below as well.

    Returns:
        The quantized output, of ``dtype``.

    Example:
        >>> requantize(torch.tensor([24, -500], dtype=torch.int32), 1.25, 3, -128, 127)
        tensor([  33, -128], dtype=torch.int8)
        >>> requantize(torch.tensor([24, -500], dtype=torch.int32), 1.25, 3, -128, 127, relu=True)
        tensor([33,  3], dtype=torch.int8)
    """
    scaled = torch.round(acc.to(torch.float64) * multiplier) + zero_point
    low = max(quant_min, zero_point) if relu else quant_min
    return scaled.clamp(low, quant_max).to(dtype)


@dataclass(frozen=True)
class _Output:
    """The output side shared by every kernel: qparams, integer range, dtype, fused relu."""

    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    dtype: torch.dtype
    relu: bool


def _finish(
    acc: Tensor, bias: Tensor | None, x_scale: Scale, w_scale: Scale, out: _Output, dims_after: int
) -> Tensor:
    """Add the int32 bias to the accumulator, then requantize: the tail of every kernel."""
    if bias is not None:
        acc = acc + _per_channel(quantize_bias(bias, x_scale, w_scale), dims_after, torch.int32)
    multiplier = float(x_scale) * _per_channel(w_scale, dims_after, torch.float64) / out.scale
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
    x = _shift(x_q, torch.as_tensor(x_zero_point), "x_q")
    w = _shift(w_q, _per_channel(w_zero_point, 1, torch.int64), "w_q")
    acc = _to_int32(torch.matmul(x.to(torch.float64), w.to(torch.float64).T))
    out = _Output(out_scale, out_zero_point, quant_min, quant_max, out_dtype, relu)
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
    x = _shift(x_q, torch.as_tensor(x_qparams[1]), "x_q")
    w = _shift(w_q, _per_channel(w_qparams[1], spatial + 1, torch.int64), "w_q")
    stride, padding, dilation, groups = geometry
    exact = conv(x.to(torch.float64), w.to(torch.float64), None, stride, padding, dilation, groups)
    return _finish(_to_int32(exact), bias, x_qparams[0], w_qparams[0], out, dims_after=spatial)


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
    out = _Output(out_scale, out_zero_point, quant_min, quant_max, out_dtype, relu)
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
    out = _Output(out_scale, out_zero_point, quant_min, quant_max, out_dtype, relu)
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


def _ops() -> Any:
    return quantized_decomposed()


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


def _is_call(node: Any, *targets: Any) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def _scalar_qparams(node: Node) -> bool:
    """A per-tensor q/dq node with Python-number qparams and an 8-bit integer dtype."""
    if len(node.args) < 6:
        return False
    scale, zero_point, dtype = node.args[1], node.args[2], node.args[5]
    numbers = isinstance(scale, float | int) and isinstance(zero_point, int)
    return numbers and dtype in _INT8_TYPES


def _arguments(node: Node) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in (aten ops only)."""
    schema = node.target._schema
    values = {}
    for index, arg in enumerate(schema.arguments):
        if index < len(node.args):
            values[arg.name] = node.args[index]
        else:
            values[arg.name] = node.kwargs.get(arg.name, arg.default_value)
    return values


def _is_weight_dq(node: Any) -> bool:
    ops = _ops()
    if _is_call(node, ops.dequantize_per_tensor.default):
        return _scalar_qparams(node) and _is_constant(node.args[0])
    if _is_call(node, ops.dequantize_per_channel.default) and len(node.args) >= 7:
        per_channel = isinstance(node.args[1], Node) and isinstance(node.args[2], Node)
        axis_ok = node.args[3] == 0 and node.args[6] in _INT8_TYPES
        return per_channel and axis_ok and _is_constant(node.args[0])
    return False


def _is_constant(node: Any) -> bool:
    return isinstance(node, Node) and node.op == "get_attr"


def _producer(quantize: Node) -> tuple[Node, Node | None] | None:
    """The linear/conv (and an optional relu after it) feeding ``quantize`` and nothing else."""
    source = quantize.args[0]
    relu = None
    if _is_call(source, torch.ops.aten.relu.default) and len(source.users) == 1:
        relu, source = source, source.args[0]
    if _is_call(source, *_kernels()) and len(source.users) == 1:
        return source, relu
    return None


def _match(quantize: Node) -> _Match | None:
    """The pattern ending at an output ``quantize_per_tensor`` node, or None if it is not one."""
    if not _is_call(quantize, _ops().quantize_per_tensor.default) or not _scalar_qparams(quantize):
        return None
    found = _producer(quantize)
    if found is None:
        return None
    op, relu = found
    arguments = _arguments(op)
    x_dq, w_dq = arguments["input"], arguments["weight"]
    x_ok = _is_call(x_dq, _ops().dequantize_per_tensor.default) and _scalar_qparams(x_dq)
    if not (x_ok and _is_weight_dq(w_dq)):
        return None
    return _Match(quantize, op, relu, x_dq, w_dq)


def _attribute(gm: GraphModule, node: Node) -> Tensor:
    """The tensor a ``get_attr`` node reads."""
    return get_attr_value(gm, node)


def _accumulator_bound(gm: GraphModule, match: _Match) -> int:
    """The largest |sum of x * w| any input can produce, from the stored integer weight."""
    weight = _attribute(gm, match.w_dq.args[0]).to(torch.int64)
    w_zero_point = match.w_dq.args[2]
    if isinstance(w_zero_point, Node):
        w_zero_point = _per_channel(_attribute(gm, w_zero_point), weight.dim() - 1, torch.int64)
    shifted = (weight - torch.as_tensor(w_zero_point)).abs()
    per_channel = shifted.reshape(shifted.shape[0], -1).sum(dim=1).max()
    x_zero_point, x_min, x_max = match.x_dq.args[2:5]
    return int(per_channel) * max(x_max - x_zero_point, x_zero_point - x_min)


def _kernel_call(match: _Match) -> tuple[Callable[..., Tensor], tuple, dict[str, Any]]:
    """The kernel, its positional arguments (tensors and qparams) and keyword arguments."""
    arguments = _arguments(match.op)
    x_q, x_scale, x_zero_point = match.x_dq.args[:3]
    w_q, w_scale, w_zero_point = match.w_dq.args[:3]
    out_scale, out_zero_point, quant_min, quant_max, out_dtype = match.quantize.args[1:6]
    args = (x_q, x_scale, x_zero_point, w_q, w_scale, w_zero_point, arguments["bias"])
    kwargs: dict[str, Any] = {
        name: arguments[name]
        for name in ("stride", "padding", "dilation", "groups")
        if name in arguments
    }
    kwargs.update(quant_min=quant_min, quant_max=quant_max, out_dtype=out_dtype)
    kwargs["relu"] = match.relu is not None
    return _kernels()[match.op.target], (*args, out_scale, out_zero_point), kwargs


def _rewrite(gm: GraphModule, match: _Match) -> Node:
    """Replace one pattern by a call of its integer kernel; erase what is left unused."""
    kernel, args, kwargs = _kernel_call(match)
    with gm.graph.inserting_before(match.quantize):
        call = gm.graph.call_function(kernel, args, kwargs)
    call.meta[REPLACES] = match.quantize.name
    for key in ("nn_module_stack", "stack_trace", "source_fn_stack", HANDLE, COMPARE_AS):
        if key in match.op.meta:
            call.meta[key] = match.op.meta[key]
    match.quantize.replace_all_uses_with(call)
    for node in (match.quantize, match.relu, match.op, match.x_dq, match.w_dq):
        if node is not None and not node.users:
            gm.graph.erase_node(node)
    return call


def to_reference_representation(gm: GraphModule) -> GraphModule:
    """Rewrite each quantized linear / conv1d / conv2d of a converted model into integer math.

    A pattern ``dequantize_per_tensor(x_q)``, ``dequantize_per_tensor|channel(w_int8)``, optional
    float bias → ``aten.linear|conv1d|conv2d`` → optional ``aten.relu`` → ``quantize_per_tensor``
    becomes one call of :func:`quantized_linear`, :func:`quantized_conv1d` or
    :func:`quantized_conv2d`, which returns the integer tensor the ``quantize_per_tensor`` node
    produced, so the ``dequantize`` after it is untouched. Each call's ``node.meta[REPLACES]``
    names the quantize node it replaced. Patterns that do not match (no output quantize, a float
    or non-constant weight, dynamic quantization, an op output read elsewhere, per-channel
    weights with ``axis != 0``) are left as they are; so is one whose int32 accumulator could
    overflow, with a warning. Works in place and returns ``gm``.

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
        ['quantized_conv2d']
        >>> reference(torch.randn(4, 1, 5, 5)).shape
        torch.Size([4, 2, 3, 3])
    """
    if not isinstance(gm, GraphModule):
        raise ConfigError(
            f"to_reference_representation needs a torch.fx GraphModule from qviz.convert_pt2e, "
            f"got {type(gm).__name__}"
        )
    matches = [m for m in map(_match, gm.graph.nodes) if m is not None]
    for match in matches:
        bound = _accumulator_bound(gm, match)
        if bound > _INT32_MAX:
            warnings.warn(
                f"left {match.op.format_node()} in float: its int32 accumulator could reach "
                f"{bound:,} > {_INT32_MAX:,}; use fewer input channels per output or 8-bit "
                f"inputs with a smaller range",
                stacklevel=2,
            )
            continue
        _rewrite(gm, match)
    gm.graph.lint()
    gm.recompile()
    return gm
