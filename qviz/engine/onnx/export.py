"""Write a quantized model as an ONNX QuantizeLinear / DequantizeLinear (QDQ) graph.

Two kinds of model, both through ``torch.onnx.export`` (the dynamo exporter):

* a model converted by ``qviz.convert_pt2e``: its ``quantized_decomposed`` quantize /
  dequantize ops become QuantizeLinear / DequantizeLinear one for one (stored int8 weights
  become int8 initializers read by a DequantizeLinear, per channel with ``axis``);
  :mod:`qviz.engine.onnx.pt2e` first rewrites narrow ranges on a copy, which torch.onnx would
  otherwise write with the full int8 range;
* a model holding TensorQuantizers: exported under ``fb_fake_quant``, so each enabled
  quantizer is one ``fake_quantize_per_tensor_affine`` / ``..._per_channel_affine``, one
  QuantizeLinear / DequantizeLinear pair (narrow and sub-8-bit grids clamped into int8 / uint8).

A range no integer type of the opset holds (16 bits before opset 21) is refused up front with
the node or quantizer named (:mod:`qviz.engine.onnx.ranges`). The graph is then tidied like
torch.onnx's own ``optimize=True`` (constants folded, initializers lifted) except that
quantize / dequantize nodes are never folded and identical DequantizeLinear nodes are not
merged, so the file has one DequantizeLinear for each dequantize of the converted graph, as
QDQ runtimes expect (one per consumer). ``onnx.checker`` checks the file before it is returned.

Numerics: every QuantizeLinear computes exactly ONNX's definition with the source's scale, zero
point and range, but that definition divides by the scale where torch multiplies by
``1 / scale``: the two round one step apart for values within float32 rounding of a rounding
boundary (about 1 in 10^5 at 8 bits in the tested models; 16-bit grids, finer relative to
float32, more). Float operators (Conv, Gemm) also sum in another order than torch. So
onnxruntime and torch agree to within a few output steps, not bitwise; the tests measure how
close (tests/engine/onnx/test_export.py).

This is the only qviz module that imports onnx, onnxscript and onnx_ir, inside the functions
that need them.

Example:
    >>> import tempfile, torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    >>> x = torch.randn(2, 4)
    >>> prepared = qviz.prepare_pt2e(qviz.export(model, (x,)),
    ...     XNNPACKQuantizer().set_global(get_symmetric_quantization_config()))
    >>> _ = qviz.calibrate(prepared, x, progress=False)
    >>> converted = qviz.convert_pt2e(prepared)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     result = export_onnx(converted, (x,), f"{folder}/linear.onnx")
    >>> result.quantize_linear, result.dequantize_linear   # input, output; + the weight's
    (2, 3)
"""

from __future__ import annotations

import copy
import importlib
import math
import os
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.fx import GraphModule

from qviz.engine.graph.capture import dynamic_batch_shapes
from qviz.engine.graph.fingerprint import check_fingerprint
from qviz.engine.graph.inputs import batch_and_dtype, check_inputs, example_tuple
from qviz.engine.graph.node_data import (
    REPORT_COLUMNS,
    SCALE,
    check_report_matches,
    op_name,
    output_scales,
    report_columns,
    report_ops,
    report_values,
)
from qviz.engine.onnx.metadata import format_value, onnx_sources, write_metadata
from qviz.engine.onnx.pt2e import has_qdq, onnx_ready_copy
from qviz.engine.onnx.ranges import INT16_OPSET, OnnxRange, onnx_type
from qviz.engine.qparams import quant_range
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer, fb_fake_quant
from qviz.errors import ConfigError, MissingDependencyError, OnnxExportError

#: torch.onnx's default opset; int16 / uint16 ranges need :data:`INT16_OPSET` (21).
DEFAULT_OPSET = 20
#: The oldest opset torch.onnx's dynamo exporter writes without a version conversion.
MIN_OPSET = 18
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True, repr=False, kw_only=True)
class OnnxExport:
    """What :func:`export_onnx` wrote.

    Attributes:
        path: the ``.onnx`` file.
        opset: its ONNX opset.
        source: ``"pt2e"`` (a converted graph) or ``"tensor_quantizer"`` (TensorQuantizers).
        op_counts: ONNX node count per operator type, e.g. ``{"QuantizeLinear": 11, ...}``.
        ranges: how each quantized tensor is written: one record per quantize node of the
            converted graph, or per enabled TensorQuantizer, in order.
        model: the written ``onnx.ModelProto`` (not in the repr).
        node_properties: with a report, ``{operator of the converted graph: names of the ONNX
            nodes carrying its qviz.* properties}`` (:mod:`qviz.engine.onnx.metadata`).
    """

    path: Path
    opset: int
    source: str
    op_counts: dict[str, int] = field(hash=False)
    ranges: tuple[OnnxRange, ...]
    model: Any = field(repr=False, compare=False, hash=False)
    node_properties: dict[str, tuple[str, ...]] = field(
        default_factory=dict, repr=False, compare=False, hash=False
    )

    def __repr__(self) -> str:
        clamped = sum(r.clamped for r in self.ranges)
        return (
            f"OnnxExport('{self.path}', opset={self.opset}, {self.source}: "
            f"{self.quantize_linear} QuantizeLinear, {self.dequantize_linear} DequantizeLinear, "
            f"{len(self.ranges)} ranges ({clamped} clamped))"
        )

    @property
    def quantize_linear(self) -> int:
        """The number of QuantizeLinear nodes."""
        return self.op_counts.get("QuantizeLinear", 0)

    @property
    def dequantize_linear(self) -> int:
        """The number of DequantizeLinear nodes."""
        return self.op_counts.get("DequantizeLinear", 0)

    def session(self, *, optimize: bool = True, threads: int | None = None) -> Any:
        """An onnxruntime session of :attr:`path` that computes it exactly on this machine.

        onnxruntime's integer kernels on x86 without VNNI (AVX2, AVX-512 without VNNI)
        saturate 16-bit sums when they meet int8 weights, so a plain ``InferenceSession`` of
        the file can be many quantization steps off there; on such a machine this session runs
        a copy with the weights restated as uint8, the same values in the format onnxruntime
        computes exactly (:func:`qviz.engine.lower.ort_format.exact_session`), as
        :func:`qviz.lower` does. The file is left as it is.

        Args:
            optimize: onnxruntime's graph optimisations (its fused integer kernels); False
                runs each QuantizeLinear / DequantizeLinear as written.
            threads: intra-op threads (None: onnxruntime's default).

        Example:
            >>> import torch, qviz, tempfile
            >>> from qviz.engine.quantizers import XNNPACKQuantizer
            >>> from qviz.engine.quantizers import get_symmetric_quantization_config as config
            >>> x = torch.randn(4, 8)
            >>> gm = qviz.export(torch.nn.Linear(8, 4).eval(), (x,))
            >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config()))
            >>> converted = qviz.convert_pt2e(qviz.calibrate(prepared, [x], progress=False))
            >>> path = tempfile.mkdtemp() + "/linear.onnx"
            >>> session = qviz.export_onnx(converted, (x,), path).session()
            >>> session.run(None, {session.get_inputs()[0].name: x.numpy()})[0].shape
            (4, 4)
        """
        _import("onnxruntime")
        from qviz.engine.lower.ort_format import exact_session

        return exact_session(self.model, optimize=optimize, threads=threads)


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        package = name.split(".")[0].replace("_", "-")
        raise MissingDependencyError(
            f"export_onnx needs {package}: pip install 'qviz[onnx]' (onnx, onnxscript, and "
            f"onnxruntime to run the result)"
        ) from exc


def _check_opset(opset: Any) -> int:
    newest = _import("onnx").defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= newest:
        raise ConfigError(
            f"export_onnx: opset must be an int from {MIN_OPSET} to {newest} (the installed "
            f"onnx's newest), got {opset!r}; int16 ranges need {INT16_OPSET} or later"
        )
    return opset


def _quantizer_range(name: str, tq: TensorQuantizer, opset: int) -> OnnxRange:
    """How the enabled quantizer ``tq`` (at module path ``name``) is written, or why not."""
    where = f"TensorQuantizer {name!r}"
    if getattr(tq, "_if_calib", False):
        raise OnnxExportError(
            f"{where} is calibrating (its forward collects statistics): call "
            f"load_calib_amax() and disable_calib() before export_onnx"
        )
    if tq.amax is None:
        raise OnnxExportError(
            f"{where} has no amax, so it would compute a scale from each input: QuantizeLinear "
            f"needs a fixed scale; calibrate it (load_calib_amax()) or give the descriptor amax="
        )
    if not tq.fake_quant:
        raise OnnxExportError(
            f"{where} has fake_quant=False: its forward returns integers, which ONNX's "
            f"QuantizeLinear / DequantizeLinear pair does not; describe it with fake_quant=True"
        )
    if tq.axis is not None and len(tq.axis) != 1:
        raise OnnxExportError(
            f"{where} keeps one amax per index of axes {tq.axis}: ONNX's per-channel "
            f"QuantizeLinear takes a single axis; quantize along one axis (or per tensor)"
        )
    qmin, qmax = quant_range(tq.num_bits, unsigned=tq.unsigned, narrow_range=tq.narrow_range)
    bits = f"{tq.num_bits}-bit{' unsigned' if tq.unsigned else ''}"
    kind = onnx_type(qmin, qmax, opset=opset, where=f"{where} ({bits})")
    return OnnxRange(name, qmin, qmax, kind.name, kind.clamps(qmin, qmax))


def _quantizer_ranges(model: nn.Module, opset: int) -> tuple[OnnxRange, ...]:
    """One record per enabled (not disabled, quantizing) TensorQuantizer of ``model``."""
    return tuple(
        _quantizer_range(name, m, opset)
        for name, m in model.named_modules()
        if isinstance(m, TensorQuantizer)
        and not getattr(m, "_disabled", False)
        and getattr(m, "_if_quant", True)
    )


def _prepare(model: nn.Module, opset: int) -> tuple[nn.Module, str, tuple[OnnxRange, ...]]:
    """A copy of ``model`` ready for torch.onnx, what it is, and how its ranges are written."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"export_onnx needs an nn.Module, got {type(model).__name__}")
    if isinstance(model, GraphModule) and has_qdq(model):
        ready, ranges = onnx_ready_copy(model, opset)
        if any(isinstance(m, TensorQuantizer) for m in ready.modules()):
            ranges += _quantizer_ranges(ready, opset)
        return ready, "pt2e", ranges
    if any(isinstance(m, TensorQuantizer) for m in model.modules()):
        ranges = _quantizer_ranges(model, opset)
        return copy.deepcopy(model), "tensor_quantizer", ranges
    raise OnnxExportError(
        f"export_onnx: {type(model).__name__} has no quantize / dequantize operators and no "
        f"TensorQuantizer: convert it first (qviz.prepare_pt2e, qviz.calibrate, "
        f"qviz.convert_pt2e), or quantize it with qviz.engine.tensor.quant_nn layers"
    )


def _check_runs(ready: nn.Module, example: tuple) -> None:
    """Run an eval copy of the eager ``ready`` once on ``example``: inputs it cannot take are
    named here, not as torch.onnx's tracing failure (or onnx's type error after it)."""
    trial = copy.deepcopy(ready).eval()
    try:
        with torch.no_grad(), fb_fake_quant(trial):
            trial(*example)
    except Exception as exc:  # the model's own error, whatever its type
        got = [f"{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else repr(x)
               for x in example]  # fmt: skip
        raise ConfigError(
            f"export_onnx: example_inputs {got} do not run through {type(ready).__name__} "
            f"({_root_cause(exc)}); pass inputs the model takes (their shape and dtype)"
        ) from exc


def _check_example(ready: nn.Module, source: str, example: tuple, dynamic_batch: bool) -> None:
    """Refuse, before torch.onnx runs, example inputs a converted graph was not exported for,
    and a dynamic batch asked of a graph exported for a fixed one (the file would be fixed)."""
    if source != "pt2e" or not isinstance(ready, GraphModule):
        _check_runs(ready, example)
        return
    first = batch_and_dtype(ready)
    if first is None:
        return
    batch, dtype = first
    fix = "export the float model with qviz.export(..., dynamic_batch=True) and quantize that"
    if dynamic_batch and batch is not None:
        raise ConfigError(
            f"export_onnx(dynamic_batch=True): the graph was exported for a fixed batch of "
            f"{batch}, so the file would take batch {batch} only; {fix}, or export_onnx "
            f"without dynamic_batch"
        )
    try:
        check_inputs(ready, example, where="example_inputs")
    except ConfigError:
        got = [f"{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else repr(x)
               for x in example]  # fmt: skip
        exported = f"batch {batch} / {dtype}" if batch is not None else f"any batch / {dtype}"
        other = ", or export with qviz.export(..., dynamic_batch=True)" if batch else ""
        raise ConfigError(
            f"export_onnx: example_inputs are {got}, but the graph was exported for {exported}: "
            f"pass that{other}"
        ) from None


def _fake_quant_translations(opset: int) -> dict:
    """torch.onnx translations of torch's fake_quantize ops for any range up to 16 bits:
    QuantizeLinear / DequantizeLinear in the smallest type holding the range, the input clamped
    to the range's end levels first when the range is narrower. (torchlib's own take only
    the 8-bit ranges.) Used where a TensorQuantizer has more than 8 bits."""
    ir = _import("onnx_ir")
    op = _import("onnxscript").opset21
    types = {"int8": ir.DataType.INT8, "uint8": ir.DataType.UINT8}
    types |= {"int16": ir.DataType.INT16, "uint16": ir.DataType.UINT16}

    def qdq(x, scale, zero_point, axis, quant_min, quant_max):
        kind = onnx_type(quant_min, quant_max, opset=opset, where="fake_quantize")
        if isinstance(scale, float | int):
            scale = op.Constant(value_float=float(scale))
        if isinstance(zero_point, int):
            zero_point = op.Constant(value_int=zero_point)
        if kind.clamps(quant_min, quant_max):
            zp = op.Cast(zero_point, to=ir.DataType.FLOAT)
            low = op.Mul(op.Sub(op.Constant(value_float=float(quant_min)), zp), scale)
            high = op.Mul(op.Sub(op.Constant(value_float=float(quant_max)), zp), scale)
            if axis is not None:  # per channel: bounds broadcast along the axis
                shape = [1] * len(x.shape)
                shape[axis] = -1
                low = op.Reshape(low, op.Constant(value_ints=shape))
                high = op.Reshape(high, op.Constant(value_ints=shape))
            x = op.Max(op.Min(x, high), low)
        zp = op.Cast(zero_point, to=types[kind.name])
        attrs = {} if axis is None else {"axis": axis}
        return op.DequantizeLinear(op.QuantizeLinear(x, scale, zp, **attrs), scale, zp, **attrs)

    def per_tensor(x, scale, zero_point, quant_min, quant_max):
        return qdq(x, scale, zero_point, None, quant_min, quant_max)

    def per_channel(x, scale, zero_point, axis, quant_min, quant_max):
        return qdq(x, scale, zero_point, axis % len(x.shape), quant_min, quant_max)

    aten = torch.ops.aten
    return {
        aten.fake_quantize_per_tensor_affine.default: per_tensor,
        aten.fake_quantize_per_tensor_affine.tensor_qparams: per_tensor,
        aten.fake_quantize_per_channel_affine.default: per_channel,
    }


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _torch_onnx(model: nn.Module, args: tuple, opset: int, **options: Any) -> Any:
    """``torch.onnx.export`` without its own optimization, tidied (:func:`_tidy`); its errors
    as OnnxExportError."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*training mode.*")
            program = torch.onnx.export(
                model, args, None, dynamo=True, opset_version=opset, optimize=False,
                verbose=False, **options,
            )  # fmt: skip
    except Exception as exc:  # torch.onnx raises many types; report them all the same way
        cause = _root_cause(exc)
        fix = "make the model export-friendly (torch.export must capture it)"
        if "dynamic_shapes" in options:
            fix = (
                "export with dynamic_batch=False: torch cannot trace its fake_quantize ops with "
                "a dynamic batch (TensorQuantizer models)"
                if "fake_quantize" in cause
                else f"{fix}, or export with dynamic_batch=False"
            )
        raise OnnxExportError(
            f"torch.onnx could not export {type(model).__name__}: {cause}; {fix}"
        ) from exc
    _tidy(program.model)
    return program


def _keep_qdq(node: Any) -> bool | None:
    """Constant folding leaves quantize / dequantize nodes alone (None: the default rules)."""
    return False if node.domain == "" and node.op_type in _QDQ_OPS else None


def _tidy(model: Any) -> None:
    """torch.onnx's ``optimize=True`` passes on the IR model, in place, without folding Q / DQ
    and without merging identical nodes (which would share one DequantizeLinear among the
    consumers the converted graph gave one each)."""
    optimizer = _import("onnxscript.optimizer")
    rewriter = _import("onnxscript.rewriter")
    common = _import("onnx_ir.passes.common")
    optimizer.inline(model)
    for _ in range(2):
        optimizer.fold_constants_ir(model, should_fold=_keep_qdq)
        rewriter.rewrite(model)
    common.RemoveUnusedNodesPass()(model)
    common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    common.DeduplicateInitializersPass()(model)
    common.RemoveUnusedNodesPass()(model)


def _report_values(
    report: Any, model: nn.Module, ready: nn.Module, source: str
) -> dict[str, dict[str, float]]:
    """``{operator: {column: value}}`` to write, checked against the converted graph: the
    report must have measured ``model`` (its fingerprint), and its rows must name its nodes."""
    if report is None:
        return {}
    if source != "pt2e" or not isinstance(ready, GraphModule):
        raise ConfigError(
            "export_onnx(report=...) takes the report of a model converted by qviz.convert_pt2e; "
            "a TensorQuantizer model's layers are not graph operators: export it without report"
        )
    check_fingerprint(report, model, "export_onnx(report=...)")
    ops = {n.name: op_name(n) for n in ready.graph.nodes if n.op == "call_function"}
    rows = report_ops(report)
    check_report_matches(report, [r for r, op in rows.items() if ops.get(r) == op], ops,
                         "this converted model")  # fmt: skip
    columns = [c for c in REPORT_COLUMNS if c in report_columns(report)]
    values = report_values(report, columns)
    for node, scale in output_scales(ready.graph).items():
        if node in ops:
            values.setdefault(node, {})[SCALE] = scale
    return values


def _annotate(program: Any, ready: GraphModule, values: dict, report: Any) -> dict:
    """Write the values as node metadata properties on torch.onnx's model, and the summary."""
    summary = {"output_sqnr": format_value(float(getattr(report, "output_sqnr", math.nan)))}
    if callable(getattr(report, "summary", None)):
        summary["numeric_report"] = str(report.summary())
    sources = onnx_sources(program.exported_program, ready)
    return write_metadata(program.model, sources, values, summary)


def _check_path(path: Any) -> Path:
    """``path`` as a Path, refused before anything runs when no file can be written there: not
    a path, an existing folder, under a file, or in a folder that refuses a new file (probed
    with a temporary file, removed at once; no folder is created here)."""
    if not isinstance(path, str | os.PathLike) or not str(path):
        raise ConfigError(
            f"export_onnx: path must be a file path (str or Path), got {path!r}; e.g. 'model.onnx'"
        )
    target = Path(path)
    if target.is_dir():
        raise ConfigError(
            f"export_onnx: path {target} is a folder; give a file path, e.g. "
            f"{target / 'model.onnx'}"
        )
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(
            f"export_onnx cannot write {target}: {folder} is a file, not a folder; choose a "
            f"path under a folder"
        )
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ConfigError(
            f"export_onnx cannot write {target}: {folder} refuses new files "
            f"({exc.strerror or exc}); choose a writable folder"
        ) from exc
    return target


def _write(program: Any, path: Path) -> Any:
    """Save ``program``, check the file with onnx.checker, and return its ModelProto."""
    onnx = _import("onnx")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        program.save(str(path))
    except OSError as exc:  # the place changed since _check_path
        raise ConfigError(
            f"export_onnx cannot write {path}: {exc.strerror or exc}; choose a writable folder"
        ) from exc
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as exc:
        raise OnnxExportError(f"onnx.checker rejects {path}: {_root_cause(exc)}") from exc
    return onnx.load(str(path))


def _export_options(
    source: str, ranges: tuple[OnnxRange, ...], example: tuple, dynamic_batch: bool, opset: int
) -> dict[str, Any]:
    """torch.onnx's options: a dynamic batch (refused for TensorQuantizer models, which torch
    cannot trace with one), and the int16 fake-quantize translations when a range needs them."""
    options: dict[str, Any] = {}
    if dynamic_batch:
        if source == "tensor_quantizer" and ranges:
            raise ConfigError(
                f"export_onnx(dynamic_batch=True): torch cannot trace the fake-quantize ops of "
                f"{len(ranges)} enabled TensorQuantizer(s) with a dynamic batch; export with "
                f"dynamic_batch=False (the file then takes the example's batch)"
            )
        options["dynamic_shapes"] = dynamic_batch_shapes(example)
    if any(r.onnx_type in ("int16", "uint16") for r in ranges):  # only fake_quantize ops use it
        options["custom_translation_table"] = _fake_quant_translations(opset)
    return options


def export_onnx(
    model: nn.Module,
    example_inputs: tuple[Any, ...] | torch.Tensor,
    path: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    dynamic_batch: bool = False,
    report: Any = None,
) -> OnnxExport:
    """Export a quantized model to an ONNX QuantizeLinear / DequantizeLinear graph at ``path``.

    ``model`` is not changed: a copy is rewritten (TensorQuantizers: ``fb_fake_quant``).

    Args:
        model: a model converted by ``qviz.convert_pt2e``, or a model holding TensorQuantizers
            (calibrated: amax loaded, calibration off; disabled ones export as identities).
        example_inputs: a tuple of example positional inputs (a single tensor is accepted).
        path: the ``.onnx`` file to write (missing folders are created); checked first.
        opset: ONNX opset, :data:`MIN_OPSET` or later; int16 / uint16 ranges need 21.
        dynamic_batch: make dimension 0 of every tensor input dynamic. (Not for TensorQuantizer
            models: torch cannot trace its fake-quantize ops with a dynamic batch.)
        report: this converted model's :func:`qviz.numeric.compare` report: its figures become
            the ONNX nodes' and model's ``qviz.*`` metadata properties (``qviz.local_sqnr``,
            ``qviz.output_sqnr``, ...), which Netron shows (:mod:`qviz.engine.onnx.metadata`).

    Returns:
        An :class:`OnnxExport`: the path, the ``onnx.ModelProto``, the node count per operator
        (``.quantize_linear``, ``.dequantize_linear``) and how each range is written.

    Raises:
        OnnxExportError: a range the opset cannot express (int16 before opset 21), a
            TensorQuantizer ONNX cannot write (several axes, no amax, still calibrating), dynamic
            or affine quantization, or torch.onnx's failure with its cause.
        ConfigError: a bad opset, model, report (another model's), path (a folder, under a
            file, unwritable) or example inputs (not what the graph was exported for), or
            ``dynamic_batch=True`` where the file could not take any batch; each names the fix.
        MissingDependencyError: onnx or onnxscript is not installed.

    Example:
        >>> import tempfile, torch
        >>> from qviz.engine.tensor.tensor_quant import QuantDescriptor, TensorQuantizer
        >>> model = torch.nn.Sequential(TensorQuantizer(QuantDescriptor(num_bits=4, amax=1.0)))
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     result = export_onnx(model, torch.randn(2, 3), f"{folder}/tq.onnx")
        >>> str(result.ranges[0]), result.quantize_linear, result.dequantize_linear
        ('0: -8..7 (clamped, then int8)', 1, 1)
    """
    opset = _check_opset(opset)
    target = _check_path(path)
    example_inputs = example_tuple(example_inputs)
    ready, source, ranges = _prepare(model, opset)
    values = _report_values(report, model, ready, source)
    options = _export_options(source, ranges, example_inputs, dynamic_batch, opset)
    _check_example(ready, source, example_inputs, dynamic_batch)
    with fb_fake_quant(ready):
        program = _torch_onnx(ready, example_inputs, opset, **options)
    placed = _annotate(program, ready, values, report) if report is not None else {}
    proto = _write(program, target)
    counts = Counter(n.op_type for n in proto.graph.node)
    return OnnxExport(
        path=target,
        opset=opset,
        source=source,
        op_counts=dict(counts),
        ranges=ranges,
        model=proto,
        node_properties=placed,
    )
