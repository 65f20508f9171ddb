"""TensorQuantizer: modes, calibration workflow, per-channel shapes, repr, state_dict."""

import pytest
import torch
from torch import nn

from qviz.engine.tensor.calib import HistogramCalibrator, MaxCalibrator
from qviz.engine.tensor.tensor_quant import (
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    QuantDescriptor,
    TensorQuantizer,
    fake_tensor_quant,
    tensor_quant,
)
from qviz.errors import CalibrationError, ConfigError, QuantizationError


def _published_x() -> torch.Tensor:
    torch.manual_seed(12345)
    return torch.rand(10)


def test_repr_of_a_calibrated_quantizer():
    x = _published_x()
    tq = TensorQuantizer(QuantDescriptor(calib_method="percentile"))
    tq.disable_quant()
    tq.enable_calib()
    tq(x)
    tq.load_calib_amax(method="max")
    tq.disable_calib()
    tq.enable_quant()
    assert repr(tq) == (
        "TensorQuantizer(8bit fake per-tensor amax=0.9921 calibrator=HistogramCalibrator quant)"
    )


def test_calibrator_follows_the_method():
    assert isinstance(TensorQuantizer().calibrator, MaxCalibrator)
    for method in ("percentile", "entropy", "mse", "histogram"):
        tq = TensorQuantizer(QuantDescriptor(calib_method=method))
        assert isinstance(tq.calibrator, HistogramCalibrator)


def test_modes():
    x = torch.randn(100)
    tq = TensorQuantizer(disabled=True)
    assert tq(x) is x
    tq.enable()
    tq.disable_quant()
    tq.enable_calib()
    assert tq(x) is x and tq.calibrator.num_batches == 1
    tq.disable_calib()
    tq.enable_quant()
    # no amax loaded: dynamic amax from the input itself
    assert torch.equal(tq(x), fake_tensor_quant(x, x.abs().max(), 8, narrow_range=False))
    assert tq.calibrator.num_batches == 1


def test_calibrate_then_quantize_with_each_method():
    data = [torch.randn(4, 32) * (1 + i / 10) for i in range(5)]
    for method in ("max", "percentile", "entropy", "mse"):
        tq = TensorQuantizer(QuantDescriptor(calib_method=method), if_quant=False, if_calib=True)
        for batch in data:
            tq(batch)
        tq.load_calib_amax()
        ref = HistogramCalibrator() if method != "max" else MaxCalibrator()
        for batch in data:
            ref.collect(batch)
        expected = ref.compute_amax(method)
        assert torch.equal(tq.amax, expected)
        tq.disable_calib()
        tq.enable_quant()
        out = tq(data[0])
        assert torch.equal(out, fake_tensor_quant(data[0], expected, 8, narrow_range=False))


def test_load_calib_amax_passes_method_options():
    x = torch.randn(10_000)
    tq = TensorQuantizer(QuantDescriptor(calib_method="percentile"), if_calib=True)
    tq(x)
    tq.load_calib_amax(percentile=99.0)
    low = tq.amax.clone()
    tq.load_calib_amax(percentile=99.99)
    assert low < tq.amax


def test_per_channel_amax_shapes_for_conv_and_linear_weights():
    conv, linear = nn.Conv2d(3, 16, 3), nn.Linear(20, 7)
    for desc, weight, shape in [
        (QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL, conv.weight, (16, 1, 1, 1)),
        (QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW, linear.weight, (7, 1)),
    ]:
        tq = TensorQuantizer(desc, if_calib=True, if_quant=False)
        tq(weight)
        tq.load_calib_amax()
        assert tq.amax.shape == shape
        reduce = tuple(range(1, weight.dim()))
        assert torch.equal(tq.amax, weight.detach().abs().amax(dim=reduce, keepdim=True))
        # dynamic per-channel amax without calibration gives the same result
        dynamic = TensorQuantizer(desc)
        tq.enable_quant()
        tq.disable_calib()
        assert torch.equal(dynamic(weight), tq(weight))
        assert "axis=(0,)" in repr(tq) and "amax=[" in repr(tq)


def test_histogram_descriptor_needs_an_explicit_method():
    tq = TensorQuantizer(QuantDescriptor(calib_method="histogram"), if_calib=True)
    tq(torch.randn(100))
    with pytest.raises(ConfigError, match=r"load_calib_amax\(method=\.\.\.\)"):
        tq.load_calib_amax()
    tq.load_calib_amax("entropy")
    assert tq.amax is not None


def test_load_before_calibration_is_a_clear_error_naming_the_quantizer():
    tq = TensorQuantizer(QuantDescriptor(name="conv1.input", calib_method="entropy"))
    with pytest.raises(CalibrationError, match=r"'conv1\.input'.*collected no data"):
        tq.load_calib_amax()
    assert tq.amax is None


def test_max_calibrator_rejects_histogram_methods():
    tq = TensorQuantizer(if_calib=True)
    tq(torch.randn(10))
    with pytest.raises(ConfigError, match="HistogramCalibrator"):
        tq.load_calib_amax("entropy")


def test_errors_in_forward_name_the_quantizer():
    tq = TensorQuantizer(QuantDescriptor(name="fc.input", unsigned=True))
    with pytest.raises(QuantizationError, match=r"'fc\.input'.*negative"):
        tq(torch.tensor([-1.0, 1.0]))


def test_integer_mode_returns_levels_and_multiplier():
    x = _published_x()
    tq = TensorQuantizer(QuantDescriptor(fake_quant=False, narrow_range=True))
    q = tq(x)
    ref_q, ref_scale = tensor_quant(x, x.abs().max())
    assert torch.equal(q, ref_q) and torch.equal(tq.scale, ref_scale)


def test_scale_amax_multiplies_the_amax():
    x = torch.linspace(-1, 1, 101)
    tq = TensorQuantizer(QuantDescriptor(amax=1.0, scale_amax=0.5))
    assert torch.equal(tq(x), fake_tensor_quant(x, 0.5, narrow_range=False))


def test_state_dict_round_trip_into_a_fresh_quantizer():
    desc = QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL
    tq = TensorQuantizer(desc, if_calib=True)
    w = torch.randn(8, 4, 3, 3)
    tq(w)
    tq.load_calib_amax()
    fresh = TensorQuantizer(desc)
    assert fresh.amax is None
    fresh.load_state_dict(tq.state_dict())
    assert torch.equal(fresh.amax, tq.amax)
    assert torch.equal(fresh(w), tq(w))


def test_amax_setter_validates():
    tq = TensorQuantizer()
    with pytest.raises(ConfigError, match="amax must be finite"):
        tq.amax = -1.0
    tq.amax = 2.0
    assert tq.amax.item() == 2.0
    tq.amax = None
    assert tq.amax is None


def test_quant_desc_type_checked():
    with pytest.raises(ConfigError, match="QuantDescriptor"):
        TensorQuantizer({"num_bits": 8})


def test_set_calib_method_gives_a_max_quantizer_the_histogram_it_needs():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(3))
    tq = TensorQuantizer()  # max-only
    tq.set_calib_method("entropy")
    tq.disable_quant()
    tq.enable_calib()
    tq(x)
    tq.load_calib_amax()  # the descriptor's method is now entropy
    reference = HistogramCalibrator(8)
    reference.collect(x)
    assert torch.equal(tq.amax, reference.compute_amax("entropy"))
    with pytest.raises(ConfigError, match="unknown calibration method 'kl'"):
        tq.set_calib_method("kl")
