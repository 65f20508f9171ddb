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
compared (:func:`compare_lowered` says so and compares those, a row per floating-point leaf:
each tensor of a tuple, a Hugging Face ``ModelOutput``'s logits ...); ``"inductor"`` likewise
(fused oneDNN kernels keep no intermediate tensors). An output that is a dequantize is measured in
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

from qviz.engine.graph.fingerprint import check_lineage, check_same_model
from qviz.engine.graph.inputs import bind_batch, measured_batches
from qviz.engine.graph.stage import Stage, check_stage
from qviz.errors import ConfigError, MeasurementError
from qviz.numeric.measure.batches import output_leaves, output_pairs

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

    def __post_init__(self) -> None:
        check_tolerance(self.tolerance, "LoweringComparison")

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

    @property
    def summary(self) -> str:
        """One line read from the rows: the first departure and how many tensors depart, or
        that none does, with the largest difference and the tolerance it was read against.

        Example:
            >>> row = {"tensor": "q", "op": "conv2d", "elements": 4, "differing": 1,
            ...        "share": 0.25, "max_steps": 3}
            >>> LoweringComparison((row,), "onnxruntime", "per tensor", tolerance=4).summary
            'no tensor more than 4 steps from the reference (largest: 3 steps, conv2d)'
            >>> LoweringComparison((row,), "onnxruntime", "per tensor").summary
            'first departure: conv2d (3 steps); 1 of 1 tensors more than 1 step away'
        """
        if not self.rows:
            return "nothing compared"
        steps = "step" if self.tolerance == 1 else "steps"
        first = self.first_departure
        if first is not None:
            departing = sum(1 for r in self.rows if r["max_steps"] > self.tolerance)
            return (
                f"first departure: {first['op']} ({first['max_steps']} steps); {departing} of "
                f"{len(self.rows)} tensors more than {self.tolerance} {steps} away"
            )
        top = max(self.rows, key=lambda r: r["max_steps"])
        return (
            f"no tensor more than {self.tolerance} {steps} from the reference (largest: "
            f"{top['max_steps']} steps, {top['op'] if top['op'] != 'output' else top['tensor']})"
        )

    def __repr__(self) -> str:
        return (
            f"LoweringComparison({self.backend}, {len(self.rows)} tensors {self.granularity}; "
            f"{self.summary})"
        )


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
    check_tolerance(tolerance, "compare_lowered")
    if float_model is not None:
        check_stage(float_model, Stage.FLOAT, where="compare_lowered", arg="float_model")
        check_lineage(float_model, converted, "compare_lowered(float_model=...)")
    # finite, at least one, and the same batches for both comparisons
    data = measured_batches(data, "compare_lowered", max_batches=max_batches)
    if lowered.backend != "onnxruntime":
        result = _compare_outputs(converted, lowered, data, tolerance)
    else:
        result = _compare_tensors(converted, lowered, data, tolerance)
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
    check_stage(converted, Stage.CONVERTED, where=where, arg="converted")  # before it runs
    check_same_model(
        lowered.fingerprint, converted, f"{where}(converted=...)", what="the lowered program"
    )


def check_tolerance(tolerance: Any, where: str) -> None:
    """``tolerance`` (steps a tensor may differ by) is an int >= 0, else a ConfigError.

    Example:
        >>> check_tolerance(-1, "compare_lowered")
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: compare_lowered(tolerance=-1): give an int >= 0 (steps)
    """
    if not isinstance(tolerance, int) or isinstance(tolerance, bool) or tolerance < 0:
        raise ConfigError(f"{where}(tolerance={tolerance!r}): give an int >= 0 (steps)")


def _beside(
    result: LoweringComparison, float_model: Any, converted: GraphModule, batches: list
) -> LoweringComparison:
    """``result`` with each row's quantization error: its op's local and cumulative SQNR (the
    model outputs' row: the output SQNR)."""
    from dataclasses import replace

    from qviz.numeric.compare.compare import compare

    report = compare(float_model, converted, batches, progress=False)
    sqnr = {
        str(r["node"]): (float(r["local_sqnr"]), float(r["cumulative_sqnr"]))
        for r in report.df.to_dict("records")
    }
    rows = []
    for row in result.rows:
        nan = float("nan")
        local, cumulative = sqnr.get(row["op"], (nan, nan))
        if row["op"] == "output":  # one output: the outputs' figure; several: the leaf's
            cumulative = report.output_leaves.get(row["tensor"], float(report.output_sqnr))
        rows.append(dict(row, local_sqnr=local, cumulative_sqnr=cumulative))
    return replace(result, rows=tuple(rows))


def _compare_tensors(
    converted: GraphModule, lowered: Any, data: list[Any], tolerance: int
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
    for args in _bound_batches(converted, data):
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


def _bound_batches(converted: GraphModule, batches: list[Any]) -> Any:
    """Each batch's positional inputs, through the one batch path (``batches`` are already
    :func:`~qviz.engine.graph.inputs.measured_batches`: finite, limited, at least one)."""
    for i, batch in enumerate(batches):
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


def _output_steps(converted: GraphModule) -> list[float | None]:
    """Per output of the graph (flattened, in order): one step of its grid when it is a
    dequantize (the last layer's output quantized, as XNNPACKQuantizer does); None when it is
    float (X86InductorQuantizer leaves the last layer's output float)."""
    out = next(n for n in converted.graph.nodes if n.op == "output").args[0]
    steps: list[float | None] = []
    for node in out if isinstance(out, (tuple, list)) else [out]:
        step = None
        if "dequantize_per_tensor" in str(getattr(node, "target", "")):
            step = node.args[1] if isinstance(node.args[1], float) else None
        steps.append(step)
    return steps


def _steps_from_reference(
    ours: torch.Tensor, theirs: torch.Tensor, step: float | None, where: str
) -> torch.Tensor:
    """``|theirs - ours|`` in steps of the output's grid (a float output: of an 8-bit grid over
    its finite range); the same infinity on both sides (a mask) is no difference.

    Raises:
        MeasurementError: the lowered program gives NaN or an infinity where the reference
            does not: no step count measures that.
    """
    same = torch.isinf(ours) & (theirs == ours)
    finite = torch.isfinite(ours) & torch.isfinite(theirs)
    odd = int((~finite & ~same).sum())
    if odd:
        raise MeasurementError(
            f"{where}: {odd} element(s) are NaN or infinite in one of the reference's and the "
            f"lowered program's outputs and not the same in the other's: no number of steps "
            f"measures that; find where the programs part with qviz.numeric.bisect_lowering"
        )
    if step is None:
        top = float(ours[finite].abs().max()) if bool(finite.any()) else 0.0
        step = max(top / 127, 1e-12)
    return torch.where(finite, (theirs - ours).abs() / step, 0.0).round()


def _compare_outputs(
    converted: GraphModule, lowered: Any, data: list[Any], tolerance: int
) -> LoweringComparison:
    """The model outputs only (a delegate runs as one call), each floating-point leaf of them
    (:func:`~qviz.numeric.measure.batches.output_pairs`: a tuple's tensors, a ``ModelOutput``'s
    logits ...) a row, in steps of its grid; a float output in steps of an 8-bit grid over its
    range (``max |output| / 127`` per batch)."""
    flat = _output_steps(converted)
    totals: dict[str, list[int]] = {}
    for i, args in enumerate(_bound_batches(converted, data)):
        where = f"compare_lowered batch {i}"
        with torch.no_grad():
            ours, theirs = converted(*args), lowered(*args)
        paths = [path for path, _ in output_leaves(ours)]
        steps = dict(zip(paths, flat, strict=False)) if len(paths) == len(flat) else {}
        for path, ref, got in output_pairs(ours, theirs, where, by_position=True):
            counted = _steps_from_reference(ref, got, steps.get(path), f"{where}: {path}")
            _tally(totals.setdefault(path, [0, 0, 0]), counted)
    rows = tuple(_row(path, "output", *total) for path, total in totals.items())
    return LoweringComparison(
        rows, lowered.backend, "model outputs", tolerance, lowered.fingerprint
    )
