"""QuantPlan: the engine's decisions as frozen, tensor-free records that every view reads.

For every observed edge and node output: its sharing group, how it joined the group (own spec,
explicit SharedQuantizationSpec, implicit equal-spec sharing, transitively) and its spec; for every
group: the observer module and the resolved spec (and, after convert, its qparams); for every
quantizable node left in float: why.

Example:
    >>> import torch
    >>> import qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    >>> gm = qviz.export(model, (torch.randn(2, 4),))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> plan = qviz.prepare_pt2e(gm, q).plan
    >>> [(str(t.tensor), t.group, str(t.how)) for t in plan][:2]
    [('input_1 -> linear', 0, 'own spec'), ('_0_weight -> linear', 1, 'own spec')]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from enum import StrEnum
from typing import Any

import torch
from torch.fx import GraphModule, Node

from qviz.engine.graph.qdq_ops import dequantize_ops, quantize_ops
from qviz.engine.pt2e.passes.qat_conv_bn import QAT_PART
from qviz.engine.pt2e.sharing import Sharing
from qviz.engine.qparams import QParams
from qviz.engine.specs import (
    DerivedQuantizationSpec,
    EdgeOrNode,
    FixedQParamsQuantizationSpec,
    QuantizationSpecBase,
    SharedQuantizationSpec,
)
from qviz.errors import ConfigError, closest_names

aten = torch.ops.aten

#: ``node.meta`` key of the nodes QAT adds around a trainable conv + BatchNorm (and of that
#: BatchNorm): part of the quantized conv, folded at convert, so never reported as float.

#: Ops a quantizer is expected to handle; such a node without annotation is reported as float.
QUANTIZABLE_OPS = {
    aten.conv1d.default, aten.conv2d.default, aten.conv3d.default, aten.conv1d.padding,
    aten.conv2d.padding, aten.conv3d.padding, aten.conv_transpose2d.input, aten.linear.default,
    aten.matmul.default, aten.bmm.default, aten.addmm.default, aten.mm.default,
    aten.add.Tensor, aten.add_.Tensor, aten.mul.Tensor, aten.mul_.Tensor, aten.cat.default,
    aten.max_pool2d.default, aten.avg_pool2d.default, aten.adaptive_avg_pool2d.default,
    aten.mean.dim, aten.relu.default, aten.relu_.default, aten.hardtanh.default,
    aten.sigmoid.default, aten.tanh.default, aten.softmax.int, aten._softmax.default,
    aten.batch_norm.default,
}  # fmt: skip


class FloatReason(StrEnum):
    """Why a quantizable node was left in float."""

    UNANNOTATED = "unannotated"
    FILTERED_BY_MODULE_NAME = "filtered by module name"
    FILTERED_BY_MODULE_TYPE = "filtered by module type"
    DTYPE_CONSTRAINT = "dtype constraint violated"
    PATTERN_UNSUPPORTED = "pattern unsupported"
    USER_FALLBACK = "user fallback"
    BATCH_NORM_NOT_FOLDED = "batch norm not folded"


@dataclass(frozen=True)
class TensorRef:
    """An edge ``producer -> consumer``, or a node's output when ``consumer`` is None."""

    producer: str
    consumer: str | None = None

    @classmethod
    def of(cls, key: EdgeOrNode) -> TensorRef:
        return cls(key[0].name, key[1].name) if isinstance(key, tuple) else cls(key.name)

    def __str__(self) -> str:
        return self.producer if self.consumer is None else f"{self.producer} -> {self.consumer}"


@dataclass(frozen=True, kw_only=True)
class SpecSummary:
    """A spec as plain values: kind ("observed", "fixed", "derived", "shared") and its fields."""

    kind: str
    dtype: str | None = None
    quant_min: int | None = None
    quant_max: int | None = None
    qscheme: str | None = None
    ch_axis: int | None = None
    is_dynamic: bool = False
    observer: str | None = None
    scale: float | None = None
    zero_point: int | None = None
    shared_with: TensorRef | None = None
    derived_from: tuple[TensorRef, ...] = ()
    #: The calibration method a HistogramObserver was built with (``method=``), if given.
    method: str | None = None

    @classmethod
    def of(cls, spec: QuantizationSpecBase) -> SpecSummary:
        if isinstance(spec, SharedQuantizationSpec):
            return cls(kind="shared", shared_with=TensorRef.of(spec.edge_or_node))
        common = {
            "dtype": str(spec.dtype).replace("torch.", ""),
            "quant_min": spec.quant_min,
            "quant_max": spec.quant_max,
            "qscheme": str(spec.qscheme).replace("torch.", "") if spec.qscheme else None,
            "is_dynamic": bool(spec.is_dynamic),
        }
        if isinstance(spec, FixedQParamsQuantizationSpec):
            return cls(
                kind="fixed", scale=float(spec.scale), zero_point=int(spec.zero_point), **common
            )
        if isinstance(spec, DerivedQuantizationSpec):
            derived = tuple(TensorRef.of(k) for k in spec.derived_from)
            return cls(kind="derived", ch_axis=spec.ch_axis, derived_from=derived, **common)
        ctor = spec.observer_or_fake_quant_ctr
        name = getattr(getattr(ctor, "p", None), "func", ctor)
        method = getattr(ctor, "kwargs", {}).get("method")
        return cls(
            kind="observed",
            ch_axis=spec.ch_axis,
            observer=getattr(name, "__name__", str(name)),
            method=str(method) if method is not None else None,
            **common,
        )


@dataclass(frozen=True, kw_only=True)
class TensorRecord:
    """One observed tensor: its group, how it joined it (and via which tensor), its own spec."""

    tensor: TensorRef
    group: int
    how: str
    via: TensorRef | None
    spec: SpecSummary
    #: Why this member of the group has no observer call of its own ("" when it has one).
    unobserved: str = ""


@dataclass(frozen=True, kw_only=True)
class GroupRecord:
    """One sharing group: its observer module, the tensor owning it, the resolved spec."""

    group: int
    observer: str
    owner: TensorRef
    spec: SpecSummary
    members: tuple[TensorRef, ...]
    qparams: QParams | None = None
    #: A calibration choice the user made for this group (e.g. ``"entropy"``), or None.
    choice: str | None = None
    #: After convert: the graph's nodes that execute this group (its quantize, each consumer's
    #: dequantize, stored integer weights), so views find them without matching arguments.
    nodes: tuple[str, ...] = ()
    #: The further names the observer module is registered under, one per further call of it
    #: (a tensor shared with another is observed by the same module under its own name, as
    #: torchao numbers its calls: state_dicts load across).
    aliases: tuple[str, ...] = ()

    @property
    def calls(self) -> tuple[str, ...]:
        """Every name the graph calls this group's observer by: ``observer``, then ``aliases``."""
        return (self.observer, *self.aliases)


@dataclass(frozen=True)
class FloatRecord:
    """A quantizable node left in float, and why."""

    node: str
    op: str
    reason: FloatReason
    detail: str = ""


@dataclass(frozen=True)
class TransformRecord:
    """A repair transform applied to the model (``qviz.engine.repair``): what it did, to which
    nodes, with which numbers, and why; the plan lists them in the order they were applied.

    Attributes:
        kind: the transform (``"cross_layer_equalization"``, ``"bias_correction"``,
            ``"smoothquant"``, ``"adaround"``, ...).
        nodes: the graph nodes it changed (e.g. the two convs of an equalized pair).
        detail: one line for people: what changed and why.
        params: its numbers as ``(name, value)`` pairs (scalars or short strings).

    Example:
        >>> r = TransformRecord("cross_layer_equalization", ("conv2d", "conv2d_1"),
        ...     "weight ranges equalized through relu", (("max_scale", 3.2),))
        >>> r.kind, dict(r.params)["max_scale"]
        ('cross_layer_equalization', 3.2)
    """

    kind: str
    nodes: tuple[str, ...]
    detail: str = ""
    params: tuple[tuple[str, Any], ...] = ()


#: ``GraphModule.meta`` key of the transforms applied to a graph before it was prepared; prepare
#: copies them into the plan (``QuantPlan.transforms``).
TRANSFORMS_KEY = "qviz_transforms"


@dataclass(frozen=True)
class QuantPlan:
    """Every decision of prepare (and convert's qparams) as records; iterating gives the tensors."""

    groups: tuple[GroupRecord, ...]
    tensors: tuple[TensorRecord, ...]
    float_nodes: tuple[FloatRecord, ...] = field(default=())
    #: Submodule paths of loop bodies (scan, while_loop) quantized with plans of their own
    #: (``model.get_submodule(path).plan``).
    loop_bodies: tuple[str, ...] = ()
    #: Repair transforms applied to the model, in order (:class:`TransformRecord`).
    transforms: tuple[TransformRecord, ...] = ()

    def __iter__(self) -> Iterator[TensorRecord]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def group(self, group_id: int) -> GroupRecord:
        """The record of group ``group_id``."""
        return self.groups[group_id]

    def group_of(self, producer: str, consumer: str | None = None) -> GroupRecord:
        """The group observing ``producer -> consumer`` (or ``producer``'s output)."""
        return self.groups[self.record(producer, consumer).group]

    def with_qparams(
        self, qparams: dict[int, QParams], nodes: dict[int, tuple[str, ...]] | None = None
    ) -> QuantPlan:
        """A copy whose groups carry the given qparams (and the converted nodes executing them)."""
        nodes = nodes or {}
        groups = tuple(
            replace(g, qparams=qparams.get(g.group, g.qparams), nodes=nodes.get(g.group, g.nodes))
            for g in self.groups
        )
        return replace(self, groups=groups)

    def renamed(self, names: dict[str, str]) -> QuantPlan:
        """A copy whose tensor references use new node names (``old -> new``): after QAT's
        convert folds a BatchNorm, the conv computes what the BatchNorm did.

        Example:
            >>> plan = QuantPlan((), (TensorRecord(tensor=TensorRef("bn", "relu"), group=0,
            ...     how="own spec", via=None,
            ...                                    spec=SpecSummary(kind="observed")),))
            >>> str(plan.renamed({"bn": "conv2d"}).tensors[0].tensor)
            'conv2d -> relu'
        """
        return _renamed(self, names) if names else self

    def observer_names(self) -> set[str]:
        """Every module name an observer call of this plan targets (aliases included).

        Example:
            >>> plan = QuantPlan((GroupRecord(group=0, observer="activation_post_process_0",
            ...     owner=TensorRef("x"),
            ...     spec=SpecSummary(kind="observed"), members=(),
            ...     aliases=("activation_post_process_2",)),), ())
            >>> sorted(plan.observer_names())
            ['activation_post_process_0', 'activation_post_process_2']
        """
        return {name for g in self.groups for name in g.calls}

    def group_of_node(self, name: str) -> GroupRecord | None:
        """The group a converted graph's quantize/dequantize node (or integer weight) executes."""
        return next((g for g in self.groups if name in g.nodes), None)

    def with_choices(self, choices: dict[int, str]) -> QuantPlan:
        """A copy whose groups record the user's calibration choices (group -> method)."""
        groups = tuple(replace(g, choice=choices.get(g.group, g.choice)) for g in self.groups)
        return replace(self, groups=groups)

    def to_records(self, kind: str = "tensors") -> list[dict]:
        """Rows for a DataFrame: ``"tensors"``, ``"groups"`` or ``"float"``."""
        rows = {"tensors": self.tensors, "groups": self.groups, "float": self.float_nodes}
        if kind not in rows:
            raise ValueError(f"kind must be one of {sorted(rows)}, got {kind!r}")
        return [asdict(r) for r in rows[kind]]

    def record(self, producer: str, consumer: str | None = None) -> TensorRecord:
        """The record of ``producer -> consumer`` (or ``producer``'s output); the edge may also
        be given as one string, ``"x -> conv2d"``, as the plan prints it."""
        if consumer is None and "->" in producer:
            producer, _, consumer = (s.strip() for s in producer.partition("->"))
        ref = TensorRef(producer, consumer)
        for rec in self.tensors:
            if rec.tensor == ref:
                return rec
        names = [str(t.tensor) for t in self]
        raise ConfigError(
            f"{ref} is not observed in this plan ({closest_names(str(ref), names)}); pass an "
            f"observed tensor: a node name for its output or 'producer -> consumer' for an edge"
        )

    def __str__(self) -> str:
        lines = [f"QuantPlan: {len(self.groups)} observer groups, {len(self.tensors)} tensors"]
        records = {rec.tensor: rec for rec in self.tensors}
        for g in self.groups:
            chosen = f" [user choice: {g.choice}]" if g.choice else ""
            lines.append(f"  group {g.group} ({g.observer}): {_describe_group(g)}{chosen}")
            for ref in g.members:
                rec = records[ref]
                via = f" via {rec.via}" if rec.via and rec.how != "own spec" else ""
                note = f" (not observed: {rec.unobserved})" if rec.unobserved else ""
                lines.append(f"    {ref}  [{rec.how}{via}]{note}")
        for path in self.loop_bodies:
            lines.append(f"  loop body {path}: its own plan, model.get_submodule({path!r}).plan")
        for t in self.transforms:
            lines.append(f"  transform {t.kind} on {', '.join(t.nodes)}: {t.detail}")
        if self.float_nodes:
            lines.append(f"  left in float: {len(self.float_nodes)}")
            for f in self.float_nodes:
                detail = f" ({f.detail})" if f.detail else ""
                lines.append(f"    {f.node} ({f.op}): {f.reason}{detail}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"QuantPlan(groups={len(self.groups)}, tensors={len(self.tensors)}, "
            f"float_nodes={len(self.float_nodes)})"
        )


def _renamed(value: Any, names: dict[str, str]) -> Any:
    """``value`` (records, tuples of them) with every TensorRef's node names mapped."""
    if isinstance(value, TensorRef):
        consumer = None if value.consumer is None else names.get(value.consumer, value.consumer)
        return TensorRef(names.get(value.producer, value.producer), consumer)
    if isinstance(value, tuple):
        return tuple(_renamed(v, names) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _renamed(getattr(value, f.name), names) for f in fields(value)}
        return replace(value, **changes)
    return value


def _range(s: SpecSummary) -> str:
    if s.quant_min is None and s.quant_max is None:
        return "(the observer's range)"
    full = {"int32": (-(2**31), 2**31 - 1)}.get(s.dtype or "")
    return "full range" if full == (s.quant_min, s.quant_max) else f"[{s.quant_min}, {s.quant_max}]"


def _describe_group(g: GroupRecord) -> str:
    """``observed int8 [-128, 127] per_tensor_affine HistogramObserver scale=0.0123 zp=-4``."""
    s = g.spec
    text = f"{s.kind} {s.dtype} {_range(s)} {s.qscheme or ''}".rstrip()
    if s.kind == "observed" and s.observer:
        text += f" {s.observer}" + (f"(method={s.method})" if s.method else "")
    if s.kind == "derived":
        text += " derived from " + ", ".join(str(r) for r in s.derived_from)
    qparams = g.qparams or (QParams(s.scale, s.zero_point) if s.kind == "fixed" else None)
    if qparams is not None:
        if isinstance(qparams.scale, tuple):
            scales = qparams.scale
            text += f" scale={min(scales):.4g}..{max(scales):.4g} ({len(scales)} channels)"
        else:
            text += f" scale={qparams.scale:.4g} zp={qparams.zero_point}"
    return text


def _quantized_earlier(node: Node) -> bool:
    """``node`` sits between the q/dq ops of an earlier convert (re-entrant quantization): it
    reads a dequantize or feeds a quantize, so it is not left in float."""
    return any(n.target in dequantize_ops() for n in node.all_input_nodes) or any(
        n.target in quantize_ops() for n in node.users
    )


def _float_records(
    gm: GraphModule, observed: set[str], unfolded_bn: dict[str, str]
) -> tuple[FloatRecord, ...]:
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in QUANTIZABLE_OPS:
            continue
        if node.name in observed or node.meta.get(QAT_PART) or node.meta.get("qviz_fused_into"):
            continue  # observed, part of a QAT pattern, or run inside a quantized op's kernel
        op = getattr(node.target, "__name__", str(node.target))
        if node.name in unfolded_bn:
            out.append(
                FloatRecord(
                    node.name, op, FloatReason.BATCH_NORM_NOT_FOLDED, unfolded_bn[node.name]
                )
            )
            continue
        reason = node.meta.get("qviz_float_reason", FloatReason.UNANNOTATED.value)
        if reason == FloatReason.UNANNOTATED.value and _quantized_earlier(node):
            continue
        detail = node.meta.get("qviz_float_detail", "")
        out.append(FloatRecord(node.name, op, FloatReason(reason), detail))
    return tuple(out)


def build_plan(
    gm: GraphModule,
    sharing: Sharing,
    specs: dict[EdgeOrNode, QuantizationSpecBase],
    observer_names: dict[int, tuple[str, ...]],
    unfolded_bn: dict[str, str],
    unobserved: dict[EdgeOrNode, str] | None = None,
) -> QuantPlan:
    """Records of ``sharing`` on ``gm`` (pure: reads the graph, changes nothing).

    ``observer_names`` gives each group's module names (the first, then its aliases);
    ``unobserved`` gives the members that get no observer call, each with the reason.
    """
    unobserved = unobserved or {}
    tensors = tuple(
        TensorRecord(
            tensor=TensorRef.of(key),
            group=m.group,
            how=str(m.how),
            via=TensorRef.of(m.via) if m.via is not None else None,
            spec=SpecSummary.of(specs[key]),
            unobserved=unobserved.get(key, ""),
        )
        for key, m in sharing.members.items()
    )
    groups = tuple(
        GroupRecord(
            group=g,
            observer=observer_names[g][0],
            aliases=tuple(observer_names[g][1:]),
            owner=TensorRef.of(sharing.owner[g]),
            spec=SpecSummary.of(sharing.spec[g]),
            members=tuple(TensorRef.of(k) for k in members),
        )
        for g, members in sharing.groups.items()
    )
    consumers = {k[1].name if isinstance(k, tuple) else k.name for k in sharing.members}
    transforms = tuple(gm.meta.get(TRANSFORMS_KEY, ()))
    return QuantPlan(
        groups, tensors, _float_records(gm, consumers, unfolded_bn), transforms=transforms
    )


def record_transform(gm: GraphModule, record: TransformRecord) -> GraphModule:
    """Append ``record`` to ``gm``'s transforms: its plan's (a prepared or converted model), and
    the graph's own list, which a later prepare copies into its plan; ``gm`` returned.

    Example:
        >>> import torch
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> r = TransformRecord("smoothquant", ("linear",), "alpha 0.5")
        >>> record_transform(gm, r).meta[TRANSFORMS_KEY] == (r,)
        True
    """
    gm.meta[TRANSFORMS_KEY] = (*gm.meta.get(TRANSFORMS_KEY, ()), record)
    plan = plan_of(gm)
    if plan is not None:
        set_plan(gm, replace(plan, transforms=(*plan.transforms, record)))
    return gm


#: ``GraphModule.meta`` key of the model's :class:`QuantPlan`: the one place a plan lives
#: (``GraphModule.__deepcopy__`` copies ``meta``, so every copy keeps its plan).
PLAN_KEY = "qviz_plan"


def plan_of(model: Any) -> QuantPlan | None:
    """The :class:`QuantPlan` recorded in ``model``'s meta, or None when it has none.

    None for a float graph, a model prepared by torchao (no plan), or anything that is not a
    torch.fx GraphModule; callers that need a plan raise their own error naming the fix.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),))
        >>> plan_of(gm) is None
        True
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> prepared = qviz.prepare_pt2e(gm, q)
        >>> plan_of(prepared) is prepared.plan, len(plan_of(prepared).groups)
        (True, 3)
    """
    meta = getattr(model, "meta", None) if isinstance(model, GraphModule) else None
    return meta.get(PLAN_KEY) if isinstance(meta, dict) else None


def require_plan(model: Any, where: str = "this step") -> QuantPlan:
    """:func:`plan_of` for steps that cannot work without a plan: a ConfigError saying so.

    Example:
        >>> import torch
        >>> require_plan(torch.nn.ReLU(), "report")
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: report needs a model from qviz.prepare_pt2e or qviz.convert_pt2e, which records its QuantPlan (model.plan); got ReLU
    """  # noqa: E501
    plan = plan_of(model)
    if plan is None:
        planless = " (a graph module without one: prepared by torchao?)"
        raise ConfigError(
            f"{where} needs a model from qviz.prepare_pt2e or qviz.convert_pt2e, which records "
            f"its QuantPlan (model.plan); got {type(model).__name__}"
            + (planless if isinstance(model, GraphModule) else "")
        )
    return plan


def set_plan(gm: GraphModule, plan: QuantPlan | None) -> GraphModule:
    """Record ``plan`` in ``gm.meta`` (None removes it); ``gm.plan`` reads it from there.

    ``gm`` becomes an instance of a subclass of its own class that offers ``.plan`` as a
    property over the meta, so copies (``copy.deepcopy``, convert's copy) and pickles keep
    both the plan and the property, with nothing re-attached by hand.

    Example:
        >>> import copy, torch
        >>> gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        >>> plan = QuantPlan((), ())
        >>> set_plan(gm, plan).plan is plan, copy.deepcopy(gm).plan == plan
        (True, True)
        >>> set_plan(gm, None) is gm, plan_of(gm)
        (True, None)
    """
    if not isinstance(gm, GraphModule):
        raise ConfigError(f"a QuantPlan is kept by a torch.fx GraphModule, got {type(gm).__name__}")
    if plan is None:
        gm.meta.pop(PLAN_KEY, None)
        return gm
    if not all(hasattr(plan, name) for name in ("groups", "tensors", "float_nodes")):
        raise ConfigError(f"model.plan must be a QuantPlan, got {type(plan).__name__}")
    gm.meta[PLAN_KEY] = plan
    if not isinstance(getattr(type(gm), "plan", None), property):
        _give_plan_property(gm)
    return gm


class _HasPlan:
    """Mixin of the graph modules that carry a plan: ``.plan`` reads and writes ``meta``."""

    meta: dict[str, Any]

    @property
    def plan(self) -> QuantPlan:
        """The model's :class:`QuantPlan` (kept in ``self.meta``)."""
        plan = plan_of(self)
        if plan is None:  # AttributeError: getattr(model, "plan", None) stays None
            raise AttributeError(f"{type(self).__name__} has no QuantPlan (meta[{PLAN_KEY!r}])")
        return plan

    @plan.setter
    def plan(self, plan: QuantPlan | None) -> None:
        set_plan(self, plan)  # type: ignore[arg-type]

    def __reduce__(self) -> tuple[Any, ...]:
        # GraphModule pickles its code and attributes but rebuilds ``meta``: carry the plan
        rebuild, args = super().__reduce__()  # type: ignore[misc]
        return (_rebuilt_with_plan, (rebuild, args, plan_of(self)))


def _rebuilt_with_plan(rebuild: Any, args: tuple[Any, ...], plan: QuantPlan | None) -> Any:
    return set_plan(rebuild(*args), plan)


_PLANNED: dict[type, type] = {}


def _give_plan_property(gm: GraphModule) -> None:
    """Make ``gm``'s class a per-instance subclass of (``_HasPlan``, its base class).

    torch.fx gives each GraphModule its own class (``GraphModuleImpl``, which holds its
    ``forward``) and builds a copy's class from the first base that is not one: that base
    becomes the planned one here, so a copy is planned too.
    """
    base = next(c for c in type(gm).__mro__ if c.__qualname__.split(".")[-1] != "GraphModuleImpl")
    if base not in _PLANNED:
        _PLANNED[base] = type(base.__name__, (_HasPlan, base), {"__module__": base.__module__})
    gm.__class__ = type("GraphModuleImpl", (_PLANNED[base],), {})
    gm.recompile()  # the new class gets this graph's forward
