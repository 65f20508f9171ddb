"""Time qviz's calibrators side by side with NVIDIA ModelOpt's (the reference implementation).

Run from the repository root (about a minute)::

    .venv/bin/python benchmarks/calibrators.py

Same inputs for both, CPU, 2 threads; each time is the median of several runs after a warm-up,
alternating qviz and reference runs so that other load slows both alike:

1. ``collect`` of a (8, 64, 112, 112) float32 activation (randn, and after ReLU), repeatedly into
   one ``HistogramCalibrator`` / ``MaxCalibrator`` (target: under 30 ms per collect);
2. ``compute_amax`` by entropy and mse (target: under 50 ms each) and percentile on the 2048-bin
   histogram of that activation, with both picks and their distance in bins;
3. 30 collects of (4, 64, 28, 28) batches scaled by ``1.25**k``, then entropy. The reference grows
   its bin count, and its entropy search costs the square of it, so that run is skipped when it
   is estimated to take more than a minute.

ModelOpt 0.47's ``_compute_amax_mse`` passes ``num_bits, unsigned`` positionally into
``fake_tensor_quant``'s ``bias, num_bits`` slots; its mse is timed as shipped, and its pick is
also shown with that call fixed.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from functools import partial
from unittest import mock

import torch
from _machine import Stopwatch, set_threads

LIMIT_S = 60.0  # longest reference entropy search to run in scenario 3
Row = tuple[str, float, float | None, float | None]  # name, qviz ms, reference ms, target ms


def paired_ms(
    fq: Callable[[], object], fr: Callable[[], object] | None, reps: tuple[int, int], warm: int = 1
) -> tuple[float, float | None]:
    """Median ms of qviz's ``fq()`` and the reference's ``fr()`` (None: skipped), alternating."""
    fns = [(fq, reps[0], []), *([(fr, reps[1], [])] if fr is not None else [])]
    for fn, _, _ in fns:
        for _ in range(warm):
            fn()
    for i in range(max(reps)):
        for fn, n, times in fns:
            if i < n:
                with Stopwatch() as watch:
                    fn()
                times.append(watch.seconds)
    q_ms, *r_ms = (statistics.median(times) * 1e3 for _, _, times in fns)
    return q_ms, (r_ms[0] if r_ms else None)


def bench_activation(label: str, x: torch.Tensor, rows: list[Row], notes: list[str]) -> float:
    """Scenarios 1 and 2 on ``x``; returns the reference's entropy time in ms."""
    from modelopt.torch.quantization.calib import HistogramCalibrator as RefHist
    from modelopt.torch.quantization.calib import MaxCalibrator as RefMax
    from modelopt.torch.quantization.calib import histogram as ref_histogram
    from modelopt.torch.quantization.tensor_quant import FakeTensorQuantFunction

    from qviz.engine.calib import HistogramCalibrator, MaxCalibrator

    for q_cls, r_cls in ((HistogramCalibrator, RefHist), (MaxCalibrator, RefMax)):
        q_cal, r_cal = q_cls(), r_cls()
        q_ms, r_ms = paired_ms(partial(q_cal.collect, x), partial(r_cal.collect, x), (15, 15), 2)
        rows.append((f"{label}: {q_cls.__name__}.collect", q_ms, r_ms, 30.0))
    q_max, r_max = float(q_cal.compute_amax()), float(r_cal.compute_amax())
    notes.append(f"{label} max: qviz {q_max:.6f}  reference {r_max:.6f}")

    q, r = HistogramCalibrator(), RefHist()
    q.collect(x)
    r.collect(x)
    counts, edges = q.histogram()
    width = float(edges[1])
    differ = int((counts != r._calib_hist.to(torch.int64)).sum())
    notes.append(f"{label}: bins whose counts differ between the two histograms: {differ} of 2048")

    def fixed_fake_quant(x: torch.Tensor, amax: torch.Tensor, bits: int, uns: bool) -> torch.Tensor:
        return FakeTensorQuantFunction.apply(x, amax, None, bits, uns)

    ref_entropy_ms = 0.0
    for method, reps, target in (("entropy", 2, 50.0), ("mse", 3, 50.0), ("percentile", 5, None)):
        fq, fr = partial(q.compute_amax, method), partial(r.compute_amax, method)
        q_ms, r_ms = paired_ms(fq, fr, (10, reps), warm=int(method != "entropy"))
        rows.append((f"{label}: compute_amax({method!r})", q_ms, r_ms, target))
        ref_entropy_ms = r_ms if method == "entropy" else ref_entropy_ms
        q_amax, r_amax = float(fq()), float(fr())
        note = f"{label} {method}: qviz {q_amax:.6f}  reference {r_amax:.6f}"
        note += f"  ({(q_amax - r_amax) / width:+.2f} bins)"
        if method == "mse":
            with mock.patch.object(ref_histogram, "fake_tensor_quant", fixed_fake_quant):
                r_fixed = float(fr())
            note += f"; reference with the call fixed {r_fixed:.6f}"
            note += f"  ({(q_amax - r_fixed) / width:+.2f} bins)"
        notes.append(note)
    return ref_entropy_ms


def bench_growing(rows: list[Row], notes: list[str], ref_entropy_ms_2048: float) -> None:
    """Scenario 3: 30 collects whose range grows by 1.25x each, then entropy."""
    from modelopt.torch.quantization.calib import HistogramCalibrator as RefHist

    from qviz.engine.calib import HistogramCalibrator

    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(4, 64, 28, 28, generator=gen) * 1.25**k for k in range(30)]
    cals: dict[type, object] = {}

    def collect_all(cls: type) -> None:
        cals[cls] = cal = cls()
        for batch in batches:
            cal.collect(batch)

    fq, fr = partial(collect_all, HistogramCalibrator), partial(collect_all, RefHist)
    q_ms, r_ms = paired_ms(fq, fr, (3, 3))
    rows.append(("growing: 30 collects (total)", q_ms, r_ms, None))
    q, r = cals[HistogramCalibrator], cals[RefHist]
    r_bins = len(r._calib_hist)
    notes.append(f"growing: bins at the end: qviz {q.num_bins}  reference {r_bins}")
    estimate_s = ref_entropy_ms_2048 / 1e3 * (r_bins / 2048) ** 2
    fr = partial(r.compute_amax, "entropy") if estimate_s <= LIMIT_S else None
    q_ms, r_ms = paired_ms(partial(q.compute_amax, "entropy"), fr, (10, 1), warm=0)
    rows.append(("growing: compute_amax('entropy')", q_ms, r_ms, 50.0))
    q_amax = float(q.compute_amax("entropy"))
    r_note = f"{float(fr()):.4f}" if fr else f"skipped: {r_bins} bins, est. {estimate_s:,.0f} s"
    notes.append(f"growing entropy: qviz {q_amax:.4f}  reference {r_note}")
    q_pct, r_pct = float(q.compute_amax("percentile")), float(r.compute_amax("percentile"))
    notes.append(f"growing percentile: qviz {q_pct:.4f}  reference {r_pct:.4f}")


def print_table(rows: list[Row]) -> None:
    print(f"{'measurement':<44} {'qviz ms':>9} {'ref ms':>10} {'ref/qviz':>9}  target")
    for name, q_ms, r_ms, target in rows:
        ref = f"{r_ms:10.2f} {r_ms / q_ms:8.1f}x" if r_ms is not None else f"{'skipped':>10} {'':9}"
        verdict = f"<{target:.0f} ms {'PASS' if q_ms < target else 'FAIL'}" if target else ""
        print(f"{name:<44} {q_ms:9.2f} {ref}  {verdict}")


def main() -> None:
    set_threads(2)
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load:.2f}")
    x = torch.randn(8, 64, 112, 112, generator=torch.Generator().manual_seed(0))
    rows: list[Row] = []
    notes: list[str] = []
    ref_entropy_ms = bench_activation("randn", x, rows, notes)
    bench_activation("relu", torch.relu(x), rows, notes)
    bench_growing(rows, notes, ref_entropy_ms)
    print_table(rows)
    print(f"load average at the end {os.getloadavg()[0]:.2f} (other processes skew timings)")
    print("\npicked amax (percentile: qviz takes the bin's upper edge, the reference its lower)")
    for note in notes:
        print("  " + note)


if __name__ == "__main__":
    main()
