"""get_symmetric_quantization_config against torchao's, and check_config."""

from __future__ import annotations

import pytest
import torch

from qviz.engine.observers import ObserverFactory
from qviz.engine.quantizers import get_symmetric_quantization_config
from qviz.engine.quantizers.config import check_config
from qviz.errors import ConfigError

ref = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")


def _fields(spec) -> tuple | None:
    if spec is None:
        return None
    ctr = spec.observer_or_fake_quant_ctr
    observer = (ctr.p.func.__name__, dict(ctr.p.keywords))
    return (
        spec.dtype,
        spec.quant_min,
        spec.quant_max,
        spec.qscheme,
        spec.ch_axis,
        spec.is_dynamic,
        observer,
    )


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"is_per_channel": True}, {"is_dynamic": True}, {"act_qmin": -127, "weight_qmin": -128}],
)
def test_config_matches_reference(kwargs) -> None:
    ours, theirs = (
        get_symmetric_quantization_config(**kwargs),
        ref.get_symmetric_quantization_config(**kwargs),
    )
    for field in ("input_activation", "output_activation", "weight", "bias"):
        assert _fields(getattr(ours, field)) == _fields(getattr(theirs, field)), field
    assert ours.is_qat is theirs.is_qat is False
    assert isinstance(ours.weight.observer_or_fake_quant_ctr, ObserverFactory)  # qviz observers
    assert get_symmetric_quantization_config(**kwargs) is ours


def test_dynamic_activation_is_a_placeholder_with_no_output_spec() -> None:
    config = get_symmetric_quantization_config(is_dynamic=True)
    assert config.input_activation.observer_or_fake_quant_ctr.__name__ == "PlaceholderObserver"
    assert config.input_activation.is_dynamic and config.output_activation is None


def _named(spec) -> tuple | None:
    """``_fields`` with the observer classes passed as arguments replaced by their names."""
    fields = _fields(spec)
    if fields is None:
        return None
    name, kwargs = fields[-1]
    return (*fields[:-1], (name, {k: _name(v) for k, v in kwargs.items()}))


def _name(value):
    partial = getattr(value, "p", None)  # a constructor with bound arguments
    if partial is not None:
        return partial.func.__name__, dict(partial.keywords)
    return getattr(value, "__name__", value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"is_qat": True},
        {"is_qat": True, "is_per_channel": True},
        {"is_qat": True, "is_dynamic": True},
    ],
)
def test_qat_config_matches_reference(kwargs) -> None:
    ours, theirs = (
        get_symmetric_quantization_config(**kwargs),
        ref.get_symmetric_quantization_config(**kwargs),
    )
    for field in ("input_activation", "output_activation", "weight", "bias"):
        assert _named(getattr(ours, field)) == _named(getattr(theirs, field)), field
    assert ours.is_qat is theirs.is_qat is True


def test_qat_config_refuses_switchable() -> None:
    with pytest.raises(ConfigError, match="switchable"):
        get_symmetric_quantization_config(is_qat=True, switchable=True)


def test_flags_after_is_per_channel_are_keyword_only() -> None:
    """torchao's order is (is_per_channel, is_qat, is_dynamic): positional calls would differ."""
    with pytest.raises(TypeError):
        get_symmetric_quantization_config(True, True)  # type: ignore[misc]


def test_ranges_are_checked() -> None:
    with pytest.raises(ConfigError, match="quant_min 5 must be <= quant_max 1"):
        get_symmetric_quantization_config(act_qmin=5, act_qmax=1)
    with pytest.raises(ConfigError, match=r"does not fit torch\.int8"):
        get_symmetric_quantization_config(weight_qmax=300)


def test_check_config_accepts_none_only_where_allowed() -> None:
    check_config(None, "set_global")
    with pytest.raises(ConfigError, match="expected a QuantizationConfig"):
        check_config(None, "x", allow_none=False)
    with pytest.raises(ConfigError, match=r"torch\.per_tensor_affine"):
        config = get_symmetric_quantization_config()
        check_config(
            type(config)(config.input_activation, None, config.input_activation, None), "x"
        )
    assert torch.int8 == get_symmetric_quantization_config().weight.dtype
