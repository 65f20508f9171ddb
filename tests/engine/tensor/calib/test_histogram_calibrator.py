"""HistogramCalibrator: exact counts, exact range growth, and the cases others break on."""

import math
import warnings

import numpy as np
import pytest
import torch

from qviz.engine.tensor.calib import CalibMethod, HistogramCalibrator
from qviz.errors import CalibrationError, ConfigError

METHODS = ["max", "percentile", "entropy", "mse"]


def test_counts_match_numpy_histogram():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(100_000, generator=g)
    calib = HistogramCalibrator(8, num_bins=256)
    calib.collect(x)
    counts, edges = calib.histogram()
    # the range is the smallest power of two covering max |x| (here 4.45 -> 8)
    top = 2.0 ** math.ceil(math.log2(float(x.abs().max())))
    assert float(edges[-1]) == top == 8.0
    ref, ref_edges = np.histogram(x.abs().numpy(), bins=256, range=(0, top))
    assert np.allclose(edges.numpy(), ref_edges)
    # float32 vs float64 bin arithmetic may move a value that sits on an edge by one bin
    assert int(np.abs(counts.numpy() - ref).sum()) <= 4
    assert int(counts.sum()) == x.numel() == calib.num_elements
    assert calib.num_batches == 1


def test_more_than_2_to_the_24_elements_in_one_collect_are_all_counted():
    """Float counters (torch.histc) stop counting at 2^24 per bin; int64 counts do not."""
    n = 2**24 + 1000
    x = torch.zeros(n)
    x[:10] = 1.0
    calib = HistogramCalibrator(8)
    calib.collect(x)
    counts, _ = calib.histogram()
    assert int(counts[0]) == n - 10 and int(counts[-1]) == 10
    assert int(counts.sum()) == n
    # 10 of 16.8M values are 1.0: 99.99999 % must keep them, 99.9999 % may clip them
    assert float(calib.compute_amax("percentile", percentile=99.99999)) == 1.0
    assert float(calib.compute_amax("percentile", percentile=99.9999)) < 0.001


def _right_closed(values: torch.Tensor, n: int, top: float) -> np.ndarray:
    """Direct binning into ``n`` right-closed bins ``(lo, hi]`` of ``[0, top]`` (0 in bin 0)."""
    idx = torch.ceil(values.double().abs() * (n / top)).sub(1).clamp(0, n - 1).long()
    return torch.bincount(idx, minlength=n).numpy()


def test_growing_range_is_exact_and_keeps_the_bin_count():
    """Each growth merges 2^k bins: the result equals binning everything on the final grid,
    count for count, the first batch's max (1.0, on its histogram's top edge) included."""
    n = 2048
    first = torch.arange(1, n + 1, dtype=torch.float32) / n  # max 1.0: range [0, 1]
    first[:-1] -= 0.5 / n  # all but the max at bin centres of [0, 1]
    later = (torch.arange(n, dtype=torch.float32) + 0.5) * (4 / n)  # centres of [0, 4], max < 4
    calib = HistogramCalibrator(8, num_bins=n)
    calib.collect(first)
    calib.collect(later)
    counts, edges = calib.histogram()
    assert counts.numel() == n and float(edges[-1]) == 4.0  # grew by 2^2, bin count unchanged
    assert np.array_equal(counts.numpy(), _right_closed(torch.cat([first, later]), n, 4.0))


def test_the_histogram_does_not_depend_on_the_order_of_the_batches():
    """A value on a histogram's top edge used to be clamped into the last bin and land one bin
    low once the range grew: 1.0 then 1.5 and 1.5 then 1.0 gave different counts. Bins are
    right-closed now, so the top value is in the last bin by the rule and merges exactly."""
    a, b = HistogramCalibrator(8, num_bins=8), HistogramCalibrator(8, num_bins=8)
    for batch in ([1.0], [1.5]):
        a.collect(torch.tensor(batch))
    for batch in ([1.5], [1.0]):
        b.collect(torch.tensor(batch))
    assert torch.equal(a.histogram()[0], b.histogram()[0])
    assert a.histogram()[0].tolist() == [0, 0, 0, 1, 0, 1, 0, 0]  # (0.75, 1] and (1.25, 1.5]


def test_entropy_after_many_collects_of_growing_range():
    calib = HistogramCalibrator(8)
    g = torch.Generator().manual_seed(0)
    for k in range(60):
        calib.collect(torch.randn(2000, generator=g) * 1.25**k)
    counts, _edges = calib.histogram()
    assert counts.numel() == 2048
    assert int(counts.sum()) == 60 * 2000
    amax = calib.compute_amax("entropy")
    assert 0 < float(amax) <= float(calib.compute_amax("max"))


def test_all_zero_tensors():
    calib = HistogramCalibrator(8)
    calib.collect(torch.zeros(100))
    for method in METHODS:
        assert float(calib.compute_amax(method)) == 0.0
    calib.collect(torch.tensor([0.5, -1.0]))  # a later non-zero tensor sets the range
    assert float(calib.compute_amax("max")) == 1.0
    counts, edges = calib.histogram()
    assert int(counts[0]) == 100 and float(edges[-1]) == 1.0


@pytest.mark.parametrize("method", METHODS)
def test_single_value_tensor(method):
    calib = HistogramCalibrator(8)
    calib.collect(torch.full((1000,), -3.0))
    _counts, edges = calib.histogram()
    assert float(calib.compute_amax(method)) == pytest.approx(3.0, abs=float(edges[1]))


def test_negative_only_tensor_is_calibrated_on_magnitudes():
    x = -torch.rand(10_000) - 0.5
    neg, pos = HistogramCalibrator(8), HistogramCalibrator(8)
    neg.collect(x)
    pos.collect(-x)
    for method in METHODS:
        assert torch.equal(neg.compute_amax(method), pos.compute_amax(method))


def test_nan_and_inf_raise_naming_the_tensor():
    calib = HistogramCalibrator(8, name="layer3.conv.input")
    x = torch.randn(10)
    x[2], x[5] = float("nan"), float("inf")
    with pytest.raises(
        CalibrationError, match=r"'layer3.conv.input' got 1 NaN and 1 Inf.*skip_nonfinite"
    ):
        calib.collect(x)
    assert calib.num_batches == 0


def test_nan_skipped_with_a_warning_when_opted_in():
    calib = HistogramCalibrator(8, name="fc.input", skip_nonfinite=True)
    calib.collect(torch.ones(4))
    with pytest.warns(RuntimeWarning, match="'fc.input' skipped 1 NaN"):
        calib.collect(torch.tensor([1.0, float("nan")]))
    assert calib.num_batches == 1 and int(calib.histogram()[0].sum()) == 4


def test_unsigned_rejects_negative_values():
    with pytest.raises(CalibrationError, match="unsigned but got negative"):
        HistogramCalibrator(8, unsigned=True).collect(torch.tensor([-0.1, 1.0]))


def test_skip_zeros_leaves_exact_zeros_out():
    x = torch.relu(torch.randn(10_000))
    calib = HistogramCalibrator(8, skip_zeros=True)
    calib.collect(x)
    assert int(calib.histogram()[0].sum()) == int((x != 0).sum()) == calib.num_elements


def test_mixed_dtypes_and_non_contiguous_inputs():
    base = torch.randn(64, 32)
    ref = HistogramCalibrator(8)
    ref.collect(base.t().contiguous())
    calib = HistogramCalibrator(8)
    calib.collect(base.t())  # a non-contiguous view
    assert torch.equal(calib.histogram()[0], ref.histogram()[0])
    calib.collect(base.double())
    calib.collect(base.half())
    assert calib.num_batches == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_collect_from_two_devices():
    x = torch.randn(1000)
    calib = HistogramCalibrator(8)
    calib.collect(x)
    calib.collect(x.cuda())
    ref = HistogramCalibrator(8)
    ref.collect(x)
    ref.collect(x)
    assert torch.equal(calib.histogram()[0], ref.histogram()[0])
    for method in METHODS:
        assert torch.equal(calib.compute_amax(method), ref.compute_amax(method))


def test_per_channel_histograms_equal_per_tensor_ones():
    x = torch.randn(4, 16, 5, 5) * torch.arange(1, 17).view(1, 16, 1, 1)
    per_channel = HistogramCalibrator(8, axis=1)
    per_channel.collect(x)
    amax = {m: per_channel.compute_amax(m) for m in METHODS}
    assert all(a.shape == (1, 16, 1, 1) for a in amax.values())
    for c in range(16):
        single = HistogramCalibrator(8)
        single.collect(x[:, c])
        assert torch.equal(per_channel.histogram(c)[0], single.histogram()[0])
        for m in METHODS:
            assert float(amax[m].flatten()[c]) == pytest.approx(float(single.compute_amax(m)))


def test_errors_for_misuse():
    calib = HistogramCalibrator(8, axis=0, name="w")
    with pytest.raises(CalibrationError, match="collected no data"):
        calib.compute_amax("entropy")
    calib.collect(torch.randn(4, 3))
    with pytest.raises(CalibrationError, match="same channel count"):
        calib.collect(torch.randn(5, 3))
    with pytest.raises(ConfigError, match="axis=\\(0,\\) but got a 0-d"):
        calib.collect(torch.tensor(1.0))
    with pytest.raises(ConfigError, match="channel=9 is out of range"):
        calib.histogram(9)
    with pytest.raises(ConfigError, match="unknown calibration method 'kl'"):
        calib.compute_amax("kl")
    with pytest.raises(CalibrationError, match="empty tensor"):
        HistogramCalibrator(8).collect(torch.empty(0))
    with pytest.raises(CalibrationError, match="floating-point"):
        HistogramCalibrator(8).collect(torch.ones(3, dtype=torch.int64))
    with pytest.raises(ConfigError, match="num_bins"):
        HistogramCalibrator(8, num_bins=1)


def test_reset_forgets_everything():
    calib = HistogramCalibrator(8)
    calib.collect(torch.randn(100))
    calib.reset()
    assert calib.num_batches == 0
    with pytest.raises(CalibrationError):
        calib.compute_amax(CalibMethod.MAX)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calib.collect(torch.randn(10))  # collecting again after reset is clean


@pytest.mark.parametrize("axis", [None, 0])
def test_the_histogram_does_not_depend_on_the_order_of_the_tensors(axis):
    """The range is the smallest power of two covering the largest |x| seen, so any order of
    the same tensors gives the same counts, range and amax for every method (what lets shards
    calibrated on several processes merge into the single-process histogram)."""
    g = torch.Generator().manual_seed(5)
    tensors = [torch.randn(3, 500, generator=g) * s for s in (0.3, 1.0, 7.0, 0.01, 2.5)]
    calibs = []
    for order in ([0, 1, 2, 3, 4], [2, 4, 3, 0, 1], [3, 0, 1, 4, 2]):
        calib = HistogramCalibrator(8, axis=axis, num_bins=512)
        for i in order:
            calib.collect(tensors[i])
        calibs.append(calib)
    first = calibs[0]
    for other in calibs[1:]:
        for channel in range(3 if axis == 0 else 1):
            a, b = first.histogram(channel), other.histogram(channel)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for method in METHODS:
            assert torch.equal(first.compute_amax(method), other.compute_amax(method)), method
