"""A converted model on real kernels: ExecuTorch XNNPACK, onnxruntime, x86 Inductor.

:func:`lower` takes what :func:`qviz.convert_pt2e` returned (the reference model) and returns a
:class:`~qviz.engine.lower.lowered.LoweredModel`: it runs like a module on the backend's own
kernels and records, operator by operator, which ran on integer kernels and which fell back to
float, and why; its artifact's size; how long lowering took; its latency on request.

Each backend is an optional dependency (``pip install 'qviz[lower]'``): ExecuTorch for
``"xnnpack"``, onnx and onnxruntime for ``"onnxruntime"``, torchao's x86 int8 fusion passes for
``"inductor"`` (``torch.compile`` onto oneDNN int8 kernels). The caller's model is never changed.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> x = torch.randn(8, 4)
    >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval(), (x,))
    >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> _ = qviz.calibrate(p, x, progress=False)
    >>> lowered = qviz.lower(qviz.convert_pt2e(p), (x,), backend="onnxruntime")
    >>> lowered.backend, lowered(x).shape
    ('onnxruntime', torch.Size([8, 3]))
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule

from qviz.engine.graph.fingerprint import fingerprint
from qviz.engine.graph.inputs import batch_and_dtype, check_inputs, example_tuple, traced_example
from qviz.engine.graph.stage import Stage, model_stage
from qviz.engine.lower.lowered import LoweredModel
from qviz.engine.lower.machine import Machine
from qviz.engine.lower.records import DEFAULT_MAX_BATCH, IntegerFormat, KernelRecord
from qviz.engine.lower.speed import SpeedComparison
from qviz.errors import ConfigError

__all__ = [
    "BACKENDS",
    "IntegerFormat",
    "KernelRecord",
    "LoweredModel",
    "Machine",
    "SpeedComparison",
    "lower",
]

#: The backends :func:`lower` knows.
BACKENDS = ("xnnpack", "onnxruntime", "inductor")


def _check(converted: Any, example_inputs: Any, backend: Any) -> tuple[Any, ...]:
    if backend not in BACKENDS:
        raise ConfigError(
            f"lower(backend={backend!r}): the backends are {', '.join(map(repr, BACKENDS))}"
        )
    if not isinstance(converted, GraphModule) or model_stage(converted) is not Stage.CONVERTED:
        stage = model_stage(converted).value if isinstance(converted, GraphModule) else None
        got = f"a {stage} graph" if stage else type(converted).__name__
        raise ConfigError(
            f"lower needs the model qviz.convert_pt2e returns, got {got}: prepare, calibrate "
            f"and convert first"
        )
    example_inputs = example_tuple(example_inputs, "lower")
    check_inputs(converted, example_inputs, where="lower: example_inputs")
    return example_inputs


def _backend(backend: str) -> Any:
    """The lowering function of ``backend`` (imported only when used)."""
    if backend == "xnnpack":
        from qviz.engine.lower.xnnpack import lower_xnnpack

        return lower_xnnpack
    if backend == "inductor":
        from qviz.engine.lower.inductor import lower_inductor

        return lower_inductor
    from qviz.engine.lower.onnxruntime import lower_onnxruntime

    return lower_onnxruntime


def _given(artifact: Any, backend: str) -> bytes | None:
    """The bytes of a given artifact, refused unless the backend runs one as it is (what the
    file holds is checked against the converted model by the onnxruntime lowering)."""
    if artifact is None:
        return None
    if backend != "onnxruntime":
        raise ConfigError(
            f"lower(artifact=...) runs a given .onnx on onnxruntime; backend={backend!r} builds "
            f"its own program: leave artifact out, or use backend='onnxruntime'"
        )
    if isinstance(artifact, bytes | bytearray):
        return bytes(artifact)
    if not isinstance(artifact, str | Path):
        raise ConfigError(
            f"lower(artifact=...) takes a path to an .onnx file or its bytes, got "
            f"{type(artifact).__name__}"
        )
    file = Path(artifact)
    if file.is_dir():
        raise ConfigError(f"lower(artifact={str(artifact)!r}) is a folder: give the .onnx file")
    if not file.is_file():
        raise ConfigError(f"lower(artifact={str(artifact)!r}): no such file")
    return file.read_bytes()


#: The largest ``max_batch``: a dynamic batch's bound torch.export and the runtimes take.
MAX_BATCH_BOUND = 2**20


def _max_batch(max_batch: Any) -> int:
    if (
        not isinstance(max_batch, int)
        or isinstance(max_batch, bool)
        or not 2 <= max_batch <= MAX_BATCH_BOUND
    ):
        raise ConfigError(
            f"lower(max_batch={max_batch!r}): give an int from 2 to {MAX_BATCH_BOUND} (the "
            f"largest batch the program will take; ExecuTorch plans its memory for it)"
        )
    return max_batch


def lower(
    converted: GraphModule,
    example_inputs: tuple[Any, ...] | torch.Tensor,
    backend: str = "xnnpack",
    *,
    path: str | Path | None = None,
    artifact: str | Path | bytes | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    progress: bool = False,
) -> LoweredModel:
    """Lower ``converted`` onto ``backend``'s kernels; the lowered model and its records.

    Args:
        converted: the model :func:`qviz.convert_pt2e` returned (not changed).
        example_inputs: inputs it takes (a single tensor is accepted); a model exported with
            ``dynamic_batch=True`` is lowered for any batch size, from an example of any batch
            (a batch of 1 is traced as 2 behind the scenes).
        backend: ``"xnnpack"`` (ExecuTorch with the XNNPACK delegate), ``"onnxruntime"``
            (the QDQ export, run by an optimised CPU session) or ``"inductor"``
            (``torch.compile`` with freezing: oneDNN int8 kernels on x86; quantize with
            X86InductorQuantizer, whose uint8 activations those kernels take).
        path: where to write the artifact (``.pte``, ``.onnx``, or Inductor's wrapper code
            ``.py``); None keeps it in memory.
        artifact: ``"onnxruntime"`` only: run this ``.onnx`` (a path or its bytes, e.g. the
            file a device team shipped) as it is, instead of exporting ``converted``; the
            records and :func:`qviz.numeric.compare_lowered` then measure it against
            ``converted``.
        max_batch: ``"xnnpack"`` with a dynamic batch: the largest batch it takes (ExecuTorch
            plans its memory for that batch), from 2 to 2**20; a larger one is refused when
            called.
        progress: a one-step bar, "lowering to <backend>", while the backend compiles.

    Returns:
        A :class:`LoweredModel`: call it like ``converted``; ``.kernels``, ``.size_bytes``,
        ``.latency(batch)``, ``.summary()``.

    Raises:
        ConfigError: an unknown backend, a model that is not converted, inputs it does not
            take, a bad ``max_batch``, an ``artifact`` that is not this model's quantized .onnx.
        LoweringError: the backend failed, or this machine's kernels would not compute the
            model's integer format exactly (the message names the other way to lower it).
        MissingDependencyError: the backend's package is not installed.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> x = torch.randn(8, 4)
        >>> gm = qviz.export(torch.nn.Linear(4, 3).eval(), (x,), dynamic_batch=True)
        >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
        ...     get_symmetric_quantization_config()))
        >>> _ = qviz.calibrate(p, x, progress=False)
        >>> lowered = qviz.lower(qviz.convert_pt2e(p), (x,), backend="xnnpack")
        >>> lowered(torch.randn(3, 4)).shape, lowered.kernel_counts()["integer"]
        (torch.Size([3, 3]), 1)
    """
    example_inputs = _check(converted, example_inputs, backend)
    given = _given(artifact, backend)
    max_batch = _max_batch(max_batch)
    dynamic = (first := batch_and_dtype(converted)) is not None and first[0] is None
    traced = traced_example(example_inputs, dynamic)
    if given is not None:
        from qviz.engine.lower.onnx_artifact import check_artifact

        check_artifact(given, converted, traced, str(artifact)[:80])
    extra = (given,) if given is not None else ((max_batch,) if backend == "xnnpack" else ())
    folder = Path(path) if path is not None else None
    made, start = _compile(backend, progress, converted, traced, dynamic, folder, *extra)
    return _lowered_model(made, backend, converted, example_inputs, dynamic, start)


def _compile(backend: str, progress: bool, *args: Any) -> tuple[tuple, float]:
    """``backend``'s lowering function run on ``args`` (a one-step bar with ``progress``), and
    the time it started."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    with tqdm(total=1, desc=f"lowering to {backend}", disable=not progress) as bar:
        made = _backend(backend)(*args)
        bar.update(1)
    return made, start


def _lowered_model(
    made: tuple, backend: str, converted: Any, example_inputs: tuple, dynamic: bool, start: float
) -> LoweredModel:
    """The :class:`LoweredModel` of what a backend's lowering function returned."""
    run, records, artifact, written, *size = made
    lowered = LoweredModel(
        run,
        backend=backend,
        kernels=records,
        artifact=artifact,
        example_inputs=example_inputs,
        fingerprint=fingerprint(converted),
        lowering_seconds=time.perf_counter() - start,
        dynamic_batch=dynamic,
        path=written,
    )
    if size:  # Inductor: the wrapper code plus the frozen constants (packed weights) it runs
        lowered.size_bytes = size[0]
    lowered.max_batch = getattr(run, "max_batch", None)
    return lowered
