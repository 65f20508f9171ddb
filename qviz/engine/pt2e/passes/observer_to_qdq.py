"""One observer call becomes the quantize/dequantize ops its qparams describe.

What an observer becomes depends on what it observed:

* an integer or float8 dtype, static: ``quantize_per_tensor`` / ``dequantize_per_tensor``
  (Python float scale, int zero_point), or ``quantize_per_channel`` /
  ``dequantize_per_channel`` (scale and zero_point stored as buffers; also the float
  zero_points of ``per_channel_affine_float_qparams``, the embedding scheme);
* dynamic: ``choose_qparams`` (``choose_qparams_symmetric`` for symmetric schemes) at run time,
  then the ``.tensor`` variants of quantize/dequantize;
* float16: a round trip through half precision (``convert_element_type.no_fuse``);
* float32, bfloat16, float64: nothing (the observer is removed);
* an observer with its own ``convert(model, node)`` (torchao's affine observers, for
  per-group and per-token quantization) converts itself.

A dequantize whose input is not float32 (a bfloat16 model) returns that dtype
(``out_dtype=``), so the model's dtypes are unchanged. The observer node is replaced and its
users read the dequantized value; weights are quantized by the constant-folding pass after.

Example:
    >>> import torch
    >>> from qviz.engine.observers import MinMaxObserver
    >>> obs = MinMaxObserver(dtype=torch.qint8)
    >>> storage_dtype(obs.dtype)
    torch.int8
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule, Node

from qviz.engine.compat import quantized_decomposed
from qviz.engine.graph.get_attr import register_new_buffer
from qviz.engine.qparams import QParams
from qviz.errors import ConfigError

#: ``node.meta`` key naming the observer a q/dq node was made from (copies and folded weights
#: keep it), so convert can tell the plan which nodes execute which group.
OBSERVER_KEY = "qviz_observer"

#: Observers of these dtypes are removed (float16 becomes a half-precision round trip).
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
#: The dtypes a static observer is converted to quantize/dequantize ops for.
QUANTIZED_DTYPES = (
    torch.quint8, torch.qint8, torch.qint32, torch.uint8, torch.int8, torch.uint16,
    torch.int16, torch.int32, torch.float8_e5m2, torch.float8_e4m3fn,
)  # fmt: skip
_PER_CHANNEL = (
    torch.per_channel_affine,
    torch.per_channel_symmetric,
    torch.per_channel_affine_float_qparams,
)
_UNDERLYING = {torch.quint8: torch.uint8, torch.qint8: torch.int8, torch.qint32: torch.int32}


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The plain dtype a quantized tensor of ``dtype`` is stored in (``qint8`` -> ``int8``)."""
    return _UNDERLYING.get(dtype, dtype)


def _dq_kwargs(source: Any) -> dict[str, torch.dtype]:
    """``out_dtype`` for a dequantize whose input is not float32 (bfloat16 models)."""
    val = source.meta.get("val") if isinstance(source, Node) else None
    dtype = getattr(val, "dtype", torch.float32)
    return {"out_dtype": dtype} if dtype != torch.float32 and dtype.is_floating_point else {}


def _static_args(gm: GraphModule, node: Node, obs: nn.Module) -> tuple[Any, Any, tuple, QParams]:
    """The quantize and dequantize ops for a static observer, their qparam arguments, the record."""
    ops = quantized_decomposed()
    scale, zero_point = obs.calculate_qparams()
    common = (obs.quant_min, obs.quant_max, storage_dtype(obs.dtype))
    if getattr(obs, "qscheme", None) in _PER_CHANNEL:
        with gm.graph.inserting_before(node):
            s = gm.graph.get_attr(register_new_buffer(gm, "_scale_", scale))
            z = gm.graph.get_attr(register_new_buffer(gm, "_zero_point_", zero_point))
        record = QParams(tuple(scale.tolist()), tuple(zero_point.tolist()))
        ops_pair = (ops.quantize_per_channel.default, ops.dequantize_per_channel.default)
        return (*ops_pair, (s, z, int(obs.ch_axis), *common), record)
    scale, zero_point = float(scale), int(zero_point)
    ops_pair = (ops.quantize_per_tensor.default, ops.dequantize_per_tensor.default)
    return (*ops_pair, (scale, zero_point, *common), QParams(scale, zero_point))


def _replace_static(gm: GraphModule, node: Node, obs: nn.Module) -> QParams:
    source = node.args[0]
    q_op, dq_op, qargs, record = _static_args(gm, node, obs)
    with gm.graph.inserting_before(node):
        quantized = gm.graph.call_function(q_op, (source, *qargs))
        dequantized = gm.graph.call_function(dq_op, (quantized, *qargs), _dq_kwargs(source))
    node.replace_all_uses_with(dequantized)
    return record


def _replace_dynamic(gm: GraphModule, node: Node, obs: nn.Module) -> None:
    ops = quantized_decomposed()
    source, eps = node.args[0], getattr(obs, "eps", torch.finfo(torch.float32).eps)
    qmin, qmax, dtype = obs.quant_min, obs.quant_max, storage_dtype(obs.dtype)
    symmetric = getattr(obs, "qscheme", None) == torch.per_tensor_symmetric
    choose = ops.choose_qparams_symmetric.tensor if symmetric else ops.choose_qparams.tensor
    with gm.graph.inserting_before(node):
        chosen = gm.graph.call_function(choose, (source, qmin, qmax, eps, dtype))
        scale = gm.graph.call_function(operator.getitem, (chosen, 0))
        zero_point = gm.graph.call_function(operator.getitem, (chosen, 1))
        args = (scale, zero_point, qmin, qmax, dtype)
        quantized = gm.graph.call_function(ops.quantize_per_tensor.tensor, (source, *args))
        dequantized = gm.graph.call_function(
            ops.dequantize_per_tensor.tensor, (quantized, *args), _dq_kwargs(source)
        )
    node.replace_all_uses_with(dequantized)


def _replace_float16(gm: GraphModule, node: Node) -> None:
    convert = quantized_decomposed().convert_element_type.no_fuse
    with gm.graph.inserting_before(node):
        half = gm.graph.call_function(convert, (node.args[0], torch.float16))
        back = gm.graph.call_function(convert, (half, torch.float32))
    node.replace_all_uses_with(back)


def replace_observer(gm: GraphModule, node: Node, obs: nn.Module) -> QParams | None:
    """Replace the observer call ``node`` (its module ``obs``) by its q/dq ops; erase it.

    Returns:
        The qparams the quantize op uses, for static per-tensor and per-channel observers;
        None for the others (computed at run time, float, or converted by the observer).

    Raises:
        ConfigError: the observer's dtype has no quantize op.
    """
    name, previous, following = str(node.target), node.prev, node.next
    record = _replace(gm, node, obs)  # every replacement inserts its nodes where the call was
    new = previous.next
    while new is not following:
        new.meta[OBSERVER_KEY] = name
        new = new.next
    return record


def _replace(gm: GraphModule, node: Node, obs: nn.Module) -> QParams | None:
    record = None
    dtype = getattr(obs, "dtype", None)
    if callable(getattr(obs, "convert", None)):
        obs.convert(gm, node)
        return None
    if getattr(obs, "is_dynamic", False):
        _replace_dynamic(gm, node, obs)
    elif dtype == torch.float16:
        _replace_float16(gm, node)
    elif dtype in FLOAT_DTYPES:
        node.replace_all_uses_with(node.args[0])
    elif dtype in QUANTIZED_DTYPES:
        record = _replace_static(gm, node, obs)
    else:
        raise ConfigError(
            f"{node.format_node()}: observer {node.target} ({type(obs).__name__}) has dtype "
            f"{dtype}, which has no quantize op; use one of "
            f"{', '.join(str(d).replace('torch.', '') for d in QUANTIZED_DTYPES)}"
        )
    gm.graph.erase_node(node)
    return record
