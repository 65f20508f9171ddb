"""What every benchmark repeats: the machine it ran on, its thread count, and a stopwatch.

A benchmark's figures hold for the CPU it ran on (house rule 17), so each prints the CPU line
first; the flags are read through :func:`qviz.engine.lower.machine.machine` (``/proc/cpuinfo``
on Linux, torch's own CPU checks elsewhere), the one place qviz reads them.

Benchmarks run as scripts (``python benchmarks/x.py``), so they import this as ``_machine``.

Example:
    >>> set_threads(1)
    1
    >>> with Stopwatch() as watch:
    ...     _ = sum(range(1000))
    >>> watch.seconds >= 0
    True
    >>> timed(lambda: 6 * 7)[0]
    42
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from qviz.engine.lower.machine import machine

T = TypeVar("T")

#: The x86 flags that decide int8 kernel speed and exactness, in the order they are printed.
INT8_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")


def cpu_flags() -> str:
    """The int8 flags this CPU has, e.g. ``"avx2 avx512f avx512_vnni"``.

    On x86 those of :data:`INT8_FLAGS` present (``"none of ..."`` if none is); elsewhere (ARM)
    the integer flags the machine reports.
    """
    m = machine()
    if not m.x86:
        return " ".join(m.flags) or f"no int8 flags known on {m.arch}"
    have = [f for f in INT8_FLAGS if f in m.flags]
    return " ".join(have) or "none of " + " ".join(INT8_FLAGS)


def cpu() -> str:
    """The CPU line benchmarks print: ``"<model> (<n> cores), <int8 flags>"``."""
    return f"{machine().model or 'unknown CPU'} ({os.cpu_count()} cores), {cpu_flags()}"


def set_threads(n: int) -> int:
    """Run torch on ``n`` intra-op threads; returns the count torch then reports."""
    torch.set_num_threads(n)
    return torch.get_num_threads()


class Stopwatch:
    """Wall (and process CPU) time of a ``with`` block.

    ``seconds`` and ``cpu_seconds`` are set when the block ends; ``elapsed`` reads the wall time
    so far while it runs (a timeout loop).

    Example:
        >>> with Stopwatch() as watch:
        ...     pass
        >>> 0 <= watch.seconds < 1
        True
    """

    def __init__(self) -> None:
        self.seconds = float("nan")
        self.cpu_seconds = float("nan")
        self._wall = self._cpu = 0.0

    def __enter__(self) -> Stopwatch:
        self._cpu = time.process_time()
        self._wall = time.perf_counter()  # last in, first out: the wall window times the block only
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._wall
        self.cpu_seconds = time.process_time() - self._cpu

    @property
    def elapsed(self) -> float:
        """Wall seconds since the block started."""
        return time.perf_counter() - self._wall


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``(fn(), wall seconds it took)``."""
    with Stopwatch() as watch:
        out = fn()
    return out, watch.seconds
