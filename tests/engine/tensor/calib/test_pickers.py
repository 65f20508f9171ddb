"""amax pickers against independent computations on known distributions, and NVIDIA's code.

The reference oracle is nvidia-modelopt's calibration module (the successor of NVIDIA's
pytorch-quantization): its pure amax functions are fed exactly the same histograms as qviz's.
"""

import numpy as np
import pytest
import torch

from qviz.engine.tensor.calib import HistogramCalibrator
from qviz.engine.tensor.calib.pickers import entropy_amax, mse_amax, percentile_amax
from qviz.engine.tensor.tensor_quant import fake_tensor_quant
from qviz.errors import ConfigError

ref_hist = pytest.importorskip("modelopt.torch.quantization.calib.histogram")


def _samples(kind: str, n: int = 200_000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(n, generator=g)
    if kind == "uniform":
        return torch.rand(n, generator=g) * 2 - 1
    if kind == "laplace":
        u = torch.rand(n, generator=g) - 0.5
        return -torch.sign(u) * torch.log1p(-2 * u.abs())
    if kind == "student_t2":  # heavy-tailed: finite mean, infinite variance
        z = torch.randn(n, generator=g)
        chi2 = torch.randn(n, 2, generator=g).square().sum(1)
        return z / torch.sqrt(chi2 / 2)
    if kind == "relu":
        return torch.relu(torch.randn(n, generator=g))
    raise ValueError(kind)


def _calibrated(x: torch.Tensor, **kwargs) -> HistogramCalibrator:
    calib = HistogramCalibrator(8, **kwargs)
    calib.collect(x)
    return calib


KINDS = ["normal", "uniform", "laplace", "student_t2", "relu"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pct", [90.0, 99.0, 99.9, 99.99])
def test_percentile_within_one_bin_of_numpy(kind, pct):
    """numpy's inverted-CDF percentile is the smallest sample with p % of the data at or below it:
    the definition qviz implements on the histogram, so the two are within one bin width.

    n is chosen so that n * p / 100 is never an integer: there numpy's float product
    (200000 * 0.9999 = 199980.00000000003) takes the next sample; see the exact-rank test."""
    x = _samples(kind, n=200_003)
    calib = _calibrated(x)
    amax = float(calib.compute_amax("percentile", percentile=pct))
    _counts, edges = calib.histogram()
    width = float(edges[1] - edges[0])
    expected = float(np.percentile(x.abs().numpy(), pct, method="inverted_cdf"))
    assert expected <= amax + 1e-6 and amax - expected <= width
    # it never clips more than the share the percentile gives up
    assert float((x.abs() > amax).float().mean()) <= 1 - pct / 100 + 1e-9


def test_percentile_at_an_exact_rank():
    """99.9 % of 10,000 values is exactly the 9,990th: no float slip to the 9,991st."""
    x = ((torch.arange(1, 10_001, dtype=torch.float64) - 0.5) / 10_000).float()
    x[-1] = 1.0  # range exactly 1: bin edges k / 10000, every other value at a bin centre
    calib = HistogramCalibrator(8, num_bins=10_000)
    calib.collect(x)
    amax = float(calib.compute_amax("percentile", percentile=99.9))
    assert amax == pytest.approx(0.9990, abs=1e-6)  # the 9,991st value would give 0.9991
    assert int((x <= amax).sum()) == 9_990


@pytest.mark.parametrize("kind", KINDS)
def test_percentile_is_one_bin_above_nvidias_left_edge(kind):
    calib = _calibrated(_samples(kind))
    counts, edges = calib.histogram()
    ref = float(ref_hist._compute_amax_percentile(counts.numpy(), edges.numpy(), 99.9))
    ours = float(calib.compute_amax("percentile", percentile=99.9))
    width = float(edges[1] - edges[0])
    # same bin, upper instead of lower edge; the reference's float CDF can land one bin later
    assert ref - 1e-5 <= ours <= min(ref + width, float(calib.compute_amax("max"))) + 1e-5


@pytest.mark.parametrize("kind", ["normal", "laplace", "student_t2"])
@pytest.mark.parametrize("num_bits", [4, 8])
def test_mse_matches_a_brute_force_search_on_the_data(kind, num_bits):
    x = _samples(kind, n=50_000)
    calib = HistogramCalibrator(num_bits)
    calib.collect(x)
    amax = float(calib.compute_amax("mse"))
    candidates = torch.linspace(0.05, 1.0, 400) * float(x.abs().max())

    def mse(a: float) -> float:
        return float((fake_tensor_quant(x, a, num_bits) - x).square().mean())

    best = min(mse(float(a)) for a in candidates)
    # the search runs on bin centres, not samples: within 2 % of the brute-force optimum
    assert mse(amax) <= best * 1.02


def _reference_mse_amax(counts, edges, num_bits: int, start_bin: int = 128) -> float:
    """NVIDIA's mse search, with the argument slip of modelopt 0.47 corrected (watched in
    tests/upstream/test_modelopt.py)."""
    from modelopt.torch.quantization.tensor_quant import fake_tensor_quant as ref_fq

    counts = counts.float()
    edges = edges.float()
    centers = (edges[1:] + edges[:-1]) / 2
    mses = []
    for i in range(start_bin, len(centers)):
        quant = ref_fq(centers, centers[i], None, num_bits, False)  # bias=None, then num_bits
        mses.append(float(((quant - centers) ** 2 * counts).mean()))
    return float(centers[start_bin + int(np.argmin(mses))])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_bits", [4, 8])
def test_mse_agrees_with_nvidia(kind, num_bits):
    calib = HistogramCalibrator(num_bits)
    calib.collect(_samples(kind, n=50_000))
    counts, edges = calib.histogram()
    ref = _reference_mse_amax(counts, edges, num_bits)
    ours = float(calib.compute_amax("mse"))
    # same candidates; the reference's float32 sums can swap near-equal minima by a bin or two
    assert abs(ours - ref) <= 2 * float(edges[1] - edges[0])


def test_qviz_mse_search_picks_the_max_on_uniform_data():
    """On uniform data the MSE optimum is the max: qviz's search finds it (the reference's
    search is broken in the installed release: tests/upstream/test_modelopt.py)."""
    calib = _calibrated(_samples("uniform", n=50_000))
    assert float(calib.compute_amax("mse")) > 0.98 * float(calib.compute_amax("max"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_bits", [4, 8])
def test_entropy_agrees_with_nvidia(kind, num_bits):
    """The closed-form KL search picks the same threshold as the reference's bin-by-bin loop."""
    calib = HistogramCalibrator(num_bits, num_bins=512)  # the reference loop is slow
    calib.collect(_samples(kind, n=50_000))
    counts, edges = calib.histogram()
    ref = float(
        ref_hist._compute_amax_entropy(counts.numpy().copy(), edges.numpy(), num_bits, False, 1, 32)
    )
    ours = float(calib.compute_amax("entropy", start_bin=32))
    # no method returns an amax above the largest |x| seen; the reference's edge can lie above
    ref = min(ref, float(calib.compute_amax("max")))
    assert ours == pytest.approx(ref, rel=1e-6)  # the same bin edge, float32 vs float64


def test_entropy_clips_heavy_tails_and_keeps_uniform_data():
    heavy = _calibrated(_samples("student_t2"))
    assert float(heavy.compute_amax("entropy")) < 0.25 * float(heavy.compute_amax("max"))
    uniform = _calibrated(_samples("uniform"))
    assert float(uniform.compute_amax("entropy")) > 0.95 * float(uniform.compute_amax("max"))


def test_entropy_does_not_change_the_histogram():
    calib = _calibrated(_samples("relu"))
    before = calib.histogram()[0].clone()
    calib.compute_amax("entropy")
    assert torch.equal(calib.histogram()[0], before)


def test_pickers_work_row_by_row():
    a, b = _samples("normal", 10_000, 1), _samples("laplace", 10_000, 2) * 3
    both = HistogramCalibrator(8, axis=0)
    both.collect(torch.stack([a, b]))
    for method in ("percentile", "entropy", "mse"):
        rows = both.compute_amax(method).flatten()
        for i, x in enumerate((a, b)):
            assert float(rows[i]) == pytest.approx(float(_calibrated(x).compute_amax(method)))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c, r: percentile_amax(c, r, 0.0), "percentile"),
        (lambda c, r: percentile_amax(c, r, 100.5), "percentile"),
        (lambda c, r: entropy_amax(c, r, start_bin=5000), "start_bin"),
        (lambda c, r: mse_amax(c, r, stride=0), "stride"),
        (lambda c, r: mse_amax(c[0], r), "histograms must be"),
    ],
)
def test_bad_search_arguments(call, match):
    counts = torch.ones(1, 2048, dtype=torch.int64)
    with pytest.raises(ConfigError, match=match):
        call(counts, torch.tensor([1.0]))
