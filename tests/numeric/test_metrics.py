"""SQNR and clipped share against hand computations."""

import math

import pytest
import torch

from qviz.errors import ConfigError
from qviz.numeric import clipped_fraction, sqnr


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
