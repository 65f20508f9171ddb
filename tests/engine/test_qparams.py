"""Integer ranges and scale conventions."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qviz.engine.qparams import (
    DTYPE_RANGES,
    FLOAT32_EPS,
    MAX_NUM_BITS,
    affine_qparams,
    bits_of_range,
    quant_range,
    symmetric_scale,
    validate_num_bits,
)
from qviz.errors import ConfigError


@pytest.mark.parametrize(
    ("num_bits", "unsigned", "narrow", "expected"),
    [
        (8, False, False, (-128, 127)),
        (8, False, True, (-127, 127)),
        (8, True, False, (0, 255)),
        (8, True, True, (0, 255)),
        (4, False, False, (-8, 7)),
        (4, False, True, (-7, 7)),
        (2, False, True, (-1, 1)),
        (16, False, False, (-32768, 32767)),
        (1, True, False, (0, 1)),
    ],
)
def test_quant_range(num_bits, unsigned, narrow, expected):
    assert quant_range(num_bits, unsigned=unsigned, narrow_range=narrow) == expected


def test_full_ranges_match_torch_dtypes():
    for dtype, (lo, hi) in DTYPE_RANGES.items():
        info = torch.iinfo(dtype)
        assert (info.min, info.max) == (lo, hi)
    assert quant_range(8) == DTYPE_RANGES[torch.int8]
    assert quant_range(8, unsigned=True) == DTYPE_RANGES[torch.uint8]


@pytest.mark.parametrize("bad", [0, 1, 17, 8.0, True, "8", None])
def test_bad_num_bits_names_the_limits(bad):
    with pytest.raises(ConfigError, match="num_bits"):
        validate_num_bits(bad)


def test_symmetric_scale_is_the_reciprocal_of_the_multiplier():
    amax = torch.tensor([0.5, 2.0, 0.9921])
    assert torch.allclose(symmetric_scale(amax), amax / 127)
    assert symmetric_scale(255.0, unsigned=True) == 1.0


@pytest.mark.parametrize(
    ("quant_min", "quant_max", "bits"),
    [(-128, 127, 8), (0, 255, 8), (-127, 127, 8), (0, 15, 4), (-8, 7, 4), (-1, 1, 2), (0, 1, 1),
     (-32768, 32767, 16), (-(2**31), 2**31 - 1, 32), (0, 0, 0), (-64, 63, 7), (0, 127, 7)],
)  # fmt: skip
def test_bits_of_range(quant_min, quant_max, bits):
    assert bits_of_range(quant_min, quant_max) == bits


@settings(max_examples=200, deadline=None)
@given(num_bits=st.integers(1, MAX_NUM_BITS), unsigned=st.booleans(), narrow=st.booleans())
def test_bits_of_range_inverts_quant_range(num_bits, unsigned, narrow):
    if num_bits == 1 and not unsigned:
        num_bits = 2  # signed grids start at 2 bits
    grid = quant_range(num_bits, unsigned=unsigned, narrow_range=narrow)
    assert bits_of_range(*grid) == num_bits


@settings(max_examples=300, deadline=None)
@given(quant_min=st.integers(-(2**40), 2**40), span=st.integers(0, 2**41))
def test_bits_of_range_is_the_smallest_container(quant_min, span):
    """``b`` bits count the range's steps and ``b - 1`` do not: the smallest container."""
    bits = bits_of_range(quant_min, quant_min + span)
    assert span <= 2**bits - 1
    assert bits == 0 or span > 2 ** (bits - 1) - 1
    if span < 2**50:  # log2 is exact on these integers
        assert bits == math.ceil(math.log2(span + 1))


def test_bits_of_range_accepts_integer_tensors():
    assert bits_of_range(torch.tensor(-8), torch.tensor(7)) == 4


@pytest.mark.parametrize(("quant_min", "quant_max"), [(1, 0), (0.0, 255), (True, 3), ("0", 1)])
def test_bits_of_range_rejects_bad_ranges(quant_min, quant_max):
    with pytest.raises(ConfigError, match="quant_m"):
        bits_of_range(quant_min, quant_max)


def test_affine_qparams_worked_example():
    scale, zero_point = affine_qparams(-1.0, 3.0, -128, 127)
    assert scale == 4 / 255
    assert zero_point == -128 + 64
    assert isinstance(zero_point, int)


def test_affine_qparams_includes_zero_and_clamps():
    assert affine_qparams(0.5, 2.0, 0, 255) == (2.0 / 255, 0)  # [0.5, 2] widened to [0, 2]
    assert affine_qparams(-3.0, -1.0, -128, 127) == (3.0 / 255, 127)  # [-3, 0]: zero at the top


def test_affine_qparams_degenerate_range_gets_eps():
    assert affine_qparams(0.0, 0.0, -128, 127) == (FLOAT32_EPS, -128)
    assert affine_qparams(0.0, 0.0, 0, 255, eps=2**-12) == (2**-12, 0)
    with pytest.raises(ConfigError, match="degenerate"):
        affine_qparams(0.0, 0.0, -128, 127, eps=0.0)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [((math.nan, 1.0, -128, 127), {}, "finite"), ((-1.0, math.inf, -128, 127), {}, "finite"),
     ((-1.0, 1.0, 5, 5), {}, "quant_min"), ((-1.0, 1.0, -128, 127), {"eps": -1.0}, "eps")],
)  # fmt: skip
def test_affine_qparams_rejects_bad_input(args, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        affine_qparams(*args, **kwargs)


_GRIDS = [(torch.int8, -128, 127), (torch.int8, -127, 127), (torch.uint8, 0, 255),
          (torch.int8, -8, 7), (torch.int16, -32768, 32767)]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    grid=st.sampled_from(_GRIDS),
    ends=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=2),
    eps=st.sampled_from([FLOAT32_EPS, 2**-12]),
)
def test_affine_qparams_matches_torchao_in_float64(grid, ends, eps):
    """torchao's observer formula on float64 statistics gives the same scale and zero point."""
    observer = pytest.importorskip("torchao.quantization.pt2e.observer")
    dtype, quant_min, quant_max = grid
    low, high = sorted(ends)
    obs = observer.MinMaxObserver(
        dtype=dtype, qscheme=torch.per_tensor_affine, quant_min=quant_min, quant_max=quant_max,
        eps=eps,
    )  # fmt: skip
    as64 = {"dtype": torch.float64}
    scale, zero_point = obs._calculate_qparams(
        torch.tensor([low], **as64), torch.tensor([high], **as64)
    )
    assert scale.dtype == torch.float64  # (1,)-shaped statistics keep float64 against eps
    assert affine_qparams(low, high, quant_min, quant_max, eps=eps) == (
        scale.item(),
        zero_point.item(),
    )
