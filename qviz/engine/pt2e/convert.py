"""convert_pt2e: observers become quantize/dequantize ops; constant weights become int8 tensors.

On a copy of the prepared model, in the reference's order:

1. each observer call becomes the q/dq ops of its qparams
   (:mod:`qviz.engine.pt2e.passes.observer_to_qdq`:
   per tensor, per channel, dynamic, float16, or the observer's own ``convert``);
2. each annotated consumer of a shared dequantize gets its own
   (:mod:`qviz.engine.pt2e.passes.duplicate_dq`), the layout backend partitioners match;
3. the quantized operators' ``quantization_tag`` and ``stack_trace`` are copied onto their q/dq
   nodes (:mod:`qviz.engine.pt2e.passes.port_metadata`);
4. with ``fold_quantize``, every quantize op on a constant (a weight, also through ``t`` or
   ``permute``) is computed once and stored as an integer tensor
   (:mod:`qviz.engine.pt2e.passes.constant_fold`), so the model keeps only ``dequantize`` for it.

The bodies of loops (``scan``, ``while_loop``) are converted first, the same way.

The prepared model is left as it is.

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
import warnings

import torch
from torch import nn
from torch.fx import GraphModule, Node

from qviz.engine.graph.control_flow import loop_bodies, replace_submodule
from qviz.engine.graph.fingerprint import CALIBRATED_KEY, tensors_digest
from qviz.engine.graph.get_attr import drop_unread_constants, get_attr_value
from qviz.engine.graph.stage import Stage, is_observer, model_stage
from qviz.engine.graph.train_eval import disallow_train_eval
from qviz.engine.pt2e.annotations import rebind_annotations
from qviz.engine.pt2e.passes.constant_fold import fold_quantized_constants
from qviz.engine.pt2e.passes.duplicate_dq import duplicate_dequantize
from qviz.engine.pt2e.passes.observer_to_qdq import FLOAT_DTYPES, OBSERVER_KEY, replace_observer
from qviz.engine.pt2e.passes.port_metadata import port_metadata
from qviz.engine.pt2e.passes.qat_conv_bn import QAT_BN_OPS, fold_qat_conv_bn
from qviz.engine.pt2e.plan import QParams, QuantPlan, plan_of, set_plan
from qviz.engine.pt2e.qat_undo import ForwardUndo
from qviz.errors import CalibrationError, ConfigError


def saw_no_data(obs: nn.Module) -> bool:
    """Whether observer (or fake-quantize module) ``obs`` has seen no data yet.

    Example:
        >>> from torch.ao.quantization.observer import MinMaxObserver
        >>> obs = MinMaxObserver()
        >>> before = saw_no_data(obs)
        >>> _ = obs(torch.ones(2))
        >>> before, saw_no_data(obs)
        (True, False)
    """
    inner = getattr(obs, "activation_post_process", None)
    if isinstance(inner, nn.Module) and not callable(getattr(obs, "convert", None)):
        return saw_no_data(inner)  # a fake-quantize module: its observer (the fused op
        # updates the observer's min_val / max_val without calling it)
    if callable(getattr(obs, "convert", None)) and hasattr(obs, "block_size"):
        return obs.block_size is None  # affine observers learn their block size from data
    if getattr(obs, "is_dynamic", False) or getattr(obs, "dtype", None) in FLOAT_DTYPES:
        return False
    if type(obs).__name__ in ("FixedQParamsObserver", "DerivedQParamsObserver"):
        return False
    if hasattr(obs, "num_batches") and int(obs.num_batches):
        return False
    min_val = getattr(obs, "min_val", None)  # +inf (per channel: empty) until data is seen
    if not isinstance(min_val, torch.Tensor):
        return int(getattr(obs, "num_batches", 1)) == 0
    return min_val.numel() == 0 or bool(torch.isinf(min_val).all())


def _observes(plan: QuantPlan | None, name: str) -> str:
    """The tensors the observer ``name`` observes, as the plan records them."""
    members = [
        ", ".join(str(m) for m in g.members)
        for g in (plan.groups if plan else ())
        if name in g.calls
    ]
    return members[0] if members else "a tensor"


def _non_finite(value: object) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and not bool(torch.isfinite(value).all())
    )


def _distinct_observers(gm: GraphModule, nodes: list[Node]) -> dict[str, nn.Module]:
    """Each observer module once, by the name of its first call in graph order (a shared
    observer is called under one name per call, as torchao names them)."""
    seen: dict[int, str] = {}
    for node in nodes:
        seen.setdefault(id(gm.get_submodule(str(node.target))), str(node.target))
    return {name: gm.get_submodule(name) for name in seen.values()}


def _check_ranges(gm: GraphModule, nodes: list[Node], plan: QuantPlan | None) -> None:
    """Refuse observers whose range holds NaN or Inf: their qparams would be NaN (a NaN bias,
    NaN outputs after convert)."""
    bad = []
    for name, obs in _distinct_observers(gm, nodes).items():
        if saw_no_data(obs):  # (+inf, -inf): allow_uncalibrated's defaults, warned about
            continue
        inner = getattr(obs, "activation_post_process", obs)
        ranges = [getattr(m, k, None) for m in (obs, inner) for k in ("min_val", "max_val")]
        if any(_non_finite(r) for r in ranges):
            bad.append(f"  {name} (observes {_observes(plan, name)})")
    if bad:
        raise CalibrationError(
            f"{len(bad)} observer(s) hold a NaN or Inf range, so their scale would be NaN:\n"
            + "\n".join(bad)
            + "\nreload the model from before the batch that produced them (qviz.calibrate and "
            "the fake-quantize modules now refuse such batches), or reset() these observers "
            "and calibrate again"
        )


def _check_batch_norm(gm: GraphModule) -> None:
    """Refuse NaN or Inf in a training BatchNorm's weight, bias or statistics before folding
    them into the conv (where they would become a NaN bias)."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in QAT_BN_OPS:
            continue
        for arg in node.args:
            if isinstance(arg, Node) and arg.op == "get_attr":
                if _non_finite(get_attr_value(gm, arg)):
                    raise CalibrationError(
                        f"{node.format_node()}: its {arg.target} holds NaN or Inf values, which "
                        f"folding into the conv would write into its bias; reload the model "
                        f"from before the batch that produced them (a NaN/Inf batch in QAT "
                        f"training), or reset these statistics and train on"
                    )


def _check_calibrated(
    gm: GraphModule, nodes: list[Node], plan: QuantPlan | None, allow_uncalibrated: bool
) -> None:
    observers = _distinct_observers(gm, nodes)  # graph order, each once
    unseen = [name for name, obs in observers.items() if saw_no_data(obs)]
    if not unseen:
        return
    lines = [f"  {name} (observes {_observes(plan, name)})" for name in unseen]
    if allow_uncalibrated:
        warnings.warn(
            f"convert_pt2e(allow_uncalibrated=True): {len(unseen)} observer(s) saw no data and "
            f"get their default qparams (scale 1.0, zero_point 0 for min/max observers):\n"
            + "\n".join(lines),
            stacklevel=3,
        )
        return
    raise CalibrationError(
        f"{len(unseen)} observer(s) saw no data, so their qparams would be meaningless:\n"
        + "\n".join(lines)
        + "\nrun calibration batches through the prepared model first (qviz.calibrate), and "
        "check that the inputs reach these tensors; to convert anyway with the observers' "
        "default qparams (a structural test, a graph to lower), pass allow_uncalibrated=True"
    )


def convert_pt2e(
    model: GraphModule,
    *,
    fold_quantize: bool = True,
    use_reference_representation: bool = False,
    allow_uncalibrated: bool = False,
    inplace: bool = False,
) -> GraphModule:
    """Replace the observers of a calibrated model by quantize/dequantize ops; return the copy.

    Args:
        model: the output of :func:`qviz.prepare_pt2e`, calibrated.
        fold_quantize: store quantized constants (weights) as integer tensors.
        use_reference_representation: rewrite the quantized ops (linear, conv, add, add +
            ReLU, max pooling, dynamic linear, the q/dq ops left) into readable integer
            arithmetic (int16 widening, int32 accumulation, requantize), for teaching; it
            matches the quantize/dequantize form within one quantization step
            (:mod:`qviz.engine.pt2e.passes.reference_representation`). Needs ``fold_quantize``.
        allow_uncalibrated: convert observers that saw no data with their default qparams
            (what the reference does silently), warning with their list, instead of refusing:
            for graphs whose numbers do not matter (a structural test, a lowering dry run).
        inplace: convert ``model`` itself and return it (as ``torch.ao.quantization.convert
            (inplace=True)``): no second copy of weights and observers, and the prepared model
            is gone. For a prepared model nobody needs again (one built to be converted).

    Raises:
        CalibrationError: observers that saw no data, each listed with the tensors it observes
            (unless ``allow_uncalibrated``); observers whose range, or training BatchNorms
            whose weight, bias or statistics hold NaN or Inf (named), instead of NaN qparams
            and NaN folded biases.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> x = torch.randn(8, 4)
        >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 2)).eval(), (x,))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), x, progress=False)
        >>> quantized = qviz.convert_pt2e(prepared)
        >>> sorted({n.target.__name__ for n in quantized.graph.nodes if n.op == "call_function"})
        ['dequantize_per_tensor.default', 'linear.default', 'quantize_per_tensor.default']
        >>> [(name, t.dtype) for name, t in quantized.named_buffers()]   # the weight, as int8
        [('_frozen_param0', torch.int8)]
        >>> qviz.convert_pt2e(prepared, inplace=True) is prepared   # no copy: prepared is gone
        True
    """
    _check_arguments(model, fold_quantize, use_reference_representation)
    gm, plan = _working_model(model, inplace)
    bodies = _convert_loop_bodies(model, gm, fold_quantize, allow_uncalibrated)
    nodes = _observer_calls(gm)
    if not nodes:
        return disallow_train_eval(_without_observers(model, gm, bodies))
    _check_calibrated(gm, nodes, plan, allow_uncalibrated)
    _check_ranges(gm, nodes, plan)
    qparams = _replace_observers(gm, nodes, fold_quantize)
    if plan is not None:
        set_plan(gm, _converted_plan(gm, plan, qparams))
    if use_reference_representation:
        gm = _reference_representation(gm)
    return disallow_train_eval(gm)


def _observer_calls(gm: GraphModule) -> list[Node]:
    """The nodes of ``gm`` that call an observer (or fake-quantize) module."""
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_module" and is_observer(gm.get_submodule(n.target))
    ]


def _reference_representation(gm: GraphModule) -> GraphModule:
    """``gm``'s quantized ops as readable integer arithmetic (imported here: for teaching)."""
    from qviz.engine.pt2e.passes.reference_representation import to_reference_representation

    return to_reference_representation(gm)


def _working_model(model: GraphModule, inplace: bool) -> tuple[GraphModule, QuantPlan | None]:
    """The model convert rewrites (``model`` itself, or a copy) and its plan, after the steps
    before the observers: the statistics' digest recorded, QAT's undo detached, the BatchNorms
    checked and QAT's conv + BatchNorm pairs folded (the plan renamed to match)."""
    digest = tensors_digest(model)  # the statistics it was converted with
    # GraphModule's deepcopy keeps the graph, the state and meta: the copy has the plan
    gm = model if inplace else rebind_annotations(copy.deepcopy(model))
    gm.meta[CALIBRATED_KEY] = digest
    ForwardUndo.detach(gm)  # QAT's restore-on-error: a converted model changes no state
    _check_batch_norm(gm)
    renamed = fold_qat_conv_bn(gm)  # QAT's trainable conv + BatchNorm pairs (none after PTQ)
    plan = plan_of(gm)
    if renamed and plan is not None:
        plan = plan.renamed(renamed)
        set_plan(gm, plan)
    return gm, plan


def _converted_plan(gm: GraphModule, plan: QuantPlan, qparams: dict[str, QParams]) -> QuantPlan:
    """``plan`` with each group's qparams and the converted nodes that execute it."""
    made = _made_by_observer(gm)
    by_group = {g.group: qparams[g.observer] for g in plan.groups if g.observer in qparams}
    nodes_by_group = {
        g.group: tuple(n for name in g.calls for n in made.get(name, ())) for g in plan.groups
    }
    return plan.with_qparams(by_group, nodes_by_group)


def _check_arguments(model: object, fold_quantize: bool, reference: bool) -> None:
    """convert_pt2e's argument checks, before any work."""
    if not isinstance(model, GraphModule):
        raise ConfigError(f"convert_pt2e needs a prepared graph module, got {type(model).__name__}")
    if reference and not fold_quantize:
        raise ConfigError(
            "use_reference_representation=True rewrites integer weights: keep fold_quantize=True"
        )


def _replace_observers(
    gm: GraphModule, nodes: list[Node], fold_quantize: bool
) -> dict[str, QParams]:
    """Each observer call becomes its q/dq ops (then the layout passes run); the qparams used,
    by observer name."""
    qparams: dict[str, QParams] = {}
    for node in nodes:
        record = replace_observer(gm, node, gm.get_submodule(node.target))
        if record is not None:
            qparams[str(node.target)] = record
    duplicate_dequantize(gm)
    port_metadata(gm)
    if fold_quantize:
        fold_quantized_constants(gm)
    for name in {str(n.target) for n in nodes}:  # first: their own buffers are not touched
        delattr(gm, name)  # (an observer module may live on, e.g. in an ObserverReuse)
    drop_unread_constants(gm)
    gm.graph.lint()
    gm.recompile()
    return qparams


def _without_observers(model: GraphModule, gm: GraphModule, bodies: int) -> GraphModule:
    """The converted copy of a model whose graph has no observers, or the error saying why."""
    plan = plan_of(model)
    if bodies:  # all the quantized operators are inside loops
        return gm
    if plan is not None and not plan.groups:
        warnings.warn(
            "convert_pt2e: the quantizer annotated nothing in this model, so it stays as it "
            f"was; model.plan.float_nodes says why for each operator ({len(plan.float_nodes)})",
            stacklevel=3,
        )
        return gm
    if model_stage(model) is Stage.CONVERTED:
        raise ConfigError(
            "convert_pt2e got a model that is already converted (quantize/dequantize ops, no "
            "observers): use it as it is"
        )
    raise ConfigError(
        "convert_pt2e got a model with no observers: it was never prepared; run "
        "qviz.prepare_pt2e(exported, quantizer), calibrate the result, then convert that"
    )


def _convert_loop_bodies(
    model: GraphModule, gm: GraphModule, fold_quantize: bool, allow_uncalibrated: bool
) -> int:
    """Convert the prepared body of each loop of ``gm`` (a copy of ``model``) in place; how many
    there were."""
    converted = 0
    for _, path in list(loop_bodies(gm)):
        body = gm.get_submodule(path)
        if isinstance(body, GraphModule) and model_stage(body) is Stage.PREPARED:
            body = convert_pt2e(
                body, fold_quantize=fold_quantize, allow_uncalibrated=allow_uncalibrated
            )
            replace_submodule(gm, path, body)
            converted += 1
    return converted


def _made_by_observer(gm: GraphModule) -> dict[str, tuple[str, ...]]:
    """Observer name -> the converted nodes made from it; the marks are removed from the meta
    (read once: the plan keeps the answer, and node metadata stays the reference's)."""
    by_observer: dict[str, list[str]] = {}
    for node in gm.graph.nodes:
        if OBSERVER_KEY in node.meta:
            by_observer.setdefault(node.meta.pop(OBSERVER_KEY), []).append(node.name)
    return {name: tuple(made) for name, made in by_observer.items()}
