"""prepare_pt2e: fold BatchNorm, annotate, resolve sharing, insert one observer per group.

Everything happens on a copy: the caller's graph module is never changed. The steps:

1. fold inference BatchNorm into the preceding conv (:mod:`qviz.engine.pt2e.passes.bn_fold`);
2. the quantizer annotates and validates; annotations are read and checked
   (:mod:`qviz.engine.pt2e.annotations`);
3. sharing groups are resolved (:mod:`qviz.engine.pt2e.sharing`, pure);
4. one observer module is created per group, from the group's concrete spec;
5. observer calls are inserted: after a producer whose output is observed (all its users then
   read the observed tensor), or on the edge into a consumer; a tensor is observed once per
   group however many edges of that group read it. A buffer an in-place op writes into (model
   state, :mod:`qviz.engine.graph.mutation`) is not observed on that edge; the plan says so;
6. the body of each loop (``scan``, ``while_loop``) is prepared the same way, with its own
   observers and ``.plan`` (:mod:`qviz.engine.graph.control_flow`).

The result carries ``.plan``, the :class:`~qviz.engine.pt2e.plan.QuantPlan` of these decisions.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> len(prepared.plan.groups)
    3
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from torch import nn
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from qviz.engine.graph.control_flow import loop_bodies, replace_submodule
from qviz.engine.graph.debug_handles import assign_handles
from qviz.engine.graph.fingerprint import origin_of, record_origin
from qviz.engine.graph.get_attr import drop_unread_constants
from qviz.engine.graph.mutation import is_written_buffer_edge
from qviz.engine.graph.stage import Stage, model_stage
from qviz.engine.graph.train_eval import disallow_train_eval
from qviz.engine.pt2e.annotations import collect_specs, out_arguments
from qviz.engine.pt2e.legacy_state import record_legacy_names
from qviz.engine.pt2e.passes.bn_fold import fold_batch_norm
from qviz.engine.pt2e.plan import TensorRef, build_plan, plan_of, require_plan, set_plan
from qviz.engine.pt2e.sharing import Sharing, describe, resolve_sharing
from qviz.engine.specs import (
    Q_ANNOTATION_KEY,
    DerivedQuantizationSpec,
    EdgeOrNode,
    FixedQParamsQuantizationSpec,
    QuantizationSpec,
    QuantizationSpecBase,
)
from qviz.errors import AnnotationError, ConfigError

_WRITTEN_BUFFER = (
    "buffer written in place: the model's state is not observed; the values written into it "
    "and the result are, with this group's qparams"
)


def observer_from_spec(
    spec: QuantizationSpecBase, made: dict[EdgeOrNode, nn.Module], is_qat: bool = False
) -> nn.Module:
    """An observer (QAT: fixed qparams fake-quantize) for a concrete spec, built as the
    reference builds it (same kwargs); ``made``: the observers already built, by edge or node
    (a DerivedQuantizationSpec reads the ones it derives from).

    Example:
        >>> import torch
        >>> from qviz.engine.observers import MinMaxObserver
        >>> spec = QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver,
        ...     quant_min=-128, quant_max=127,
        ...                         qscheme=torch.per_tensor_affine)
        >>> type(observer_from_spec(spec, {})).__name__
        'MinMaxObserver'
    """
    if isinstance(spec, FixedQParamsQuantizationSpec):
        from qviz.engine import observers

        observer = observers.FixedQParamsObserver.with_args(**dataclasses.asdict(spec))
        if is_qat:
            from qviz.engine.observers.fake_quantize import FixedQParamsFakeQuantize

            return FixedQParamsFakeQuantize.with_args(observer=observer)()
        return observer()
    if isinstance(spec, DerivedQuantizationSpec):
        missing = [describe(k) for k in spec.derived_from if k not in made]
        if missing:
            raise AnnotationError(
                f"DerivedQuantizationSpec derives from {missing}, which have no observer; annotate "
                f"them with a QuantizationSpec"
            )
        from qviz.engine import observers

        return observers.DerivedQParamsObserver(
            obs_or_fqs=[made[k] for k in spec.derived_from],
            derive_qparams_fn=spec.derive_qparams_fn,
            dtype=spec.dtype,
            quant_min=spec.quant_min,
            quant_max=spec.quant_max,
            qscheme=spec.qscheme,
            ch_axis=spec.ch_axis,
        )
    if not isinstance(spec, QuantizationSpec):
        raise ConfigError(f"cannot build an observer for {type(spec).__name__}")
    ctor = spec.observer_or_fake_quant_ctr
    kwargs = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    kwargs.pop("observer_or_fake_quant_ctr")
    cls = getattr(getattr(ctor, "p", None), "func", ctor)
    if "PerChannel" not in getattr(cls, "__name__", ""):
        kwargs.pop("ch_axis")
    if hasattr(ctor, "with_args"):
        return ctor.with_args(**kwargs)()
    return ctor(**kwargs)


def _make_observers(sharing: Sharing, is_qat: bool) -> dict[int, nn.Module]:
    """One observer per group; derived groups after the groups they derive from."""
    made: dict[EdgeOrNode, nn.Module] = {}
    by_group: dict[int, nn.Module] = {}
    order = sorted(
        sharing.groups, key=lambda g: isinstance(sharing.spec[g], DerivedQuantizationSpec)
    )
    for g in order:
        by_group[g] = observer_from_spec(sharing.spec[g], made, is_qat)
        made.update(dict.fromkeys(sharing.groups[g], by_group[g]))
    return dict(sorted(by_group.items()))


class _Calls:
    """Observer calls named as torchao names them: each inserted call gets the next free
    ``activation_post_process_<n>``, in the order the calls are inserted (graph order; a node's
    inputs in argument order, then its output), and a module called at several places (a
    shared group) is registered under each of its calls' names. So a prepared model's
    state_dict has the keys torchao's has, and checkpoints load either way."""

    def __init__(self, gm: GraphModule) -> None:
        self.gm = gm
        self.names: dict[int, list[str]] = {}  # id(module) -> its names, in insertion order
        self.made: dict[Node, Node] = {}  # inserted call -> the node it observes

    def calls(self, node: object, obs: nn.Module) -> bool:
        """Whether ``node`` is a call of the module ``obs``."""
        return (
            isinstance(node, Node)
            and node.op == "call_module"
            and self.gm.get_submodule(str(node.target)) is obs
        )

    def register(self, obs: nn.Module) -> str:
        """Register ``obs`` under the next free name; the name."""
        i = 0
        while hasattr(self.gm, f"activation_post_process_{i}"):
            i += 1
        name = f"activation_post_process_{i}"
        self.gm.add_submodule(name, obs)
        self.names.setdefault(id(obs), []).append(name)
        return name

    def insert(self, after: Node, obs: nn.Module) -> Node:
        """A new call of ``obs`` reading ``after``, right after it."""
        name = self.register(obs)
        with self.gm.graph.inserting_after(after):
            call = self.gm.graph.call_module(name, (after,))
        self.made[call] = after
        return call

    def original(self, node: Node) -> Node:
        """The node an argument really is, past inserted observer calls."""
        while node in self.made:
            node = self.made[node]
        return node


def _observe_edge(calls: _Calls, consumer: Node, current: Node, obs: nn.Module) -> None:
    if calls.calls(current, obs):
        return  # the producer's output observer is this group's: already observed
    existing = next((u for u in current.users if calls.calls(u, obs)), None)
    if existing is None:
        existing = calls.insert(current, obs)
    out = out_arguments(consumer)  # ``out=`` is where the result goes: it stays the tensor
    consumer.args = map_arg(consumer.args, lambda n: existing if n is current else n)
    consumer.kwargs = {
        k: v if k in out else map_arg(v, lambda n: existing if n is current else n)
        for k, v in consumer.kwargs.items()
    }


def _producers_in_order(calls: _Calls, node: Node, producers: list[Node]) -> list[Node]:
    """``producers`` in the order ``node``'s arguments (then keyword arguments) read them."""
    order: list[Node] = []

    def visit(arg: Node) -> Node:
        original = calls.original(arg)
        if original in producers and original not in order:
            order.append(original)
        return arg

    map_arg((node.args, node.kwargs), visit)
    return order + [p for p in producers if p not in order]


def _insert_observers(gm: GraphModule, key_to_obs: dict[EdgeOrNode, nn.Module]) -> _Calls:
    calls = _Calls(gm)
    output_observer: dict[Node, Node] = {}
    for node in list(gm.graph.nodes):
        annotation = node.meta.get(Q_ANNOTATION_KEY)
        if annotation is None:
            continue
        producers = [p for p in annotation.input_qspec_map if (p, node) in key_to_obs]
        for producer in _producers_in_order(calls, node, producers):
            current = output_observer.get(producer, producer)
            _observe_edge(calls, node, current, key_to_obs[(producer, node)])
        if node in key_to_obs:
            obs = calls.insert(node, key_to_obs[node])
            node.replace_all_uses_with(obs, delete_user_cb=lambda user, obs=obs: user is not obs)
            output_observer[node] = obs
    gm.graph.lint()
    gm.recompile()
    return calls


def _observers(sharing: Sharing, quantizer: Any, gm: GraphModule, is_qat: bool) -> dict:
    """Create the observers and let the quantizer adjust them: edge or node -> its module."""
    by_group = _make_observers(sharing, is_qat)
    devices = {t.device for t in (*gm.parameters(), *gm.buffers())}
    if len(devices) == 1:  # on the model's device, as torchao puts them (a fused fake
        device = devices.pop()  # quantizer's state must sit beside its input)
        by_group = {g: obs.to(device) for g, obs in by_group.items()}
    key_to_obs = {k: by_group[m.group] for k, m in sharing.members.items()}
    callback = getattr(quantizer, "prepare_obs_or_fq_callback", None)
    if callback is not None:
        callback(gm, key_to_obs)
    return key_to_obs


def _group_names(
    calls: _Calls, sharing: Sharing, key_to_obs: dict[EdgeOrNode, nn.Module]
) -> dict[int, tuple[str, ...]]:
    """Each group's module names (the first call's, then the others'); a group that no call
    reads (a written buffer's) is registered under a name of its own, for the plan."""
    names: dict[int, tuple[str, ...]] = {}
    for g in sharing.groups:
        obs = key_to_obs[sharing.owner[g]]
        if id(obs) not in calls.names:
            calls.register(obs)
        names[g] = tuple(calls.names[id(obs)])
        obs.qviz_label = f"{names[g][0]} (observing {TensorRef.of(sharing.owner[g])})"
    return names


def prepare_pt2e(model: GraphModule, quantizer: Any) -> GraphModule:
    """Insert observers as ``quantizer`` annotates ``model``; return the prepared copy.

    Args:
        model: a graph module from :func:`qviz.export` (``torch.export.export(...).module()``).
        quantizer: a qviz Quantizer, or any object with ``annotate`` and ``validate`` that
            annotates with the PT2E annotation API (torchao's quantizers included).

    Returns:
        A prepared copy of ``model`` with ``.plan``; run calibration data through it
        (:func:`qviz.calibrate`), then :func:`qviz.convert_pt2e`.

    Raises:
        AnnotationError: annotations that cannot be executed (unresolvable sharing, an input
            spec keyed by a node that is not an input, ...), naming the node and the chain.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()
        >>> gm = qviz.export(model, (torch.randn(8, 4),))
        >>> quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> prepared = qviz.prepare_pt2e(gm, quantizer)
        >>> [g.observer for g in prepared.plan.groups]   # input, weight, output
        ['activation_post_process_0', 'activation_post_process_1', 'activation_post_process_2']
    """
    check_inputs(model, quantizer, "prepare_pt2e")
    gm, unfolded = _annotated_copy(model, quantizer)
    observe_annotated(gm, quantizer, unfolded)
    paths = [path for _, path in loop_bodies(gm)]
    for path in paths:  # each loop body: its own observers and plan
        replace_submodule(gm, path, prepare_pt2e(gm.get_submodule(path), quantizer))
    plan = dataclasses.replace(require_plan(gm), loop_bodies=tuple(paths))
    set_plan(gm, plan)
    return disallow_train_eval(gm)


def observe_annotated(
    gm: GraphModule, quantizer: Any, unfolded: dict[str, str], *, is_qat: bool = False
) -> GraphModule:
    """Prepare's steps 3-5 on an annotated graph module, in place: sharing groups, one observer
    (QAT: fake-quantize module, as the specs build them) per group, their calls, ``gm.plan``.

    Args:
        gm: the annotated copy; ``unfolded``: BatchNorm name -> why it was not folded.
        quantizer: its ``prepare_obs_or_fq_callback``, if any, may adjust the observers.
        is_qat: fixed-qparams specs become FixedQParamsFakeQuantize modules.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> gm = qviz.annotate_pt2e(qviz.export(torch.nn.Linear(4, 2).eval(), (torch.ones(1, 4),)), q)
        >>> len(observe_annotated(gm, q, {}).plan.groups)
        3
    """  # noqa: E501
    specs, implicit = collect_specs(gm)
    sharing = resolve_sharing(specs, implicit=implicit)
    key_to_obs = _observers(sharing, quantizer, gm, is_qat)
    unobserved = {
        key: _WRITTEN_BUFFER
        for key in key_to_obs
        if isinstance(key, tuple) and is_written_buffer_edge(gm, *key)
    }
    calls = _insert_observers(gm, {k: v for k, v in key_to_obs.items() if k not in unobserved})
    group_names = _group_names(calls, sharing, key_to_obs)
    before = set(gm.state_dict())
    drop_unread_constants(gm)  # a folded BatchNorm's state: the state_dict is torchao's
    plan = build_plan(gm, sharing, specs, group_names, unfolded, unobserved)
    record_legacy_names(gm, plan, sorted(before - set(gm.state_dict())))
    return set_plan(gm, plan)


def check_inputs(model: Any, quantizer: Any, where: str) -> None:
    """ConfigError unless ``model`` is a float graph module and ``quantizer`` can annotate.

    Example:
        >>> import torch
        >>> check_inputs(torch.nn.Linear(1, 1), None, "prepare_pt2e")
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: prepare_pt2e needs the graph module qviz.export returns, got Linear: call qviz.export(model.eval(), example_inputs) first
    """  # noqa: E501
    qat = "qat" in where  # QAT trains the exported BatchNorms
    mode, prepare = ("train", "prepare_qat_pt2e") if qat else ("eval", "prepare_pt2e")
    if not isinstance(model, GraphModule):
        raise ConfigError(
            f"{where} needs the graph module qviz.export returns, got {type(model).__name__}: "
            f"call qviz.export(model.{mode}(), example_inputs) first"
        )
    if model_stage(model) is Stage.PREPARED:
        raise ConfigError(
            f"{where} got a model that is already prepared (it has observers): pass the float "
            f"graph module you gave qviz.{prepare} (what qviz.export returned), not its result; "
            f"to change the quantization of a prepared model, prepare that float graph again with "
            f"the new quantizer"
        )
    if model_stage(model) is Stage.CONVERTED and plan_of(model) is not None:
        # convert_pt2e's own result (a model exported around a converted block has no plan)
        raise ConfigError(
            f"{where} got a model that is already converted (it has quantize/dequantize ops): "
            f"pass the float graph module qviz.export returned; to quantize it another way, "
            f"prepare that float graph again with the new quantizer"
        )
    for method in ("annotate", "validate"):
        if not callable(getattr(quantizer, method, None)):
            raise ConfigError(f"quantizer {type(quantizer).__name__} has no {method}() method")


def _annotated_copy(model: GraphModule, quantizer: Any) -> tuple[GraphModule, dict[str, str]]:
    """Prepare's steps 1-2 on a copy: number, fold BatchNorm, transform, annotate, validate."""
    origin = origin_of(model)  # the float weights the numbers will be read against
    gm = assign_handles(copy.deepcopy(model))  # the same numbers as qviz.export gives
    unfolded = dict(fold_batch_norm(gm))
    transform = getattr(quantizer, "transform_for_annotation", None)
    gm = transform(gm) if transform is not None else gm
    record_origin(gm, origin)
    quantizer.annotate(gm)
    quantizer.validate(gm)
    return gm, unfolded


def annotate_pt2e(model: GraphModule, quantizer: Any) -> GraphModule:
    """What ``quantizer`` asks for, before any observer: an annotated copy of ``model``.

    The first steps of :func:`prepare_pt2e`, on a copy (``model`` is not changed): BatchNorms
    are folded into the convs before them, then ``quantizer`` annotates. The copy carries the
    specs in ``node.meta["quantization_annotation"]``; draw it with ``qviz.viz.graph`` to see
    each edge's spec and the nodes left in float. Prepare the original, not this copy.

    Raises:
        ConfigError: ``model`` is not a graph module or ``quantizer`` cannot annotate.
        AnnotationError: the quantizer's own validation fails.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> annotated = qviz.annotate_pt2e(gm, q)
        >>> linear = next(n for n in annotated.graph.nodes if n.name == "linear")
        >>> str(linear.meta["quantization_annotation"].output_qspec.dtype)
        'torch.int8'
    """
    check_inputs(model, quantizer, "annotate_pt2e")
    return _annotated_copy(model, quantizer)[0]
