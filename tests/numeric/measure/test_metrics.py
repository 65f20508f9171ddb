"""SQNR and clipped share against hand computations."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qviz.engine.qparams import clip_limits
from qviz.errors import ConfigError
from qviz.numeric import clipped_fraction, sqnr
from qviz.numeric.measure.metrics import histogram_clipped_fraction


def test_sqnr_known_ratio():
    ref = torch.tensor([3.0, 4.0])  # signal power 25
    noisy = ref + torch.tensor([0.3, -0.4])  # noise power 0.25
    assert sqnr(ref, noisy) == pytest.approx(20.0)
    assert sqnr(ref, ref) == math.inf
    assert sqnr(torch.zeros(2), torch.ones(2)) == -math.inf


def test_sqnr_of_uniform_rounding_noise_is_about_6_db_per_bit():
    x = torch.rand(200_000) * 2 - 1
    for bits in (6, 8):
        step = 2 / (2**bits)
        q = torch.round(x / step) * step
        # uniform signal on [-1, 1]: power 1/3; rounding noise: step^2 / 12
        expected = 10 * math.log10((1 / 3) / (step**2 / 12))
        assert sqnr(x, q) == pytest.approx(expected, abs=0.1)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ConfigError, match="shapes"):
        sqnr(torch.ones(3), torch.ones(4))


def test_clipped_fraction():
    x = torch.tensor([[0.5, 2.0], [3.0, -4.0]])
    assert clipped_fraction(x, 2.5) == 0.5
    assert clipped_fraction(x, torch.tensor([[1.0], [5.0]])) == 0.25


def test_clipped_means_beyond_the_last_levels_rounding_boundary():
    # int8 levels 0.1 apart: 12.7 is the last level, 12.75 its rounding boundary
    grid = {"scale": 0.1, "zero_point": 0, "quant_min": -128, "quant_max": 127}
    assert clipped_fraction(torch.tensor([12.7, 12.74, -12.84]), **grid) == 0.0
    assert clipped_fraction(torch.tensor([12.76, -12.86]), **grid) == 1.0
    # the same grid given by amax (tensor toolkit, narrow range): last level amax
    amax = 12.7
    assert clipped_fraction(torch.tensor([12.74, -12.74]), amax) == 0.0
    assert clipped_fraction(torch.tensor([12.76, -12.76]), amax) == 1.0
    # what fake quantization does agrees: clipped values are the ones clamping moves by > step/2
    x = torch.linspace(-14, 14, 2801) + 0.003  # no point on a rounding boundary
    q = torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127)
    assert clipped_fraction(x, **grid) == float(((q - x).abs() > 0.05).double().mean())


def test_clipped_fraction_needs_one_grid():
    with pytest.raises(ConfigError, match="either as amax"):
        clipped_fraction(torch.ones(3))
    with pytest.raises(ConfigError, match="quant_min"):
        clipped_fraction(torch.ones(3), scale=0.1)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    bins=st.integers(1, 64),
    scale=st.floats(0.01, 0.5),
    zero_point=st.integers(-8, 7),
    widen=st.floats(0.0, 0.3),
    atoms=st.booleans(),
)
def test_histogram_clipped_share_brackets_the_raw_values(
    seed, bins, scale, zero_point, widen, atoms
):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2000, generator=g, dtype=torch.float64) * 3
    if atoms:  # values piled on a few points, the extremes among them (image pixels, ReLU6)
        x = torch.round(x).clamp(-4, 4)
    low, high = float(x.min()), float(x.max())
    counts = torch.histc(x, bins, low, high) if high > low else torch.tensor([float(x.numel())])
    edges = torch.linspace(low, high, counts.numel() + 1, dtype=torch.float64)
    grid = {"zero_point": zero_point, "quant_min": -8, "quant_max": 7}
    limits = clip_limits(scale, zero_point, -8, 7)
    exact = clipped_fraction(x, scale=scale, **grid)
    estimate, least, most = histogram_clipped_fraction(counts, edges, *limits)
    assert least <= exact + 1e-12 and exact <= most + 1e-12
    assert least <= estimate <= most
    # a wider grid (larger scale) never shows more clipping
    wider = clip_limits(scale * (1 + widen), zero_point, -8, 7)
    assert histogram_clipped_fraction(counts, edges, *wider)[0] <= estimate + 1e-12
