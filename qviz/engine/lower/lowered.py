"""A converted model on a backend's real kernels, and what it knows about itself.

:class:`LoweredModel` runs like a module (``lowered(x)``: torch tensors in, torch tensors out)
and carries its records as plain data, as the plan does: one :class:`KernelRecord` per operator
of the lowered program (which kernel ran it: ``"integer"``, ``"float"``, or a ``"quantize"``
boundary between them, and why an operator stayed float), the artifact's size in bytes, how long
lowering took, and the fingerprint of the converted model it was lowered from (house rule 14).
:meth:`LoweredModel.latency` measures it at a given batch.

Example:
    >>> rec = KernelRecord(node="conv2d", op="QLinearConv", kernel="integer")
    >>> rec.kernel, rec.reason
    ('integer', '')
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qviz.engine.graph.fingerprint import Fingerprint
from qviz.engine.graph.inputs import rows_repeated
from qviz.engine.lower.machine import Machine, machine
from qviz.engine.lower.records import KERNELS, IntegerFormat, KernelRecord
from qviz.errors import ConfigError


class LoweredModel(nn.Module):
    """A converted model lowered to a backend; call it like the converted model.

    Attributes:
        backend: ``"onnxruntime"`` or ``"xnnpack"``.
        kernels: a :class:`KernelRecord` per operator of the lowered program.
        artifact: the lowered artifact's bytes (the ``.onnx`` file, the ``.pte`` program).
        size_bytes: its size.
        path: where the artifact was written, or None (kept in memory).
        lowering_seconds: how long lowering took.
        fingerprint: the converted model's fingerprint (what this lowered model measures).
        dynamic_batch: whether it takes any batch size (else only the example's).
        max_batch: the largest batch it takes (``"xnnpack"`` with a dynamic batch: ExecuTorch
            plans memory for it); None when unbounded or fixed.
        program: the ``torch.export`` program the backend lowered (``"xnnpack"``; None for a
            backend that lowers another artifact): a prefix of it can be lowered again.
        machine: the :class:`~qviz.engine.lower.machine.Machine` it was lowered on (its
            kernels were chosen for that CPU class).
        int_format: the :class:`IntegerFormat` chosen for that machine, and why.
        speed: what :meth:`compare_speed` measured last (None before).
    """

    def __init__(
        self,
        run: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]],
        *,
        backend: str,
        kernels: Sequence[KernelRecord],
        artifact: bytes,
        example_inputs: tuple[Any, ...],
        fingerprint: Fingerprint,
        lowering_seconds: float,
        dynamic_batch: bool,
        path: Path | None = None,
    ) -> None:
        super().__init__()
        self._run = run
        self.backend = backend
        self.kernels = tuple(kernels)
        self.artifact = artifact
        self.size_bytes = len(artifact)
        self.path = path
        self.fingerprint = fingerprint
        self.lowering_seconds = float(lowering_seconds)
        self.dynamic_batch = dynamic_batch
        self._example = tuple(example_inputs)
        self.max_batch: int | None = None  # the largest batch a bounded dynamic program takes
        self.program = getattr(run, "program", None)
        self.machine: Machine = machine()
        self.int_format: IntegerFormat | None = getattr(run, "int_format", None)
        self.speed: Any = None

    @property
    def input_count(self) -> int:
        """How many positional inputs it takes (those of its example), so that batches of
        ``(inputs..., target)`` bind to it as to the converted model (``evaluate``, ``compare``).
        """
        return len(self._example)

    def forward(self, *inputs: torch.Tensor) -> Any:
        """Run the lowered program; one output comes back as a tensor, several as a tuple.

        Raises:
            ConfigError: an input the program does not take (count, type, dtype, device, rank,
                sizes, a batch over ``max_batch``), named before the runtime sees it.
        """
        self._check_call(inputs)
        tensors = [x.detach().contiguous() for x in inputs]
        outputs = self._run(tensors)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _check_call(self, inputs: tuple[Any, ...]) -> None:
        """Every input against the example the program was lowered for."""
        if len(inputs) != len(self._example):
            raise ConfigError(
                f"this {self.backend} program takes {len(self._example)} input(s) (those of its "
                f"example), got {len(inputs)}"
            )
        for i, (x, example) in enumerate(zip(inputs, self._example, strict=True)):
            if not isinstance(example, torch.Tensor):
                continue
            if not isinstance(x, torch.Tensor):
                kind = type(x).__module__.split(".")[0] + "." + type(x).__name__
                fix = "torch.from_numpy(x)" if kind.startswith("numpy.") else "torch.as_tensor(x)"
                raise ConfigError(
                    f"input {i}: the {self.backend} program takes torch tensors, got {kind}: pass "
                    f"{fix}"
                )
            if x.device.type != "cpu":
                raise ConfigError(
                    f"input {i} is on {x.device}; the {self.backend} program runs on the CPU: "
                    f"pass x.cpu()"
                )
            if x.dtype != example.dtype:
                raise ConfigError(
                    f"input {i} is {x.dtype}; the {self.backend} program takes {example.dtype} "
                    f"(its example's dtype): pass x.to({example.dtype})"
                )
            self._check_shape(i, x, example)

    def _check_shape(self, i: int, x: torch.Tensor, example: torch.Tensor) -> None:
        expect = ("N", *example.shape[1:]) if self.dynamic_batch else tuple(example.shape)
        if x.dim() != example.dim() or tuple(x.shape[1:]) != tuple(example.shape[1:]):
            raise ConfigError(
                f"input {i} has shape {tuple(x.shape)}; the {self.backend} program takes "
                f"{tuple(expect)}".replace("'N'", "N")
            )
        batch, most = (x.shape[0] if x.dim() else 0), self.max_batch
        if x.dim() and not self.dynamic_batch and batch != example.shape[0]:
            raise ConfigError(
                f"input {i} has batch {batch}; this {self.backend} program was lowered for batch "
                f"{example.shape[0]} only: export with qviz.export(..., dynamic_batch=True) to "
                f"take any batch"
            )
        if most is not None and batch > most:
            raise ConfigError(
                f"this {self.backend} program takes batches up to {most} (the memory its "
                f"runtime planned), got {batch}: split the batch, or lower with "
                f"qviz.lower(..., max_batch={batch})"
            )

    def kernel_counts(self) -> dict[str, int]:
        """How many operators each kind of kernel runs, e.g. ``{"integer": 7, "float": 1}``."""
        counts = Counter(r.kernel for r in self.kernels)
        return {k: counts[k] for k in KERNELS if counts[k]}

    def float_fallbacks(self) -> tuple[KernelRecord, ...]:
        """The compute operators a float kernel runs, each with its reason."""
        return tuple(r for r in self.kernels if r.kernel == "float")

    def latency(self, batch: int | None = None, *, repeats: int = 20, warmup: int = 3) -> float:
        """The median seconds of one call at ``batch`` (None: the example's batch).

        Raises:
            ConfigError: a batch other than the example's for a model lowered with a fixed
                batch, or a batch, repeats or warmup that is not a positive int.
        """
        for name, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"latency({name}={value!r}): give an int >= {low}")
        inputs = self._inputs_at(batch)
        for _ in range(warmup):
            self(*inputs)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            self(*inputs)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def compare_speed(
        self, converted: Any, batches: Sequence[int] = (1, 8), *, repeats: int = 20
    ) -> Any:
        """Time this int8 program against the same backend's float program (the converted
        model without its quantize / dequantize pairs, lowered to XNNPACK fp32, an onnxruntime
        float session, or ``torch.compile`` with freezing) at each batch, interleaved; the
        :class:`~qviz.engine.lower.speed.SpeedComparison` is kept in ``.speed`` and shown by
        :meth:`summary`, with the machine.

        Args:
            converted: the model given to :func:`qviz.lower` (its fingerprint is checked).
            batches: the batch sizes (a fixed-batch program: its own batch only).
            repeats: timed calls of each program per batch (the median counts).

        Example:
            >>> import torch, qviz
            >>> from qviz.engine.quantizers import (XNNPACKQuantizer,
            ...     get_symmetric_quantization_config)
            >>> x = torch.randn(8, 16)
            >>> gm = qviz.export(torch.nn.Linear(16, 4).eval(), (x,), dynamic_batch=True)
            >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
            ...     get_symmetric_quantization_config()))
            >>> _ = qviz.calibrate(p, x, progress=False)
            >>> c = qviz.convert_pt2e(p)
            >>> speed = qviz.lower(c, (x,), backend="onnxruntime").compare_speed(c, repeats=3)
            >>> [row.batch for row in speed.rows], speed.float_program
            ([1, 8], 'onnxruntime float session')
        """
        from qviz.engine.lower.speed import compare_speed

        if not self.dynamic_batch:
            batches = tuple(b for b in batches if b == self._inputs_at(None)[0].shape[0]) or (
                self._inputs_at(None)[0].shape[0],
            )
        for b in batches:
            self._inputs_at(b)  # a bad batch is named before anything is lowered
        self.speed = compare_speed(self, converted, tuple(batches), repeats)
        return self.speed

    def _inputs_at(self, batch: int | None) -> tuple[Any, ...]:
        first = next((x for x in self._example if isinstance(x, torch.Tensor)), None)
        if batch is None or first is None or first.dim() == 0 or batch == first.shape[0]:
            return self._example
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ConfigError(f"latency(batch={batch!r}): give a batch size >= 1")
        if not self.dynamic_batch:
            raise ConfigError(
                f"latency(batch={batch}): this model was lowered for batch {first.shape[0]} "
                f"only; export the float model with qviz.export(..., dynamic_batch=True), "
                f"quantize and lower that, or leave batch out"
            )
        return rows_repeated(self._example, batch)

    def summary(self) -> str:
        """One line per kind of kernel, the machine and the integer format chosen for it, the
        speed against the same backend's float program once measured, then each float
        fallback with its reason."""
        counts = ", ".join(f"{n} {k}" for k, n in self.kernel_counts().items())
        lines = [
            f"LoweredModel({self.backend}): {len(self.kernels)} operators ({counts}), "
            f"{self.size_bytes / 1024:.1f} KiB, lowered in {self.lowering_seconds:.2f} s",
            f"  machine: {self.machine}",
        ]
        if self.int_format is not None:
            lines.append(f"  format: {self.int_format.name}: {self.int_format.why}")
        if self.speed is not None:
            lines += [f"  {line}" for line in self.speed.lines(machine=False)]
        lines += [
            f"  float: {r.source or r.node} ({r.op}): {r.reason}" for r in self.float_fallbacks()
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        """The summary, then the compute operators (the converted op each computes, the kernel,
        where it runs, why a float one is float); quantize and data operators are counted in
        the summary and listed under a fold."""
        import html

        def table(records: list[KernelRecord]) -> str:
            rows = "".join(
                f"<tr><td>{html.escape(r.source)}</td><td>{html.escape(r.op)}</td>"
                f"<td><b>{r.kernel}</b></td><td>{html.escape(r.where)}</td>"
                f"<td>{html.escape(r.reason)}</td></tr>"
                for r in records
            )
            head = "".join(f"<th>{h}</th>" for h in ("computes", "op", "kernel", "where", "why"))
            return f"<table><tr>{head}</tr>{rows}</table>"

        compute = [r for r in self.kernels if r.kernel in ("integer", "float")]
        other = [r for r in self.kernels if r.kernel not in ("integer", "float")]
        head = [
            line.strip() for line in self.summary().splitlines() if not line.startswith("  float:")
        ]
        summary = "<br>".join(html.escape(line) for line in head)
        fold = (
            f"<details><summary>{len(other)} quantize / dequantize and data operators"
            f"</summary>{table(other)}</details>"
            if other
            else ""
        )
        return f"<p>{summary}</p>{table(compute)}{fold}"
