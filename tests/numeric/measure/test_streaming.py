"""The streaming statistics pass over a large tensor block by block (BLOCK elements, or whole
rows of dim 0 for the slices) without changing what they measure: each figure against a direct
float64 computation over the whole tensor, counts and extremes exactly."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qviz.engine.pt2e.simulation import fake_quantize
from qviz.numeric.measure.slices import SliceStats
from qviz.numeric.measure.streaming import BLOCK, GridStats, PairStats


def _pair(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g)
    return ref, ref + 0.05 * torch.randn(n, generator=g)


@pytest.mark.parametrize("n", [0, 5, BLOCK, BLOCK + 1, 3 * BLOCK + 17])
def test_pair_stats_of_any_size_are_the_direct_figures(n):
    ref, test = _pair(n, n)
    s = PairStats()
    s.update(ref, test)
    r, t = ref.double(), test.double()
    err = t - r
    assert s.count == n
    assert s.max_abs == (float(err.abs().max()) if n else 0.0)
    if n:
        assert s.sqnr == pytest.approx(10 * math.log10(r.square().sum() / err.square().sum()),
                                       rel=1e-6)  # fmt: skip
        assert s.cosine == pytest.approx(float((r * t).sum() / (r.norm() * t.norm())), rel=1e-6)
        assert s.mse == pytest.approx(float(err.square().mean()), rel=1e-5)


def test_a_tensor_up_to_one_block_is_one_block():
    """Up to BLOCK elements the sums are the tensor's own float32 sums, as before blocks."""
    ref, test = _pair(BLOCK, 1)
    s = PairStats()
    s.update(ref, test)
    assert s.err_sq == float(torch.sum((test - ref) * (test - ref)))
    assert s.ref_sq == float(torch.sum(ref * ref))


@pytest.mark.parametrize("n", [7, BLOCK - 1, 2 * BLOCK + 3])
def test_grid_stats_measure_the_converted_models_own_fake_quantize(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 3  # beyond the grid's ends on both sides
    grid = GridStats(scale=0.02, zero_point=-3, quant_min=-128, quant_max=127)
    grid.update(x)
    q = fake_quantize(x, 0.02, -3, -128, 127, torch.int8)
    err = (q - x).double()
    below, above = 0.02 * (-128.5 + 3), 0.02 * (127.5 + 3)
    beyond = (x.double() < below) | (x.double() > above)
    assert grid.count == n and grid.outside == int(beyond.sum()) > 0
    assert (grid.low, grid.high) == (float(x.min()), float(x.max()))
    assert grid.err_sq == pytest.approx(float(err.square().sum()), rel=1e-6)
    assert grid.clip_error.value == pytest.approx(float(err[beyond].square().sum()), rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 5),
    channels=st.integers(1, 6),
    width=st.sampled_from([1, 64, BLOCK // 3, BLOCK + 5]),
    seed=st.integers(0, 2**16),
)
def test_slice_sums_of_any_size_are_the_direct_per_channel_sums(rows, channels, width, seed):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(rows, channels, width, 1, generator=g)
    test = ref + 0.1 * torch.randn(rows, channels, width, 1, generator=g)
    s = SliceStats(channels_first=True)
    s.update(ref, test)
    r, e = ref.double(), test.double() - ref.double()
    direct = torch.cat([r.square().sum((0, 2, 3)), e.square().sum((0, 2, 3)), e.sum((0, 2, 3))])
    assert s.count == ref.numel() and s.sizes == (0, channels)
    assert s.channels.values() == pytest.approx(direct.tolist(), rel=1e-9, abs=1e-9)
