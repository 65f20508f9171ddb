"""Backends' routine chatter kept off the user's screen; anything that says something went wrong
is passed on.

ExecuTorch's runtime writes CPU-detection lines (``cpuinfo_utils.cpp``) from C++ to file
descriptor 2 (in a Jupyter kernel its bindings send them to ``sys.stderr`` instead), and
importing the lowering stack logs a torch deprecation warning about an enum it registers.
:func:`quiet` captures both while a backend loads, drops the lines it knows to be routine, and
writes the rest back to ``sys.stderr``; :func:`routine` is that rule.

Example:
    >>> routine("[method.cpp:1243] Error resizing tensor at input 0")
    False
    >>> routine("[cpuinfo_utils.cpp:87] Failed to open midr file /sys/devices/soc0/image_version")
    True
    >>> routine("[cpuinfo_utils.cpp:9] failed to read /proc/cpuinfo")
    False
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

#: Lines that are routine whatever words they hold: torch's note that an enum registered as a
#: pytree constant is now natively supported (it says "will be an error in a future release").
#: And ExecuTorch's probe for ARM identification files, absent on x86 ("Failed to open midr
#: file /sys/devices/soc0/image_version").
_KNOWN = (
    re.compile(r"is an Enum subclass and is now natively supported"),
    re.compile(r"cpuinfo_utils\.cpp.*Failed to open midr file"),
)
#: Lines that are routine unless they also hold a word of trouble: ExecuTorch's CPU probing.
_CHATTER = (re.compile(r"cpuinfo"),)
#: Words that make a chatter line worth showing.
_ALARM = re.compile(r"\b(error|failed|fatal|abort|exception)\b", re.IGNORECASE)


def routine(line: str) -> bool:
    """Whether ``line`` is routine backend chatter (dropped), not a sign of trouble."""
    if any(p.search(line) for p in _KNOWN):
        return True
    return any(p.search(line) for p in _CHATTER) and not _ALARM.search(line)


class _DropRoutine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not routine(record.getMessage())


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Capture file descriptor 2, Python's ``sys.stderr`` (where ExecuTorch's bindings write
    inside a Jupyter kernel) and torch's pytree log while the block runs; afterwards write every
    line that is not :func:`routine` to ``sys.stderr``.

    Example:
        >>> with quiet():
        ...     pass
    """
    logger = logging.getLogger("torch.utils._pytree")
    drop = _DropRoutine()
    logger.addFilter(drop)
    python = io.StringIO()
    try:
        with _fd_captured() as native, contextlib.redirect_stderr(python):
            yield
    finally:
        logger.removeFilter(drop)
        text = python.getvalue() + "\n" + native.getvalue()
        kept = [line for line in text.splitlines() if line.strip() and not routine(line)]
        if kept:
            sys.stderr.write("\n".join(kept) + "\n")


@contextlib.contextmanager
def _fd_captured() -> Iterator[io.StringIO]:
    """What is written to file descriptor 2 while the block runs (a StringIO filled at the
    end); nothing where the process has no file descriptor 2."""
    captured = io.StringIO()
    try:
        fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
        saved = os.dup(fd)
    except (OSError, ValueError, AttributeError):  # an embedded interpreter
        yield captured
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        try:
            sys.stderr.flush()
            os.dup2(sink.fileno(), fd)
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            captured.write(sink.read().decode(errors="replace"))
