"""Reference -> real kernels, operator by operator: where does the lowered model depart?

:func:`compare_lowered` runs the converted model (the reference) and its lowered program on
the same batches and compares every quantized activation, in integers: for each quantize
operator of the reference (the output of a conv, an add, a pooling, ...) the lowered program's
integers for the same tensor, so each difference is counted in steps of that tensor's own grid.
A row per quantized tensor says how many elements differ and by how many steps at most; the first
tensor that departs by more than one step is where the lowered program stops computing what the
reference computes (one step is the rounding an integer kernel's requantization may differ by).

Granularity per backend: ``"onnxruntime"``, every quantized tensor (each QuantizeLinear's output
becomes an output of the optimised session, whose fused kernels keep those names).
``"xnnpack"``: ExecuTorch runs a delegate as one call, so only the model's outputs can be
compared (:func:`compare_lowered` says so and compares those); ``"inductor"`` likewise (fused
oneDNN kernels keep no intermediate tensors). An output that is a dequantize is measured in
steps of its grid; a float output (X86InductorQuantizer leaves the last layer's output float) in
steps of an 8-bit grid over its range, ``max |output| / 127``.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> x = torch.randn(16, 4)
    >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval(), (x,))
    >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> _ = qviz.calibrate(p, x, progress=False)
    >>> converted = qviz.convert_pt2e(p)
    >>> result = compare_lowered(converted, qviz.lower(converted, (x,), backend="onnxruntime"), x)
    >>> result.first_departure is None, int(result.df["max_steps"].max()) <= 1
    (True, True)
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from qviz.engine.graph.fingerprint import fingerprint
from qviz.engine.graph.inputs import batches_of, bind_batch
from qviz.errors import ConfigError

_QUANTIZE = ("quantize_per_tensor", "quantize_per_channel")


@dataclass(frozen=True)
class LoweringComparison:
    """Per quantized tensor: the reference's integers against the lowered program's.

    Attributes:
        rows: one dict per quantized tensor, in graph order: ``tensor`` (the reference's
            quantize node), ``op`` (the node it quantizes), ``elements``, ``differing`` (how
            many differ), ``share`` (their fraction), ``max_steps`` (largest difference in
            steps of the tensor's grid).
        backend: the lowered program's backend.
        granularity: ``"per tensor"`` or ``"model outputs"``.
        tolerance: how many steps a tensor may differ by before it counts as departing.
        fingerprint: the converted model's (``qviz.viz.graph`` refuses to draw it on another).
    """

    rows: tuple[dict[str, Any], ...]
    backend: str
    granularity: str
    tolerance: int = 1
    fingerprint: Any = None

    def graph_metric(self) -> tuple[dict[str, float], str, bool, tuple[float, float]]:
        """What ``qviz.viz.graph(converted, metrics=comparison)`` draws: each quantized op's
        largest difference from the reference in steps of its grid, fewer is better, on a fixed
        scale (green at 0, red from four times the tolerance), so drawings compare.

        Example:
            >>> c = LoweringComparison(({"tensor": "q", "op": "conv2d", "elements": 4,
            ...     "differing": 1, "share": 0.25, "max_steps": 1},), "onnxruntime", "per tensor")
            >>> c.graph_metric()
            ({'conv2d': 1.0}, 'steps from reference', False, (0.0, 4.0))
        """
        values = {r["op"]: float(r["max_steps"]) for r in self.rows if r["op"] != "output"}
        return values, "steps from reference", False, (0.0, 4.0 * max(self.tolerance, 1))

    @property
    def df(self) -> Any:
        """The rows as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(list(self.rows))

    @property
    def first_departure(self) -> dict[str, Any] | None:
        """The first row (in graph order) more than ``tolerance`` steps from the reference."""
        return next((r for r in self.rows if r["max_steps"] > self.tolerance), None)

    def __repr__(self) -> str:
        first = self.first_departure
        where = (
            f"first departure: {first['op']} ({first['max_steps']} steps)"
            if first
            else ("no tensor more than one step from the reference")
        )
        return f"LoweringComparison({self.backend}, {len(self.rows)} tensors {self.granularity}; {where})"  # noqa: E501


class _Recorder(Interpreter):
    """Runs the reference and keeps every activation quantize node's integer output."""

    def __init__(self, gm: GraphModule, wanted: list[Node]) -> None:
        super().__init__(gm)
        self.wanted = set(wanted)
        self.seen: dict[str, torch.Tensor] = {}

    def run_node(self, n: Node) -> Any:
        out = super().run_node(n)
        if n in self.wanted:
            self.seen[n.name] = out.detach()
        return out


def _activation_quantizes(gm: GraphModule) -> list[Node]:
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and any(q in getattr(n.target, "__name__", "") for q in _QUANTIZE)
        and not getattr(n.target, "__name__", "").startswith("de")
    ]


def _session_with_quantize_outputs(
    artifact: bytes, only: Collection[int] | None = None
) -> tuple[Any, list[str]]:
    """An optimised onnxruntime session over ``artifact`` whose outputs also hold every
    QuantizeLinear's integers (or the ``only`` ones, by index); every QuantizeLinear's output
    name, in graph order."""
    from qviz.engine.onnx.export import _import

    onnx, ort = _import("onnx"), _import("onnxruntime")
    model = onnx.load_from_string(artifact)
    types = {i.name: i.data_type for i in model.graph.initializer}
    names = []
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and (only is None or len(names) in only):
            zero_point = node.input[2] if len(node.input) > 2 else ""
            elem = types.get(zero_point, onnx.TensorProto.UINT8)
            model.graph.output.append(
                onnx.helper.make_tensor_value_info(node.output[0], elem, None)
            )
        if node.op_type == "QuantizeLinear":
            names.append(node.output[0])
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: not the optimiser's notes on each session
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session, names


def compare_lowered(
    converted: GraphModule,
    lowered: Any,
    data: Any,
    *,
    tolerance: int = 1,
    max_batches: int | None = None,
    float_model: Any = None,
) -> LoweringComparison:
    """Compare ``lowered`` with ``converted`` (its reference), tensor by tensor, on ``data``.

    With ``float_model``, float -> reference -> real kernels: each row also carries its op's
    quantization error (``local_sqnr``, ``cumulative_sqnr`` from :func:`qviz.numeric.compare`
    on the same batches) beside the lowering error, so a layer's error splits into what
    quantization did and what lowering did.

    Args:
        converted: the model :func:`qviz.convert_pt2e` returned.
        lowered: ``qviz.lower(converted, ...)``: refused if it was lowered from another model.
        data: batches, as for :func:`qviz.calibrate`.
        tolerance: steps a tensor may differ by before it departs: one is the rounding an
            integer kernel's requantization may differ by, which reaches a finer grid
            downstream as several (digits on onnxruntime: up to 3 steps after the add).
        max_batches: compare at most this many batches.
        float_model: the float graph module ``converted`` was quantized from (or the module).

    Returns:
        A :class:`LoweringComparison`: ``.df``, ``.first_departure``.

    Raises:
        ConfigError: ``lowered`` measures another model, or is not a lowered model.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> x = torch.randn(16, 4)
        >>> gm = qviz.export(torch.nn.Linear(4, 3).eval(), (x,))
        >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
        ...     get_symmetric_quantization_config()))
        >>> _ = qviz.calibrate(p, x, progress=False)
        >>> c = qviz.convert_pt2e(p)
        >>> compare_lowered(c, qviz.lower(c, (x,), backend="onnxruntime"), x).df.columns.tolist()
        ['tensor', 'op', 'elements', 'differing', 'share', 'max_steps']
    """
    check_lowered(converted, lowered, "compare_lowered")
    if float_model is not None:  # both comparisons read the same batches
        data = list(_limited(batches_of(data, "compare_lowered"), max_batches))
    if lowered.backend != "onnxruntime":
        result = _compare_outputs(converted, lowered, data, tolerance, max_batches)
    else:
        result = _compare_tensors(converted, lowered, data, tolerance, max_batches)
    return result if float_model is None else _beside(result, float_model, converted, data)


def check_lowered(converted: GraphModule, lowered: Any, where: str) -> None:
    """Refuse ``lowered`` unless it is what ``qviz.lower(converted, ...)`` returned.

    Example:
        >>> import torch
        >>> check_lowered(torch.fx.symbolic_trace(torch.nn.ReLU()), object(), "here")
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: here needs what qviz.lower returned, got object
    """
    if getattr(lowered, "artifact", None) is None or not hasattr(lowered, "backend"):
        raise ConfigError(f"{where} needs what qviz.lower returned, got {type(lowered).__name__}")
    if lowered.fingerprint != fingerprint(converted):
        raise ConfigError(
            f"{where}: this lowered model was lowered from another model than `converted` "
            f"(their fingerprints differ); pass the converted model you lowered"
        )


def _limited(batches: Any, most: int | None) -> Any:
    for i, batch in enumerate(batches):
        if most is not None and i >= most:
            return
        yield batch


def _beside(
    result: LoweringComparison, float_model: Any, converted: GraphModule, batches: list
) -> LoweringComparison:
    """``result`` with each row's quantization error: its op's local and cumulative SQNR (the
    model outputs' row: the output SQNR)."""
    from dataclasses import replace

    from qviz.numeric.compare import compare

    report = compare(float_model, converted, batches, progress=False)
    sqnr = {
        str(r["node"]): (float(r["local_sqnr"]), float(r["cumulative_sqnr"]))
        for r in report.df.to_dict("records")
    }
    rows = []
    for row in result.rows:
        nan = float("nan")
        local, cumulative = sqnr.get(row["op"], (nan, nan))
        if row["op"] == "output":
            cumulative = float(report.output_sqnr)
        rows.append(dict(row, local_sqnr=local, cumulative_sqnr=cumulative))
    return replace(result, rows=tuple(rows))


def _compare_tensors(
    converted: GraphModule, lowered: Any, data: Any, tolerance: int, max_batches: int | None
) -> LoweringComparison:
    """Every quantized tensor: the reference's integers against onnxruntime's."""
    wanted = _activation_quantizes(converted)
    session, names = _session_with_quantize_outputs(lowered.artifact)
    if len(names) != len(wanted):
        raise ConfigError(
            f"compare_lowered: the ONNX program has {len(names)} QuantizeLinear operators, the "
            f"converted model {len(wanted)} activation quantize operators; they do not pair up"
        )
    inputs = [i.name for i in session.get_inputs()]
    totals = [[0, 0, 0] for _ in wanted]  # elements, differing, max steps
    for args in _bound_batches(converted, data, max_batches):
        recorder = _Recorder(converted, wanted)
        with torch.no_grad():
            recorder.run(*args)
        feed = {n: a.detach().cpu().numpy() for n, a in zip(inputs, args, strict=True)}
        got = session.run(names, feed)
        for total, node, theirs in zip(totals, wanted, got, strict=True):
            ours = recorder.seen[node.name]
            # the lowered program states an int8 activation grid as uint8 (zero point + 128)
            shift = 128 if theirs.dtype.name == "uint8" and ours.dtype == torch.int8 else 0
            theirs = torch.from_numpy(theirs).to(torch.int64) - shift
            _tally(total, (theirs - ours.to(torch.int64)).abs())
    rows = tuple(
        _row(node.name, node.args[0].name if isinstance(node.args[0], Node) else "", *total)
        for node, total in zip(wanted, totals, strict=True)
    )
    return LoweringComparison(rows, lowered.backend, "per tensor", tolerance, lowered.fingerprint)


def _bound_batches(converted: GraphModule, data: Any, max_batches: int | None) -> Any:
    """Each batch's positional inputs, through the one batch path (at most ``max_batches``)."""
    for i, batch in enumerate(batches_of(data, "compare_lowered")):
        if max_batches is not None and i >= max_batches:
            return
        yield bind_batch(converted, batch, f"compare_lowered batch {i}").args


def _tally(total: list[int], steps: torch.Tensor) -> None:
    """Add one batch's differences (in steps) to ``[elements, differing, max steps]``."""
    total[0] += steps.numel()
    total[1] += int((steps > 0).sum())
    total[2] = max(total[2], int(steps.max()) if steps.numel() else 0)


def _row(tensor: str, op: str, elements: int, differing: int, max_steps: int) -> dict[str, Any]:
    share = differing / elements if elements else 0.0
    return {"tensor": tensor, "op": op, "elements": elements, "differing": differing,
            "share": share, "max_steps": max_steps}  # fmt: skip


def _output_step(converted: GraphModule) -> float | None:
    """One step of the output's grid when the output is a dequantize (the last layer's output
    quantized, as XNNPACKQuantizer does); None when the output is float (X86InductorQuantizer
    leaves the last layer's output float)."""
    out = next(n for n in converted.graph.nodes if n.op == "output").args[0]
    last = out[0] if isinstance(out, (tuple, list)) else out
    if "dequantize_per_tensor" in str(getattr(last, "target", "")):
        if isinstance(last.args[1], float):
            return last.args[1]
    return None


def _compare_outputs(
    converted: GraphModule, lowered: Any, data: Any, tolerance: int, max_batches: int | None
) -> LoweringComparison:
    """The model outputs only, in steps of the output's grid (a delegate runs as one call); a
    float output in steps of an 8-bit grid over its range (``max |output| / 127`` per batch)."""
    step = _output_step(converted)
    total = [0, 0, 0]
    for args in _bound_batches(converted, data, max_batches):
        with torch.no_grad():
            ours, theirs = converted(*args), lowered(*args)
        grid = step if step is not None else max(float(ours.abs().max()) / 127, 1e-12)
        _tally(total, ((theirs - ours).abs() / grid).round())
    row = _row("output", "output", *total)
    return LoweringComparison(
        (row,), lowered.backend, "model outputs", tolerance, lowered.fingerprint
    )
