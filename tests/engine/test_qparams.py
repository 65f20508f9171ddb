"""Integer ranges and scale conventions."""

import pytest
import torch

from qviz.engine.qparams import DTYPE_RANGES, quant_range, symmetric_scale, validate_num_bits
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
