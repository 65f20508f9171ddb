"""torchao's own X86InductorQuantizer tests, run against qviz's quantizer and flow (not CI).

Runs torchao's test file twice under pytest: as it is (torchao's X86InductorQuantizer and
prepare_pt2e / prepare_qat_pt2e / convert_pt2e), then with qviz's swapped in for the names the
test module imports (``X86InductorQuantizer``, ``prepare_pt2e``, ``prepare_qat_pt2e``,
``convert_pt2e``, ``ObserverBase``, and ``xiq.X86InductorQuantizer`` /
``xiq.get_default_x86_inductor_quantization_config``); prints the pass / fail counts of each and
the tests that pass with torchao but not with qviz.

Usage (the test file is not part of qviz; take it from torchao's repository at v0.18.0)::

    git -C ao show v0.18.0:test/quantization/pt2e/test_x86inductor_quantizer.py > /tmp/t.py
    python benchmarks/x86_quantizer_oracle.py /tmp/t.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import types


class _Swap:
    """pytest plugin: qviz's names into the collected test module; records each outcome."""

    def __init__(self, swap: bool) -> None:
        self.swap = swap
        self.outcomes: dict[str, str] = {}

    def pytest_collection_modifyitems(self, session, config, items) -> None:
        if not self.swap:
            return
        import qviz
        from qviz.engine import observers, quantizers

        for module in {item.module for item in items if hasattr(item, "module")}:
            xiq = module.xiq
            proxy = types.SimpleNamespace(**vars(xiq))
            proxy.X86InductorQuantizer = quantizers.X86InductorQuantizer
            proxy.get_default_x86_inductor_quantization_config = (
                quantizers.get_default_x86_inductor_quantization_config
            )
            module.xiq = proxy
            module.X86InductorQuantizer = quantizers.X86InductorQuantizer
            module.prepare_pt2e = qviz.prepare_pt2e
            module.prepare_qat_pt2e = qviz.prepare_qat_pt2e
            module.convert_pt2e = qviz.convert_pt2e
            module.ObserverBase = observers.ObserverBase  # isinstance checks on the observers

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":
            previous = self.outcomes.get(report.nodeid)
            if previous in (None, "passed"):
                self.outcomes[report.nodeid] = report.outcome


def _run(path: str, swap: bool) -> None:
    import pytest

    plugin = _Swap(swap)
    args = [path, "-q", "-p", "no:cacheprovider", "-p", "no:logging"]
    pytest.main(args, plugins=[plugin])
    print("OUTCOMES " + json.dumps(plugin.outcomes))


def _outcomes(path: str, swap: bool) -> dict[str, str]:
    cmd = [sys.executable, __file__, path, "--run", "qviz" if swap else "torchao"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    line = next(x for x in out.splitlines() if x.startswith("OUTCOMES "))
    return json.loads(line[len("OUTCOMES ") :])


def _counts(outcomes: dict[str, str]) -> str:
    kinds = sorted(set(outcomes.values()))
    return ", ".join(f"{sum(v == k for v in outcomes.values())} {k}" for k in kinds)


def main(argv: list[str]) -> int:
    if "--run" in argv:
        _run(argv[0], swap=argv[argv.index("--run") + 1] == "qviz")
        return 0
    path = argv[0]
    ref, ours = _outcomes(path, swap=False), _outcomes(path, swap=True)
    print(f"torchao: {_counts(ref)}")
    print(f"qviz:    {_counts(ours)}")
    lost = sorted(t for t, o in ref.items() if o == "passed" and ours.get(t) != "passed")
    print(f"pass with torchao, not with qviz: {len(lost)}")
    for test in lost:
        print(f"  {test}: {ours.get(test)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
