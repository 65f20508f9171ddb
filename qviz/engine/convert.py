"""convert_pt2e: observers become quantize/dequantize ops; constant weights become int8 tensors.

Each observer call is replaced by ``quantized_decomposed`` ops with the observer's qparams:
``quantize_per_tensor``/``dequantize_per_tensor`` (Python float scale and int zero_point),
``quantize_per_channel``/``dequantize_per_channel`` (scale and zero_point stored as buffers), or
for dynamic quantization ``choose_qparams`` then the ``.tensor`` variants. With ``fold_quantize``
a quantized constant (a weight) is computed once and stored as an integer tensor, so the model
keeps only ``dequantize`` for it. The prepared model is left as it is (convert works on a copy).

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> _ = qviz.calibrate(prepared, torch.randn(8, 4), progress=False)
    >>> quantized = qviz.convert_pt2e(prepared)
    >>> sorted({n.target.__name__ for n in quantized.graph.nodes if n.op == "call_function"})
    ['dequantize_per_tensor.default', 'linear.default', 'quantize_per_tensor.default']
"""

from __future__ import annotations

import copy
import operator

import torch
from torch import nn
from torch.fx import GraphModule, Node

from qviz.engine.compat import quantized_decomposed
from qviz.engine.constants import get_attr_value
from qviz.engine.plan import QParams, QuantPlan
from qviz.engine.stage import Stage, is_observer, model_stage
from qviz.errors import CalibrationError, ConfigError

__all__ = ["convert_pt2e", "is_observer"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_symmetric)


def _saw_no_data(obs: nn.Module) -> bool:
    if getattr(obs, "is_dynamic", False) or obs.dtype in _FLOAT_DTYPES:
        return False
    if type(obs).__name__ in ("FixedQParamsObserver", "DerivedQParamsObserver"):
        return False
    if hasattr(obs, "num_batches"):
        return int(obs.num_batches) == 0
    min_val = getattr(obs, "min_val", None)  # reference observers start at +inf
    return isinstance(min_val, torch.Tensor) and bool(torch.isinf(min_val).all())


def _check_calibrated(gm: GraphModule, nodes: list[Node], plan: QuantPlan | None) -> None:
    targets = dict.fromkeys(str(n.target) for n in nodes)  # graph order, each once
    unseen = [t for t in targets if _saw_no_data(gm.get_submodule(t))]
    if not unseen:
        return
    lines = []
    for name in unseen:
        members = [
            ", ".join(str(m) for m in g.members)
            for g in (plan.groups if plan else ())
            if g.observer == name
        ]
        lines.append(f"  {name} (observes {members[0] if members else 'a tensor'})")
    raise CalibrationError(
        f"{len(unseen)} observer(s) saw no data, so their qparams would be meaningless:\n"
        + "\n".join(lines)
        + "\nrun calibration batches through the prepared model first (qviz.calibrate), and "
        "check that the inputs reach these tensors"
    )


def _new_attr(gm: GraphModule, prefix: str, value: torch.Tensor) -> str:
    index = 0
    while hasattr(gm, f"{prefix}{index}"):
        index += 1
    gm.register_buffer(f"{prefix}{index}", value)
    return f"{prefix}{index}"


def _qdq_ops(gm: GraphModule, node: Node, obs: nn.Module) -> tuple[object, object, tuple, QParams]:
    """The quantize and dequantize ops for an observer, their qparam arguments, the record."""
    ops = quantized_decomposed()
    scale, zero_point = obs.calculate_qparams()
    common = (obs.quant_min, obs.quant_max, obs.dtype)
    if obs.qscheme in _PER_CHANNEL:
        with gm.graph.inserting_before(node):
            s = gm.graph.get_attr(_new_attr(gm, "_scale_", scale))
            z = gm.graph.get_attr(_new_attr(gm, "_zero_point_", zero_point))
        record = QParams(tuple(scale.tolist()), tuple(int(v) for v in zero_point.tolist()))
        return (
            ops.quantize_per_channel.default,
            ops.dequantize_per_channel.default,
            (s, z, obs.ch_axis, *common),
            record,
        )
    scale, zero_point = float(scale), int(zero_point)
    return (
        ops.quantize_per_tensor.default,
        ops.dequantize_per_tensor.default,
        (scale, zero_point, *common),
        QParams(scale, zero_point),
    )


def _eager(gm: GraphModule, args: tuple) -> tuple:
    return tuple(get_attr_value(gm, a) if isinstance(a, Node) else a for a in args)


def _replace_static(gm: GraphModule, node: Node, obs: nn.Module, fold: bool) -> QParams:
    source = node.args[0]
    q_op, dq_op, qargs, record = _qdq_ops(gm, node, obs)
    with gm.graph.inserting_before(node):
        if fold and source.op == "get_attr":
            value = q_op(get_attr_value(gm, source), *_eager(gm, qargs))
            quantized = gm.graph.get_attr(_new_attr(gm, "_frozen_param", value))
        else:
            quantized = gm.graph.call_function(q_op, (source, *qargs))
        dequantized = gm.graph.call_function(dq_op, (quantized, *qargs))
    node.replace_all_uses_with(dequantized)
    return record


def _replace_dynamic(gm: GraphModule, node: Node, obs: nn.Module) -> None:
    ops = quantized_decomposed()
    source, eps = node.args[0], getattr(obs, "eps", torch.finfo(torch.float32).eps)
    qmin, qmax, dtype = obs.quant_min, obs.quant_max, obs.dtype
    with gm.graph.inserting_before(node):
        chosen = gm.graph.call_function(ops.choose_qparams.tensor, (source, qmin, qmax, eps, dtype))
        scale = gm.graph.call_function(operator.getitem, (chosen, 0))
        zero_point = gm.graph.call_function(operator.getitem, (chosen, 1))
        args = (scale, zero_point, qmin, qmax, dtype)
        quantized = gm.graph.call_function(ops.quantize_per_tensor.tensor, (source, *args))
        dequantized = gm.graph.call_function(ops.dequantize_per_tensor.tensor, (quantized, *args))
    node.replace_all_uses_with(dequantized)


def convert_pt2e(
    model: GraphModule, *, fold_quantize: bool = True, use_reference_representation: bool = False
) -> GraphModule:
    """Replace the observers of a calibrated model by quantize/dequantize ops; return the copy.

    Args:
        model: the output of :func:`qviz.prepare_pt2e`, calibrated.
        fold_quantize: store quantized constants (weights) as integer tensors.
        use_reference_representation: rewrite quantized linear/conv into readable integer
            arithmetic (int16 widening, int32 accumulation, requantize), for teaching; it
            matches the quantize/dequantize form within one quantization step
            (:mod:`qviz.engine.reference_representation`). Needs ``fold_quantize``.

    Raises:
        CalibrationError: observers that saw no data, each listed with the tensors it observes.
    """
    if not isinstance(model, GraphModule):
        raise ConfigError(f"convert_pt2e needs a prepared graph module, got {type(model).__name__}")
    gm = copy.deepcopy(model)  # GraphModule's deepcopy keeps the graph and state, not .plan
    plan = getattr(model, "plan", None)
    nodes = [
        n
        for n in gm.graph.nodes
        if n.op == "call_module" and is_observer(gm.get_submodule(n.target))
    ]
    if not nodes:
        converted = model_stage(model) is Stage.CONVERTED
        raise ConfigError(
            "convert_pt2e got a model that is already converted (quantize/dequantize ops, no "
            "observers): use it as it is"
            if converted
            else "convert_pt2e got a model with no observers: it was never prepared; run "
            "qviz.prepare_pt2e(exported, quantizer), calibrate the result, then convert that"
        )
    _check_calibrated(gm, nodes, plan)
    qparams: dict[str, QParams] = {}
    for node in nodes:
        obs = gm.get_submodule(node.target)
        if getattr(obs, "is_dynamic", False):
            _replace_dynamic(gm, node, obs)
        elif obs.dtype in _FLOAT_DTYPES:
            node.replace_all_uses_with(node.args[0])
        else:
            qparams[str(node.target)] = _replace_static(gm, node, obs, fold_quantize)
        gm.graph.erase_node(node)
    _drop_dead_constants(gm)
    for name in {str(n.target) for n in nodes}:
        delattr(gm, name)
    gm.graph.lint()
    gm.recompile()
    if plan is not None:
        by_group = {g.group: qparams[g.observer] for g in plan.groups if g.observer in qparams}
        gm.plan = plan.with_qparams(by_group)
    if use_reference_representation:
        if not fold_quantize:
            raise ConfigError(
                "use_reference_representation=True rewrites integer weights: "
                "keep fold_quantize=True"
            )
        from qviz.engine.reference_representation import to_reference_representation

        gm = to_reference_representation(gm)
    return gm


def _drop_dead_constants(gm: GraphModule) -> None:
    """Erase unread get_attr nodes, then every parameter or buffer no get_attr reads any more
    (float weights replaced by integer ones, folded BatchNorm statistics), so they are not saved."""
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and not node.users:
            gm.graph.erase_node(node)
    read = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    called = {str(n.target) for n in gm.graph.nodes if n.op == "call_module"}
    named = [
        *gm.named_parameters(remove_duplicate=False),
        *gm.named_buffers(remove_duplicate=False),
    ]
    for name, _ in named:
        owner, _, attr = name.rpartition(".")
        inside_called = any(name.startswith(f"{c}.") for c in called)
        if name not in read and not inside_called and hasattr(gm.get_submodule(owner), attr):
            delattr(gm.get_submodule(owner), attr)
