"""Empirical bias correction (Nagel et al. 2019, "Data-Free Quantization Through Weight
Equalization and Bias Correction", section 4.2, the empirical variant; AIMET's
``correct_bias`` with ``perform_only_empirical_bias_corr=True``).

Quantizing a layer's weight ``W`` to ``W~`` shifts the mean of its output by ``E[(W~ - W) x]``
per output channel; that shift is not noise that averages out but a bias, and it adds up layer
after layer. Measured on calibration data, it is subtracted from the layer's float bias (qviz's
converted graphs keep conv / linear bias as a float constant), one layer at a time in graph
order, so that each layer is measured with the layers before it already corrected.

How :func:`bias_correction` measures: for each conv / linear whose weight is quantized, in
graph order, the mean of its output (before its activation and output quantization) per output
channel on the data, against the mean of the same output of the float model; the difference is
subtracted from the layer's float bias (a layer without bias gets one). The next layer is
measured with the corrected model, so it sees the corrected layers before it. ``reference``:

* ``"float"`` (the default; AIMET's empirical bias correction): the quantized layer runs on the
  converted model's own activations, the float layer on the float model's own. The correction
  removes the shift of the weight's quantization error *and* any shift the layer inherits from
  the quantized layers and activations before it: afterwards the layer's output mean on the
  data is the float model's.
* ``"quantized"``: both run on the converted model's activations (the layer's input there): the
  correction is exactly the paper's ``E[(W~ - W) x]``, the weight error alone.

Each layer gets a ``TransformRecord`` (kind ``"bias_correction"``) with the largest and mean
per-channel shift of its output mean from the float model's before and after its correction
(with ``"float"`` the shift after is zero up to rounding).

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> x = torch.randn(32, 4) + 2
    >>> gm = qviz.export(torch.nn.Linear(4, 3, bias=False).eval(), (x,))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> converted = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), x, progress=False))
    >>> (record,) = bias_correction(converted, gm, x).plan.transforms
    >>> record.nodes, record.params[2][0], record.params[2][1] < 1e-6  # a bias added, shift gone
    (('linear',), 'max_shift_after', True)
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from torch.fx import GraphModule, Node

from qviz.engine.graph.debug_handles import float_handle, handle
from qviz.engine.graph.fingerprint import check_lineage
from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.graph.inputs import bind_batch, measured_batches
from qviz.engine.graph.mutation import value_probe
from qviz.engine.graph.stage import Stage, check_stage
from qviz.engine.pt2e.passes.bn_fold import BN_OPS, CONV_OPS, LINEAR_OPS, fused_conv_bn_params
from qviz.engine.pt2e.plan import TransformRecord, record_transform
from qviz.engine.repair.options import BiasCorrectionOptions
from qviz.errors import ConfigError


def _channel_means(value: torch.Tensor, linear: bool) -> tuple[torch.Tensor, int]:
    """Per-channel sum of ``value`` (channels: the last dimension of a linear, else dimension 1)
    and how many values each channel summed."""
    dim = value.ndim - 1 if linear else min(1, value.ndim - 1)
    moved = value.detach().double().movedim(dim, 0).reshape(value.shape[dim], -1)
    return moved.sum(1), moved.shape[1]


class _Means:
    """Running per-channel means of several nodes' values over the batches."""

    def __init__(self) -> None:
        self.sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, int] = {}

    def add(self, key: int, value: torch.Tensor, linear: bool) -> None:
        s, n = _channel_means(value, linear)
        self.sums[key] = self.sums.get(key, 0) + s
        self.counts[key] = self.counts.get(key, 0) + n

    def mean(self, key: int) -> torch.Tensor:
        return self.sums[key] / self.counts[key]


def _run(probe: GraphModule, batches: list[tuple[Any, ...]]) -> list[tuple[torch.Tensor, ...]]:
    with torch.no_grad():
        return [probe(*args) for args in batches]


def _is_layer(node: Node) -> bool:
    return node.op == "call_function" and node.target in CONV_OPS | LINEAR_OPS


def _quantized_weight(node: Node) -> bool:
    w = node.args[1] if len(node.args) > 1 else None
    return isinstance(w, Node) and w.op == "call_function" and "dequantize" in str(w.target)


def _set_bias(gm: GraphModule, layer: Node, bias: torch.Tensor) -> str:
    """Give ``layer`` the float bias ``bias``: in place of its own constant, or as a new one when
    it had none (or shared it); the constant's target returned."""
    old = layer.args[2] if len(layer.args) > 2 else None
    if isinstance(old, Node) and old.op == "get_attr" and len(old.users) == 1:
        target = str(old.target)
        owner, _, name = target.rpartition(".")
        module = gm.get_submodule(owner)
        if name in module._parameters:
            module._parameters[name] = torch.nn.Parameter(bias, requires_grad=False)
        else:
            setattr(module, name, bias)
        return target
    target, i = f"{layer.name}_bias_corrected", 0
    while hasattr(gm, target):
        i += 1
        target = f"{layer.name}_bias_corrected_{i}"
    gm.register_parameter(target, torch.nn.Parameter(bias, requires_grad=False))
    with gm.graph.inserting_before(layer):
        node = gm.graph.get_attr(target)
    args = list(layer.args) + [None] * (3 - len(layer.args))
    args[2] = node
    layer.args = tuple(args)
    gm.graph.eliminate_dead_code()  # the shared or non-constant bias input, if now unread
    gm.recompile()
    return target


def bias_correction(
    converted: GraphModule,
    float_gm: GraphModule,
    data: Any,
    *,
    reference: str = "float",
    max_batches: int | None = None,
) -> GraphModule:
    """Subtract the mean output shift that quantization gives each quantized conv / linear from
    its float bias, layer by layer in graph order; a corrected copy of ``converted``. Which
    inputs the comparison uses (``reference``) and what each layer's record holds: the module
    docstring.

    Args:
        converted: the model ``qviz.convert_pt2e`` returned (not changed).
        float_gm: the float graph it was prepared from (what ``qviz.export`` returned).
        data: calibration data, as ``qviz.calibrate`` takes it, kept in memory (the converted
            model runs it once per corrected layer).
        reference: ``"float"`` or ``"quantized"``, above.
        max_batches: use only the first batches of ``data`` (an integer >= 1; None: all).

    Returns:
        The corrected copy of ``converted``.

    Raises:
        ConfigError: ``reference`` or ``max_batches`` of the wrong type or out of range,
            checked first (:class:`~qviz.engine.repair.options.BiasCorrectionOptions`), a model
            at the wrong stage, or ``data`` with no batch.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> torch.manual_seed(0) and None
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
        >>> x = torch.randn(64, 8) + 1
        >>> gm = qviz.export(model, (x,))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(weight_qmin=-8,
        ...     weight_qmax=7))
        >>> converted = qviz.convert_pt2e(qviz.calibrate(qviz.prepare_pt2e(gm, q), x,
        ...     progress=False))
        >>> corrected = bias_correction(converted, gm, x)
        >>> before = (converted(x) - gm(x)).mean(0).abs().max()
        >>> after = (corrected(x) - gm(x)).mean(0).abs().max()
        >>> bool(after < before)
        True
    """
    options = BiasCorrectionOptions(reference=reference, max_batches=max_batches)
    reference = options.reference
    check_stage(converted, Stage.CONVERTED, where="bias_correction", arg="converted")
    check_stage(float_gm, Stage.FLOAT, where="bias_correction", arg="float_gm", exported=True)
    check_lineage(float_gm, converted, "bias_correction(float_gm=...)")  # its own float model
    out = copy.deepcopy(converted)
    batches = _bound(out, data, options.max_batches)
    pairs = _pairs(out, float_gm)
    float_means = _float_means(float_gm, pairs, batches) if reference == "float" else _Means()
    float_params = [_float_params(float_gm, ref) for _, ref in pairs]
    measure = functools.partial(
        _measure, out, pairs, batches=batches, reference=reference, float_means=float_means,
        float_params=float_params,
    )  # fmt: skip
    shifts, afters = _correct(out, pairs, measure)
    _record(out, pairs, shifts, afters, reference)
    out.recompile()
    return out


def _bound(out: GraphModule, data: Any, max_batches: int | None) -> list[tuple]:
    """The positional inputs of each batch (at most ``max_batches``), through the one batch path."""
    measured = measured_batches(data, "bias_correction", max_batches=max_batches)  # finite, some
    return [
        tuple(bind_batch(out, batch, f"bias_correction: batch {i}").args)
        for i, batch in enumerate(measured)
    ]


def _pairs(out: GraphModule, float_gm: GraphModule) -> list[tuple[Node, Node]]:
    """Each quantized conv / linear of ``out`` with its float counterpart in ``float_gm``."""
    layers = [n for n in out.graph.nodes if _is_layer(n) and _quantized_weight(n)]
    by_handle = {handle(n): n for n in float_gm.graph.nodes if handle(n) is not None}
    by_name = {n.name: n for n in float_gm.graph.nodes}
    pairs: list[tuple[Node, Node]] = []
    for layer in layers:
        ref = by_handle.get(float_handle(layer)) or by_name.get(layer.name)
        if ref is None:
            raise ConfigError(
                f"bias_correction: {layer.name} of the converted model has no counterpart in "
                "float_gm; pass the float graph the converted model was prepared from"
            )
        pairs.append((layer, ref))
    return pairs


def _float_means(float_gm: GraphModule, pairs: list, batches: list) -> Any:
    """The float model's own output mean of each layer's counterpart."""
    float_means = _Means()
    for values in _run(value_probe(float_gm, [r for _, r in pairs]), batches) if pairs else ():
        for k, ((layer, _), v) in enumerate(zip(pairs, values, strict=True)):
            float_means.add(k, v, layer.target in LINEAR_OPS)
    return float_means


def _measure(
    out: GraphModule, pairs: list, ks: list[int], *, batches: list, reference: str,
    float_means: Any, float_params: list,
) -> list[torch.Tensor]:  # fmt: skip
    """For each layer k of ``ks``: its output mean in ``out`` now, less the float mean it is
    compared with (the float model's, or the float layer's on the same input)."""
    wanted = []
    for k in ks:
        layer = pairs[k][0]
        wanted += [layer] if reference == "float" else [layer, layer.args[0]]
    means, float_ref = _Means(), _Means()
    for values in _run(value_probe(out, wanted), batches):
        values = list(values)
        for k in ks:
            layer = pairs[k][0]
            linear = layer.target in LINEAR_OPS
            means.add(k, values.pop(0), linear)
            if reference == "quantized":
                w, b = float_params[k]
                x = values.pop(0)
                y = layer.target(x, w.to(x.dtype), _cast(b, x), *layer.args[3:], **layer.kwargs)
                float_ref.add(k, y, linear)
    ref_means = float_means if reference == "float" else float_ref
    return [means.mean(k) - ref_means.mean(k) for k in ks]


def _correct(out: GraphModule, pairs: list, measure: Any) -> tuple[list, list]:
    """Subtract each layer's measured shift from its bias, in graph order (each measured after
    the ones before it are corrected); the shifts before, and each layer's after."""
    shifts: list[torch.Tensor] = []
    afters: list[torch.Tensor] = []
    for k, (layer, _) in enumerate(pairs):
        measured = measure([k] if k == 0 else [k - 1, k])
        if k:
            afters.append(measured[0])
        shift = measured[-1]
        shifts.append(shift)
        old = layer.args[2] if len(layer.args) > 2 else None
        bias = get_attr_value(out, old) if isinstance(old, Node) and old.op == "get_attr" else None
        if isinstance(old, Node) and bias is None:
            raise ConfigError(f"bias_correction: {layer.name}'s bias is not a constant")
        dtype = bias.dtype if bias is not None else torch.float32
        base = bias.detach().double() if bias is not None else torch.zeros_like(shift)
        _set_bias(out, layer, (base - shift).to(dtype))
    if pairs:
        afters += measure([len(pairs) - 1])
    return shifts, afters


def _record(out: GraphModule, pairs: list, shifts: list, afters: list, reference: str) -> None:
    for (layer, _), shift, after in zip(pairs, shifts, afters, strict=True):
        record_transform(
            out,
            TransformRecord(
                "bias_correction",
                (layer.name,),
                f"output mean shift subtracted from its bias (reference: {reference} activations)",
                (
                    ("max_shift_before", float(shift.abs().max())),
                    ("mean_shift_before", float(shift.abs().mean())),
                    ("max_shift_after", float(after.abs().max())),
                    ("mean_shift_after", float(after.abs().mean())),
                ),
            ),
        )


def _cast(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t.to(like.dtype)


def _float_params(float_gm: GraphModule, ref: Node) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The float weight and bias of the float model's layer computing ``ref`` (BatchNorm folded
    in, as prepare folds it)."""
    node = ref
    if node.op == "call_function" and getattr(node.target, "__name__", "") == "getitem":
        node = node.args[0]
    if node.op == "call_function" and node.target in BN_OPS:
        w, b = fused_conv_bn_params(float_gm, node.args[0], node)
        return w.detach(), b.detach()
    w, b = node.args[1], node.args[2] if len(node.args) > 2 else None
    return get_attr_value(float_gm, w).detach(), (
        None if b is None else get_attr_value(float_gm, b).detach()
    )
