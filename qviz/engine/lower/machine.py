"""The CPU a lowering runs on: its instruction-set class, as integer kernels care about it.

Integer kernels are chosen by the CPU they run on, and some of them are not exact everywhere:
on x86 without VNNI (AVX2, or AVX-512 without VNNI), the fused uint8 x int8 kernels of
onnxruntime and oneDNN multiply with ``vpmaddubsw``, which adds two neighbouring products into
a saturating 16-bit sum (255 x 127 + 255 x 127 = 64770 does not fit in 32767). VNNI
(``vpdpbusd``), AMX and ARM's dot-product and widening instructions sum in 32 bits, exactly.
Every :class:`~qviz.engine.lower.lowered.LoweredModel` records the :class:`Machine` it was
lowered on, and every figure that depends on it prints :meth:`Machine.describe` beside it.

Example:
    >>> m = Machine.from_flags("x86_64", {"avx2", "fma"}, "AMD EPYC", cores=2)
    >>> m.isa, m.exact_u8s8
    ('AVX2', False)
    >>> Machine.from_flags("x86_64", {"avx2", "avx512f", "avx512_vnni"}, "Xeon").isa
    'AVX-512 VNNI'
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

#: The x86 flags that decide integer kernels, in the order :meth:`Machine.describe` lists them.
_X86_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
              "amx_tile", "amx_int8")  # fmt: skip
#: The ARM (``Features``) flags that do.
_ARM_FLAGS = ("asimd", "asimddp", "i8mm", "sve", "sve2")


@dataclass(frozen=True)
class Machine:
    """A CPU, as integer kernels see it.

    Attributes:
        arch: ``platform.machine()`` (``"x86_64"``, ``"aarch64"``, ...).
        isa: the class that decides integer kernels: ``"AMX"``, ``"AVX-512 VNNI"``,
            ``"AVX-VNNI"`` (AVX2 with VNNI), ``"AVX-512"`` (no VNNI), ``"AVX2"``,
            ``"x86 (no AVX2)"``, ``"ARM dot-product"``, ``"ARM NEON"`` or ``"other"``.
        model: the CPU's model name.
        cores: logical cores this process may use.
        flags: the flags of those listed above that the CPU has.
    """

    arch: str
    isa: str
    model: str
    cores: int
    flags: tuple[str, ...]

    @classmethod
    def from_flags(cls, arch: str, flags: set[str], model: str = "", cores: int = 1) -> Machine:
        """The machine of ``arch`` with CPU ``flags`` (``/proc/cpuinfo``'s names)."""
        x86 = arch.lower() in ("x86_64", "amd64", "i686", "x86")
        arm = arch.lower() in ("aarch64", "arm64") or arch.lower().startswith("armv8")
        if x86:
            if {"amx_tile", "amx_int8"} <= flags:
                isa = "AMX"
            elif "avx512_vnni" in flags:
                isa = "AVX-512 VNNI"
            elif "avx_vnni" in flags:
                isa = "AVX-VNNI"
            elif "avx512bw" in flags:
                isa = "AVX-512"
            else:
                isa = "AVX2" if "avx2" in flags else "x86 (no AVX2)"
        elif arm:
            isa = "ARM dot-product" if "asimddp" in flags else "ARM NEON"
        else:
            isa = "other"
        known = _X86_FLAGS if x86 else _ARM_FLAGS
        return cls(arch, isa, model, cores, tuple(f for f in known if f in flags))

    @property
    def x86(self) -> bool:
        """Whether it is an x86 CPU."""
        return self.arch.lower() in ("x86_64", "amd64", "i686", "x86")

    @property
    def exact_u8s8(self) -> bool:
        """Whether uint8 x int8 products are summed in 32 bits by the fused integer kernels
        (VNNI, AMX, ARM); False where x86 kernels pair them in saturating 16-bit sums."""
        return not self.x86 or self.isa in ("AMX", "AVX-512 VNNI", "AVX-VNNI")

    def describe(self) -> str:
        """One line to print beside a figure, e.g. ``"AMD EPYC, 2 cores, x86_64 AVX2 (avx2
        fma)"``."""
        model = f"{self.model}, " if self.model else ""
        flags = f" ({' '.join(self.flags)})" if self.flags else ""
        return f"{model}{self.cores} cores, {self.arch} {self.isa}{flags}"

    def __str__(self) -> str:
        return self.describe()


def _cpuinfo() -> tuple[set[str], str]:
    """The flags and model name ``/proc/cpuinfo`` gives (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set(), ""
    flags: set[str] = set()
    model = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
    return flags, model


def _torch_flags() -> set[str]:
    """The flags torch's own CPU checks report, where ``/proc/cpuinfo`` is missing (macOS,
    Windows)."""
    import torch

    cpu = torch.backends.cpu.get_cpu_capability().lower()
    flags = {"avx2"} if cpu in ("avx2", "avx512") else set()
    flags |= {"avx512f", "avx512bw"} if cpu == "avx512" else set()
    checks = {"avx512_vnni": "_is_avx512_vnni_supported", "amx_tile": "_is_amx_tile_supported",
              "avx_vnni": "_is_avx_vnni_supported"}  # fmt: skip
    for flag, check in checks.items():
        if getattr(torch.cpu, check, lambda: False)():
            flags.add(flag)
    return flags | ({"amx_int8"} if "amx_tile" in flags else set())


@functools.lru_cache(maxsize=1)
def machine() -> Machine:
    """The machine this process runs on (read once).

    Example:
        >>> machine().isa in ("AMX", "AVX-512 VNNI", "AVX-VNNI", "AVX-512", "AVX2",
        ...                   "x86 (no AVX2)", "ARM dot-product", "ARM NEON", "other")
        True
    """
    flags, model = _cpuinfo()
    arch = platform.machine() or "unknown"
    if not flags and arch.lower() in ("x86_64", "amd64"):
        flags = _torch_flags()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Machine.from_flags(arch, flags, model or platform.processor(), cores=cores or 1)
