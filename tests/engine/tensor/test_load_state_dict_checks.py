"""load_state_dict of TensorQuantizers and quant_nn layers: a checkpoint that does not fit is
refused at load, as a QvizError naming the quantizer (or layer and parameter), the shapes and
the fix, instead of loading quietly (a per-channel amax in a per-tensor quantizer, a NaN or
negative amax) or failing with torch's raw RuntimeError."""

import math

import pytest
import torch
from torch import nn

from qviz.engine import quant_nn
from qviz.engine.tensor.tensor_quant import QuantDescriptor, TensorQuantizer
from qviz.errors import ConfigError, QvizError


class Net(nn.Module):
    def __init__(self, out_channels: int = 4, weight_axis=0) -> None:
        super().__init__()
        desc = QuantDescriptor(axis=weight_axis)
        self.conv1 = quant_nn.QuantConv2d(2, out_channels, 3, quant_desc_weight=desc)
        self.fc = quant_nn.QuantLinear(out_channels, 3)

    def forward(self, x):
        return self.fc(self.conv1(x).mean((2, 3)))


def _calibrated(model: nn.Module) -> nn.Module:
    from qviz.engine.tensor.calibrate_quantizers import calibrate_quantizers

    calibrate_quantizers(model, [torch.randn(2, 2, 6, 6)], progress=False)
    return model


# --- 1: an amax whose shape does not fit the quantizer's axis ---------------------------------


def test_per_channel_amax_into_a_per_tensor_quantizer_is_refused_naming_the_path():
    state = _calibrated(Net(weight_axis=0)).state_dict()
    assert state["conv1._weight_quantizer._amax"].shape == (4, 1, 1, 1)
    per_tensor = Net(weight_axis=None)
    with pytest.raises(ConfigError) as info:
        per_tensor.load_state_dict(state)
    text = str(info.value)
    assert "conv1._weight_quantizer" in text and "(4, 1, 1, 1)" in text
    assert "per-tensor" in text and "QuantDescriptor(axis=" in text
    assert per_tensor.conv1.weight_quantizer.amax is None  # nothing half-loaded


def test_one_amax_into_a_per_channel_quantizer_is_shared_by_every_channel():
    source = _calibrated(Net(weight_axis=None))
    target = Net(weight_axis=0)
    target.load_state_dict(source.state_dict())  # what the source computed, said as it is
    assert "axis=(0,) amax=" in repr(target.conv1.weight_quantizer)
    x = torch.randn(1, 2, 6, 6)
    assert torch.equal(target(x), source(x))
    with pytest.raises(ConfigError, match=r"'conv1\._weight_quantizer'.*axis=\(0,\).*\(1, 4\)"):
        Net(weight_axis=0).load_state_dict(
            {**source.state_dict(), **{"conv1._weight_quantizer._amax": torch.ones(1, 4)}}
        )


def test_a_lone_quantizer_is_named_by_its_label():
    tq = TensorQuantizer(QuantDescriptor(name="act"))
    with pytest.raises(ConfigError, match=r"TensorQuantizer 'act'.*\(3,\)"):
        tq.load_state_dict({"_amax": torch.ones(3)})
    assert tq.amax is None


def test_a_calibrated_quantizer_refuses_another_channel_count():
    tq = TensorQuantizer(QuantDescriptor(axis=0), if_calib=True)
    tq(torch.randn(4, 5))
    tq.load_calib_amax()
    with pytest.raises(ConfigError, match=r"\(8, 1\).*\(4, 1\)"):
        tq.load_state_dict({"_amax": torch.ones(8, 1)})


def test_fitting_checkpoints_still_load():
    source = _calibrated(Net())
    target = Net()
    target.load_state_dict(source.state_dict())
    x = torch.randn(1, 2, 6, 6)
    assert torch.equal(target(x), source(x))
    tq = TensorQuantizer()
    tq.load_state_dict({"_amax": torch.tensor([2.0])})  # one value, any shape: per tensor
    assert float(tq.amax) == 2.0


def test_the_amax_setter_checks_the_axis_too():
    tq = TensorQuantizer()
    with pytest.raises(ConfigError, match="per-tensor"):
        tq.amax = torch.ones(4, 1, 1, 1)
    assert tq.amax is None


# --- 2: NaN or negative amax --------------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf])
def test_non_finite_or_negative_amax_is_refused_at_load(bad):
    state = _calibrated(Net()).state_dict()
    state["fc._input_quantizer._amax"] = torch.tensor(bad)
    model = Net()
    with pytest.raises(ConfigError) as info:
        model.load_state_dict(state)
    text = str(info.value)
    assert "fc._input_quantizer" in text and "finite and >= 0" in text and "recalibrate" in text


def test_negative_per_channel_amax_is_refused_naming_it():
    tq = TensorQuantizer(QuantDescriptor(axis=0))
    with pytest.raises(ConfigError, match=r"finite and >= 0.*-0\.5"):
        tq.load_state_dict({"_amax": torch.tensor([[1.0], [-0.5]])})


@pytest.mark.parametrize("bad", [math.nan, -2.0])
def test_the_same_check_guards_the_setter_and_the_descriptor(bad):
    with pytest.raises(ConfigError, match="finite and >= 0"):
        TensorQuantizer().amax = bad
    with pytest.raises(ConfigError, match="finite and >= 0"):
        QuantDescriptor(amax=bad)


# --- 3: a parameter of the wrong shape in a quant_nn layer --------------------------------------


@pytest.mark.parametrize("strict", [True, False])
def test_wrong_weight_shape_names_layer_parameter_shapes_and_fix(strict):
    state = Net(out_channels=5).state_dict()
    model = Net(out_channels=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError) as info:
        model.load_state_dict(state, strict=strict)
    text = str(info.value)
    assert "conv1" in text and "QuantConv2d" in text and "'weight'" in text
    assert "(5, 2, 3, 3)" in text and "(4, 2, 3, 3)" in text
    assert "out_channels" in text or "build" in text
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_a_lone_layer_is_named_by_its_class():
    layer = quant_nn.QuantLinear(4, 3)
    with pytest.raises(QvizError, match=r"QuantLinear.*'bias'.*\(2,\).*\(3,\)"):
        layer.load_state_dict({"weight": torch.zeros(3, 4), "bias": torch.zeros(2)})


def test_missing_and_unexpected_keys_keep_torchs_semantics():
    layer = quant_nn.QuantLinear(4, 3)
    result = layer.load_state_dict({"weight": torch.zeros(3, 4), "extra": 1}, strict=False)
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["extra"]
    assert torch.equal(layer.weight, torch.zeros(3, 4))
    with pytest.raises(RuntimeError, match="Missing key"):
        layer.load_state_dict({"weight": torch.zeros(3, 4)})


# --- found by the fuzzer (test_fuzz_quantizers.py): accepted quietly, or a raw torch error ------


@pytest.mark.parametrize(
    "kwargs",
    [{"fake_quant": 0.5}, {"unsigned": "yes"}, {"narrow_range": None}, {"skip_nonfinite": "no"},
     {"unsigned": 1}, {"scale_amax": True}, {"scale_amax": math.inf}, {"num_bins": 1},
     {"num_bins": "64"}],
)  # fmt: skip
def test_descriptor_refuses_what_it_used_to_carry_along(kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        QuantDescriptor(**kwargs)


def test_an_axis_the_input_lacks_is_refused_not_wrapped():
    layer = quant_nn.QuantConv2d(2, 4, 3, quant_desc_input=QuantDescriptor(axis=5))
    with pytest.raises(ConfigError, match=r"axis=\(5,\).*4 dims"):
        layer(torch.randn(2, 2, 6, 6))  # axis 5 % 4 used to quantize along axis 1


def test_a_descriptor_amax_that_does_not_fit_its_axis_is_refused_by_the_quantizer():
    with pytest.raises(ConfigError, match=r"per-tensor.*\(4,\).*axis=0"):
        TensorQuantizer(QuantDescriptor(amax=[1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(ConfigError, match=r"axis=\(0,\).*\(1, 2, 1, 1\)"):  # per input channel
        TensorQuantizer(QuantDescriptor(axis=0, amax=torch.ones(1, 2, 1, 1)))


def test_a_per_channel_amax_of_another_rank_is_refused():
    layer = quant_nn.QuantLinear(4, 3, quant_desc_weight=QuantDescriptor(axis=0, amax=[1.0] * 3))
    with pytest.raises(QvizError, match=r"\(3,\) has 1 dims.*\(3, 4\) has 2"):
        layer(torch.randn(2, 4))


def test_a_one_value_amax_keeps_the_input_shape():
    tq = TensorQuantizer(QuantDescriptor(amax=torch.ones(1, 1, 1, 1)))
    assert tq(torch.randn(5)).shape == (5,)  # was (1, 1, 1, 5)


def test_an_empty_input_with_a_dynamic_amax_is_a_named_error():
    with pytest.raises(QvizError, match=r"empty tensor of shape \(0,\)"):
        TensorQuantizer()(torch.ones(0))


def test_unknown_load_calib_amax_options_are_named():
    tq = TensorQuantizer(QuantDescriptor(calib_method="entropy"), if_calib=True)
    tq(torch.randn(100))
    with pytest.raises(ConfigError, match=r"\['foo'\].*'percentile', 'start_bin', 'stride'"):
        tq.load_calib_amax("mse", foo=1)
