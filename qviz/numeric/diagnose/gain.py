"""What each remedy of a :func:`qviz.numeric.diagnose` finding is worth, measured on its layer.

A prescription is a claim. When :func:`~qviz.numeric.diagnose` has data it measures the claim:
each poor operator runs alone on the float model's inputs to it (the prepared model, observers
skipped), as the report's *local* error does (inputs through their grids, the operator, the
fused ops after it, its output's grid), and each candidate remedy changes only what it would
change there; the local SQNR on the same inputs, before and after, is its estimated gain.

=========================  ====================================================================
remedy                     measured as
=========================  ====================================================================
an override (per-channel   the spec the override writes (``edited_spec``) gets a new observer,
weights, another range,    which sees that tensor on the data; the operator's other tensors
16 bits, apart from its    keep their calibrated observers
shared group)
keep in float (fallback)   no error at this operator: ``after_db`` is ``inf``
bias correction            each output channel's mean error subtracted before the output grid
AdaRound                   the weight's rounding learned on these inputs (``ADAROUND_ESTIMATE``)
SmoothQuant                the input divided and the weight multiplied by SmoothQuant's
                           factors, both observed anew
=========================  ====================================================================

Remedies that act beyond the operator (cross-layer equalization rescales a pair; an edit of
another operator's tensor) keep ``after_db=None`` and say why: ``RepairSession.apply`` measures
them on the whole model. Bias correction and AdaRound are fitted and measured on the same
batches, so their estimates are optimistic; the others are not fitted.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <...>
    >>> fc = torch.nn.Linear(16, 16).eval()
    >>> with torch.no_grad():
    ...     fc.weight[0] *= 100.0  # one output channel 100x the others
    >>> data = [torch.randn(32, 16) for _ in range(2)]
    >>> gm = qviz.export(fc, (data[0],))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=False))
    >>> prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), data, progress=False)
    >>> report = qviz.numeric.compare(gm, qviz.convert_pt2e(prepared), data, progress=False)
    >>> from qviz.numeric.diagnose.diagnose import diagnose
    >>> finding = diagnose(report, prepared, data=data, threshold_db=40, progress=False).findings[0]
    >>> best = finding.remedies[0]
    >>> best.keeps_quantized, best.gain_db > 1, finding.prescription is best.prescription
    (True, True, True)
    >>> finding.verdict.startswith(best.name), [r.name for r in finding.remedies][-1] != "float"
    (True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node
from torch.fx.node import map_arg

from qviz.engine.graph.inputs import bind_batch
from qviz.engine.pt2e.passes.bn_fold import CONV_OPS, LINEAR_OPS
from qviz.engine.pt2e.prepare import observer_from_spec
from qviz.engine.quantizers.fallback import _resolve, _snapshot
from qviz.engine.quantizers.override import OverrideQuantizer, edited_spec, normalize_overrides
from qviz.engine.repair.adaround import WeightGrid
from qviz.engine.repair.adaround_optim import AdaRoundSettings, learn_rounding
from qviz.engine.repair.smoothquant import smoothing_factors
from qviz.errors import QvizError
from qviz.numeric.diagnose.rules import Context, Prescription
from qviz.numeric.measure.slices import SliceStats

#: AdaRound's settings when it is only estimated (the full run uses 2000 iterations).
ADAROUND_ESTIMATE = AdaRoundSettings(iterations=200)
OVERRIDE = "qviz.engine.quantizers.override.OverrideQuantizer"
FALLBACK = "qviz.numeric.fallback"
#: A prescription's function -> the remedy's short name (an override is named finer).
REMEDY_NAMES = {
    OVERRIDE: "override",
    FALLBACK: "float",
    "qviz.engine.repair.bias_correction": "bias correction",
    "qviz.engine.repair.adaround": "AdaRound",
    "qviz.engine.repair.smooth_quant": "SmoothQuant",
    "qviz.engine.repair.cross_layer_equalization": "equalization",
}
Fn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class RemedyEstimate:
    """One candidate remedy of a finding and its measured local effect.

    Attributes:
        name: short name (``"per-channel weights"``, ``"float"``, ``"AdaRound"``, ...).
        prescription: what to do, and the qviz function that does it.
        before_db: the operator's figure now, on the diagnosis data.
        after_db: with the remedy (``inf``: kept in float); None when not measured here.
        how: how it was measured, or why it was not.
        figure: what was measured, as the report names it (``"local_sqnr"``,
            ``"local_worst_token_sqnr"`` or ``"local_worst_channel_sqnr"``).

    Example:
        >>> e = RemedyEstimate(name="float", prescription=Prescription("keep fc in float",
        ...     "qviz.numeric.fallback"),
        ...                    before_db=12.0, after_db=math.inf, how="no error at this operator")
        >>> e.gain_db, e.keeps_quantized, e.widens
        (inf, False, True)
    """

    name: str
    prescription: Prescription
    before_db: float
    after_db: float | None
    how: str
    figure: str = "local_sqnr"

    @property
    def gain_db(self) -> float | None:
        """``after_db - before_db`` (None when not measured)."""
        return None if self.after_db is None else self.after_db - self.before_db

    @property
    def keeps_quantized(self) -> bool:
        """False for keeping the operator in float."""
        return self.prescription.function != FALLBACK

    @property
    def widens(self) -> bool:
        """Whether it gives up the grid's width: float, or a wider integer grid (int16), which
        costs what quantizing was for (and many backends run no int16 activations)."""
        if not self.keeps_quantized:
            return True
        if self.prescription.function != OVERRIDE:
            return False
        edits = dict(self.prescription.arguments).get("overrides", {})
        return any(str(c.get("dtype", "int8")) not in ("int8", "uint8") for c in edits.values())


@dataclass
class _Edge:
    """One quantized tensor of the operator: an input (``arg``: its argument node) or its
    output (``arg`` None)."""

    key: str  # as an override names it: "producer -> consumer", or the output's node
    arg: str | None
    observer: Any
    spec: Any
    constant: bool


@dataclass(kw_only=True)
class LocalOperator:
    """One operator, its quantized tensors, and what it saw."""

    node: Node
    edges: list[_Edge]
    output: _Edge | None
    figure: str = "local_sqnr"  # what is measured: the finding's figure
    calls: list[dict[str, Any]] = field(default_factory=list)  # per batch: arg name -> value
    refs: list[torch.Tensor] = field(default_factory=list)  # its float output

    def edge(self, key: str) -> _Edge | None:
        """The edge an override key names, when it is one of this operator's tensors."""
        key = " -> ".join(s.strip() for s in key.split("->"))
        if self.output is not None and key == self.node.name:
            return self.output
        return next((e for e in self.edges if e.key == key), None)

    def values(self, edge: _Edge) -> list[torch.Tensor]:
        """What ``edge`` carried on each batch (a constant: once)."""
        if edge.arg is None:
            return self.refs
        got = [c[edge.arg] for c in self.calls]
        return got[:1] if edge.constant else got


def fake_quant_by(observer: Any) -> Fn:
    """The quantize/dequantize ``observer``'s qparams give a tensor (a float dtype: a cast).

    Example:
        >>> from qviz.engine.observers import MinMaxObserver
        >>> obs = MinMaxObserver(dtype=torch.int8, quant_min=-128, quant_max=127,
        ...                      qscheme=torch.per_tensor_symmetric)
        >>> _ = obs(torch.tensor([-1.0, 1.0]))
        >>> fake_quant_by(obs)(torch.tensor([0.3]))
        tensor([0.2980])
    """
    dtype = getattr(observer, "dtype", torch.float32)
    if getattr(observer, "is_dynamic", False):
        raise QvizError("a dynamically quantized tensor (its qparams come from each batch)")
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return (lambda x: x) if dtype == torch.float32 else (lambda x: x.to(dtype).to(x.dtype))
    scale, zero_point = observer.calculate_qparams()
    scale, zero_point = scale.detach().float(), zero_point.detach().to(torch.int32)
    low, high = int(observer.quant_min), int(observer.quant_max)
    if scale.numel() > 1 or "channel" in str(getattr(observer, "qscheme", "")):
        axis = int(observer.ch_axis)
        return lambda x: torch.fake_quantize_per_channel_affine(
            x.float(), scale.reshape(-1), zero_point.reshape(-1), axis % x.dim(), low, high
        ).to(x.dtype)
    s, z = float(scale.reshape(())), int(zero_point.reshape(()))
    return lambda x: torch.fake_quantize_per_tensor_affine(x.float(), s, z, low, high).to(x.dtype)


class _Capture(Interpreter):
    """Runs the prepared model with its observers skipped; keeps each wanted operator's
    arguments and its float output (copies: in-place ops follow)."""

    def __init__(
        self, gm: GraphModule, observers: set[str], locals_: dict[str, LocalOperator]
    ) -> None:
        super().__init__(gm)
        self.observers, self.locals = observers, locals_

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        return args[0] if target in self.observers else super().call_module(target, args, kwargs)

    def run_node(self, n: Node) -> Any:
        local = self.locals.get(n.name)
        if local is not None:
            local.calls.append({a.name: _copy(self.env[a]) for a in n.all_input_nodes})
        result = super().run_node(n)
        if local is not None:
            local.refs.append(_copy(result))
        return result


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _is_observer(ctx: Context, node: Any) -> bool:
    return isinstance(node, Node) and node.op == "call_module" and node.target in ctx.observers


def _output_observer(ctx: Context, node: Node) -> Node | None:
    """The observer call on ``node``'s output (None: its output is not quantized here, as a
    conv's whose relu carries the grid: the report's local figure has no output grid then)."""
    return next((u for u in node.users if _is_observer(ctx, u)), None)


def _spec(ctx: Context, specs: dict[Any, Any], key: Any) -> Any:
    return _resolve(specs.get(key), specs)


def _local(ctx: Context, node: Node, specs: dict[Any, Any]) -> LocalOperator:
    """The operator's quantized tensors: its observed inputs, and its output's observer."""
    edges = []
    for arg in node.all_input_nodes:
        if _is_observer(ctx, arg):
            src = ctx.source(arg)
            edges.append(_Edge(f"{src.name} -> {node.name}", arg.name,
                               ctx.prepared.get_submodule(arg.target),
                               _spec(ctx, specs, (src, node)), src.op == "get_attr"))  # fmt: skip
    call, output = _output_observer(ctx, node), None
    if call is not None:
        output = _Edge(node.name, None, ctx.prepared.get_submodule(call.target),
                       _spec(ctx, specs, node), False)  # fmt: skip
    return LocalOperator(node=node, edges=edges, output=output)


def capture(
    ctx: Context, figures: Mapping[str, str], batches: list[Any]
) -> dict[str, LocalOperator]:
    """Each named call_function operator alone, with what it saw on ``batches``; ``figures``:
    what to measure on each (``"local_sqnr"``, ``"local_worst_token_sqnr"`` or
    ``"local_worst_channel_sqnr"``; anything else measures the whole tensor)."""
    specs, locals_ = _snapshot(ctx.prepared), {}
    for name, figure in figures.items():
        node = ctx.nodes.get(name)
        if node is not None and node.op == "call_function":
            locals_[name] = _local(ctx, node, specs)
            if figure in ("local_worst_token_sqnr", "local_worst_channel_sqnr"):
                locals_[name].figure = figure
    if not locals_:
        return {}
    run = _Capture(ctx.prepared, set(ctx.observers), locals_)
    with torch.no_grad():
        for index, batch in enumerate(batches):
            run.run(*bind_batch(ctx.prepared, batch, f"diagnose: batch {index}").args)
    return {n: loc for n, loc in locals_.items() if loc.calls and len(loc.refs) == len(loc.calls)}


# -- running the operator alone -------------------------------------------------------------------
def _outputs(
    local: LocalOperator,
    fq: Mapping[str, Fn],
    out_fq: Fn | None,
    *,
    shift: Callable[[torch.Tensor], torch.Tensor] | None = None,
    quantize_output: bool = True,
) -> Iterator[torch.Tensor]:
    """The operator's output on each batch: inputs through ``fq`` (by argument), ``shift``
    applied to its result, then ``out_fq`` (unless ``quantize_output`` is False)."""
    node = local.node
    for call in local.calls:

        def value(a: Node, call: dict[str, Any] = call) -> Any:
            v = call[a.name]
            f = fq.get(a.name)
            return f(v) if f is not None else (v.clone() if isinstance(v, torch.Tensor) else v)

        with torch.no_grad():  # never yield inside it: interleaved generators would leak it
            y = node.target(*map_arg(node.args, value), **map_arg(node.kwargs, value))
            y = shift(y) if shift is not None else y
            y = out_fq(y) if out_fq is not None and quantize_output else y
        yield y


def _figure(local: LocalOperator, outs: Iterator[torch.Tensor]) -> float:
    """The operator's figure (``local.figure``: the whole tensor's SQNR, or its worst token's
    or channel's, as :mod:`qviz.numeric.measure.slices` ranks them) over every batch, in dB."""
    slices = SliceStats(channels_first=local.node.target in CONV_OPS)
    signal = noise = 0.0
    for ref, out in zip(local.refs, outs, strict=True):
        ref, out = ref.detach().double(), out.detach().double()
        signal += float(ref.square().sum())
        noise += float((ref - out).square().sum())
        if local.figure != "local_sqnr":
            slices.update(ref, out)
    if local.figure == "local_worst_token_sqnr":
        return slices.worst_token_sqnr()
    if local.figure == "local_worst_channel_sqnr":
        return slices.worst_channel_sqnr()
    if noise == 0.0:
        return math.inf
    return -math.inf if signal == 0.0 else 10.0 * math.log10(signal / noise)


def _current(local: LocalOperator) -> tuple[dict[str, Fn], Fn | None]:
    fq = {e.arg: fake_quant_by(e.observer) for e in local.edges if e.arg is not None}
    out = fake_quant_by(local.output.observer) if local.output is not None else None
    return fq, out


def _observed(spec: Any, values: list[torch.Tensor]) -> Fn:
    """A new observer for ``spec``, shown ``values``; its quantize/dequantize."""
    observer = observer_from_spec(spec, {})
    for v in values:
        observer(v.detach())
    return fake_quant_by(observer)


def local_sqnr(local: LocalOperator) -> float:
    """The operator's figure with its calibrated observers (the report's local figure)."""
    fq, out = _current(local)
    return _figure(local, _outputs(local, fq, out))


# -- each remedy, measured --------------------------------------------------------------------
def _names_in(value: Any) -> set[str]:
    """The node names a prescription argument holds (a name, names, or pairs of names)."""
    if isinstance(value, str):
        return {value}
    out: set[str] = set()
    for item in value or ():
        out |= _names_in(item)
    return out


def _override(local: LocalOperator, arguments: dict[str, Any]) -> tuple[float | None, str]:
    edits = normalize_overrides(arguments["overrides"])
    fq, out = _current(local)
    default = OverrideQuantizer(None, {}).default_spec
    for key, changes in edits.items():
        edge = local.edge(key)
        if edge is None:
            return None, f"it edits {key}, not a tensor of {local.node.name}"
        if "share_with" in changes:
            return None, f"it shares {key}'s observer with another tensor"
        if changes.get("quantize") is False:
            new: Fn = lambda x: x  # noqa: E731 - the tensor left in float
        else:
            spec = edited_spec(key, changes, edge.spec, default, constant=edge.constant,
                               tensor=edge.key)  # fmt: skip
            new = _observed(spec, local.values(edge))
        if edge.arg is None:
            out = new
        else:
            fq[edge.arg] = new
    after = _figure(local, _outputs(local, fq, out))
    return after, f"{', '.join(edits)} observed anew on the diagnosis data"


def _channel_dim(node: Node) -> int:
    return -1 if node.target in LINEAR_OPS else 1


def _bias_correction(local: LocalOperator) -> tuple[float | None, str]:
    node = local.node
    if node.target not in CONV_OPS | LINEAR_OPS:
        return None, f"{node.name} is not a conv / linear"
    fq, out = _current(local)
    dim, total, count = _channel_dim(node), None, 0
    floats = _outputs(local, {}, None, quantize_output=False)
    for q, f in zip(_outputs(local, fq, None, quantize_output=False), floats, strict=True):
        diff = (q - f).double().movedim(dim, 0)
        diff = diff.reshape(diff.shape[0], -1)
        total = diff.sum(1) if total is None else total + diff.sum(1)
        count += diff.shape[1]
    mean = (total / max(count, 1)).float()

    def shift(y: torch.Tensor) -> torch.Tensor:
        shape = [1] * y.dim()
        shape[dim] = -1
        return y - mean.reshape(shape).to(y.dtype)

    after = _figure(local, _outputs(local, fq, out, shift=shift))
    return after, "each output channel's mean error, measured on the same data, subtracted"


def weight_edge(local: LocalOperator) -> _Edge | None:
    """A conv / linear's quantized weight (None: another operator, or a float weight)."""
    node = local.node
    if node.target not in CONV_OPS | LINEAR_OPS or len(node.args) < 2:
        return None
    arg = node.args[1]
    return next((e for e in local.edges if e.constant and e.arg == getattr(arg, "name", "")), None)


def _grid(edge: _Edge, weight: torch.Tensor) -> WeightGrid:
    scale, zero_point = edge.observer.calculate_qparams()
    shape = [1] * weight.dim()
    if scale.numel() > 1:
        shape[int(edge.observer.ch_axis)] = -1
    return WeightGrid(scale.detach().float().reshape(shape),
                      zero_point.detach().float().reshape(shape),
                      int(edge.observer.quant_min), int(edge.observer.quant_max))  # fmt: skip


def _adaround(local: LocalOperator) -> tuple[float | None, str]:
    edge, node = weight_edge(local), local.node
    if edge is None:
        return None, f"{node.name} has no quantized conv / linear weight"
    fq, out = _current(local)
    w = local.calls[0][edge.arg].detach().float()
    grid = _grid(edge, w)
    data_arg = node.args[0].name
    x = torch.cat([fq[data_arg](c[data_arg]) if data_arg in fq else c[data_arg]
                   for c in local.calls])  # fmt: skip
    ref = torch.cat(local.refs).movedim(_channel_dim(node), -1)
    rest_args = map_arg(node.args[2:], lambda a: local.calls[0][a.name])
    kwargs = map_arg(node.kwargs, lambda a: local.calls[0][a.name])

    def layer(inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = node.target(inputs, weight, *rest_args, **kwargs)
        return y.movedim(_channel_dim(node), -1)

    floor_q = torch.floor(w / grid.scale)
    with torch.enable_grad():
        h = learn_rounding(layer, floor_q, w / grid.scale - floor_q, grid.weight, (x, ref),
                           ADAROUND_ESTIMATE, node.name)  # fmt: skip
    rounded = grid.weight(floor_q + h)
    fq[edge.arg] = lambda _: rounded
    after = _figure(local, _outputs(local, fq, out))
    return after, (f"rounding learned on the same data ({ADAROUND_ESTIMATE.iterations} "
                   f"iterations; the repair runs more)")  # fmt: skip


def _smooth_quant(local: LocalOperator, arguments: dict[str, Any]) -> tuple[float | None, str]:
    node, weight = local.node, weight_edge(local)
    data = next((e for e in local.edges if not e.constant), None)
    if node.target not in LINEAR_OPS or weight is None or data is None:
        return None, f"{node.name} is not a linear with a quantized input and weight"
    x = local.values(data)
    act = torch.stack([v.detach().abs().reshape(-1, v.shape[-1]).amax(0) for v in x]).amax(0)
    w = local.calls[0][weight.arg].detach()
    s = smoothing_factors(act.float(), w.abs().amax(0).float(), arguments.get("alpha", 0.5))
    fq_x = _observed(data.spec, [v / s for v in x])
    fq_w = _observed(weight.spec, [w * s])
    fq, out = _current(local)
    fq[data.arg] = lambda v: fq_x(v / s)
    fq[weight.arg] = lambda v: fq_w(v * s)
    after = _figure(local, _outputs(local, fq, out))
    return after, "input divided and weight multiplied by SmoothQuant's factors, both observed anew"


def estimate(local: LocalOperator, name: str, p: Prescription, before: float) -> RemedyEstimate:
    """Measure one candidate on ``local`` (``before``: its local SQNR now)."""
    args, node = dict(p.arguments), local.node.name
    try:
        if p.function == FALLBACK:
            scope = _names_in(args.get("nodes_or_module_names"))
            after, how = math.inf, "no error at this operator"
            if node not in scope:
                after, how = None, f"it keeps {', '.join(sorted(scope))} in float, not {node}"
        elif p.function == OVERRIDE:
            after, how = _override(local, args)
        elif p.function.endswith(".cross_layer_equalization"):
            after, how = None, "it rescales a pair of layers: RepairSession.apply measures it"
        elif node not in _names_in(args.get("nodes")):
            after, how = None, f"it acts on {sorted(_names_in(args.get('nodes')))}, not {node}"
        elif p.function.endswith(".bias_correction"):
            after, how = _bias_correction(local)
        elif p.function.endswith(".adaround"):
            after, how = _adaround(local)
        elif p.function.endswith(".smooth_quant"):
            after, how = _smooth_quant(local, args)
        else:
            after, how = None, f"{p.function} is not measured on one operator"
    except (QvizError, RuntimeError, ValueError, TypeError, IndexError, KeyError) as exc:
        after, how = None, f"not measured: {type(exc).__name__}: {exc}"
    return RemedyEstimate(
        name=name, prescription=p, before_db=before, after_db=after, how=how, figure=local.figure
    )
