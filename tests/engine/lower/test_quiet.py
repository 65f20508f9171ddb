"""Backend chatter stays off the user's screen; anything that says something went wrong does
not."""

from __future__ import annotations

import os
import sys

from qviz.engine.lower.quiet import quiet


def test_routine_lines_are_dropped_and_the_rest_passed_on(capfd):
    with quiet():
        os.write(2, b"[cpuinfo_utils.cpp:125] CPU info and manual query on # of cpus dont match.\n")
        os.write(2, b"[cpuinfo_utils.cpp:87] Failed to open midr file /sys/devices/soc0/x\n")
        os.write(2, b"[method.cpp:1243] Error resizing tensor at input 0\n")
        print("[cpuinfo_utils.cpp:100] Reading file /sys/devices/system/cpu/cpu0", file=sys.stderr)
        print("[cpuinfo_utils.cpp:9] failed to read /proc/cpuinfo", file=sys.stderr)
    err = capfd.readouterr().err
    assert "Error resizing tensor at input 0" in err
    assert "failed to read /proc/cpuinfo" in err  # cpuinfo, but a failure: kept
    assert "# of cpus" not in err and "midr" not in err and "Reading file" not in err


def test_torchs_enum_notice_is_dropped_and_the_logger_restored(caplog):
    import logging

    logger = logging.getLogger("torch.utils._pytree")
    with quiet():
        logger.warning("<enum 'K'> is an Enum subclass and is now natively supported by ...")
    logger.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]
    assert not logger.filters
