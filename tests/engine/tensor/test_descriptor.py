"""QuantDescriptor: validation, predefined descriptors, equality, serialisation."""

import dataclasses

import pytest
import torch

from qviz.engine.tensor.calib import CalibMethod
from qviz.engine.tensor.descriptor import (
    QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    QUANT_DESC_8BIT_PER_TENSOR,
    QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR,
    QuantDescriptor,
)
from qviz.errors import ConfigError


def test_defaults_match_the_toolkit():
    d = QuantDescriptor()
    assert (d.num_bits, d.name, d.fake_quant, d.axis, d.amax) == (8, None, True, None, None)
    assert (d.unsigned, d.narrow_range, d.calib_method) == (False, False, "max")
    assert QuantDescriptor(num_bits=4, name="w").name == "w"  # num_bits and name may be positional


def test_predefined_descriptors():
    assert QUANT_DESC_8BIT_PER_TENSOR.axis is None
    assert QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR.unsigned
    for d in (
        QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
        QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
        QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
        QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    ):
        assert d.axis == (0,) and d.num_bits == 8


def test_axis_and_method_are_normalised():
    d = QuantDescriptor(axis=[0, 1], calib_method=CalibMethod.ENTROPY)
    assert d.axis == (0, 1)
    assert d.calib_method == "entropy" and d.default_method is CalibMethod.ENTROPY
    assert QuantDescriptor(calib_method="histogram").default_method is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_bits": 1}, "num_bits"),
        ({"calib_method": "kl"}, "use one of 'max', 'percentile', 'entropy', 'mse'"),
        ({"axis": "0"}, "axis"),
        ({"axis": (0, 0)}, "twice"),
        ({"amax": -1.0}, "amax"),
        ({"amax": [1.0, float("inf")]}, "amax"),
        ({"scale_amax": 0}, "scale_amax"),
        ({"name": 3}, "name"),
    ],
)
def test_invalid_fields_raise_config_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        QuantDescriptor(**kwargs)


def test_frozen_equal_hashable_and_serialisable():
    a = QuantDescriptor(num_bits=4, axis=0, amax=[1.0, 2.0])
    b = QuantDescriptor(num_bits=4, axis=(0,), amax=torch.tensor([1.0, 2.0]))
    assert a == b and hash(a) == hash(b)
    assert a != QuantDescriptor(num_bits=4, axis=0, amax=[1.0, 3.0])
    assert {a, b} == {a}
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.num_bits = 8
    assert a.dict() == {"num_bits": 4, "axis": [0], "amax": [1.0, 2.0]}
    assert QuantDescriptor(**{k: v for k, v in a.dict().items()}) == a


def test_amax_is_copied_not_shared():
    amax = torch.tensor([1.0, 2.0])
    d = QuantDescriptor(amax=amax)
    amax.mul_(10)
    assert d.amax.tolist() == [1.0, 2.0]


def test_repr_is_short_and_tensor_free():
    assert repr(QuantDescriptor(num_bits=4, axis=0, calib_method="mse", amax=[0.5, 1.5])) == (
        "QuantDescriptor(num_bits=4, axis=(0,), calib_method='mse', amax=[0.5000, 1.5000](2))"
    )
