"""bias_correction: an exactly known weight-error shift removed; digits at 4-bit per-tensor
weights gets closer to the float model."""

import pytest
import torch
from torch import nn
from torch.fx import Interpreter

import qviz
from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.pt2e.plan import TRANSFORMS_KEY
from qviz.engine.quantizers import get_symmetric_quantization_config
from qviz.engine.repair import bias_correction
from qviz.errors import ConfigError
from qviz.numeric.measure.metrics import sqnr
from tests.helpers.quantize import quantize
from tests.helpers.residual import Residual

FOUR_BIT = get_symmetric_quantization_config(is_per_channel=False, weight_qmin=-8, weight_qmax=7)


def _known_shift_model(bias: bool):
    """A linear whose 4-bit per-tensor weights have a known rounding error: max |W| = 7.5 makes
    the scale 1, every other entry is k + 0.25 (rounds to k: error -0.25) and the 7.5 clamps
    to 7 (error -0.5); inputs with mean exactly 1.5 per feature."""
    weight = torch.tensor(
        [[7.5, -2.75, 1.25, 0.25], [3.25, -0.75, -3.75, 2.25], [-1.75, 0.25, 2.25, -2.75]]
    )
    error = torch.full_like(weight, -0.25)
    error[0, 0] = -0.5
    linear = nn.Linear(4, 3, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias:
            linear.bias.copy_(torch.tensor([0.5, -1.0, 2.0]))
    gen = torch.Generator().manual_seed(0)
    levels = torch.tensor([0.0, 1.0, 2.0, 3.0]).repeat(16)  # 64 rows: mean 1.5 exactly
    x = torch.stack([levels[torch.randperm(64, generator=gen)] for _ in range(4)], dim=1)
    return nn.Sequential(linear).eval(), x, error


@pytest.mark.parametrize("reference", ["float", "quantized"])
@pytest.mark.parametrize("bias", [True, False])
def test_a_known_weight_error_shift_is_removed(reference, bias):
    model, x, error = _known_shift_model(bias)
    gm = qviz.export(model, (x,))
    converted = quantize(gm, x, config=FOUR_BIT).converted
    scales = [n.args[1] for n in converted.graph.nodes if "dequantize" in str(n.target)]
    assert 1.0 in scales  # the weight's scale, as designed
    # the input as the converted model quantizes it (its observer is a histogram one)
    quantize_op = torch.ops.quantized_decomposed.quantize_per_tensor.default
    q_input = next(n for n in converted.graph.nodes if n.target == quantize_op)
    x_scale, x_zp = q_input.args[1:3]
    x_q = torch.fake_quantize_per_tensor_affine(x, x_scale, x_zp, -128, 127)
    weight = model[0].weight.detach()
    if reference == "quantized":  # E[(W~ - W) x~]
        shift = error @ x_q.mean(0)
    else:  # E[W~ x~] - E[W x]: the input's rounding too
        shift = (weight + error) @ x_q.mean(0) - weight @ torch.full((4,), 1.5)
    corrected = bias_correction(converted, gm, x, reference=reference)
    linear = next(n for n in corrected.graph.nodes if n.target == torch.ops.aten.linear.default)
    new_bias = get_attr_value(corrected, linear.args[2])
    old_bias = model[0].bias.detach() if bias else torch.zeros(3)
    torch.testing.assert_close(new_bias, old_bias - shift, rtol=0, atol=1e-5)
    (record,) = corrected.meta[TRANSFORMS_KEY]
    params = dict(record.params)
    assert record.kind == "bias_correction" and record.nodes == ("linear",)
    assert params["max_shift_before"] == pytest.approx(float(shift.abs().max()), abs=1e-5)
    assert params["max_shift_after"] < 1e-5
    # the converted model is untouched
    untouched = next(n for n in converted.graph.nodes if n.target == torch.ops.aten.linear.default)
    assert (len(untouched.args) > 2 and untouched.args[2] is not None) == bias
    if bias:
        assert torch.equal(get_attr_value(converted, untouched.args[2]), model[0].bias.detach())


class _Capture(Interpreter):
    """Every node's value, by name."""

    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, n):
        self.values[n.name] = out = super().run_node(n)
        return out


def _means(gm, x, names):
    cap = _Capture(gm)
    with torch.no_grad():
        cap.run(x)
    return {k: cap.values[k].double().transpose(0, 1).flatten(1).mean(1) for k in names}


def test_layers_are_corrected_in_order_so_every_mean_is_the_floats():
    """Measured all at once, the later layers' shifts would include the earlier ones' (not yet
    corrected); layer by layer, every layer's output mean ends at the float model's."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1)
    ).eval()
    x = torch.randn(32, 3, 8, 8)
    gm = qviz.export(model, (x,))
    converted = quantize(gm, x, config=FOUR_BIT).converted
    corrected = bias_correction(converted, gm, x)
    names = ["conv2d", "conv2d_1", "conv2d_2"]
    ref, before, after = (_means(m, x, names) for m in (gm, converted, corrected))
    for name in names:
        assert float((before[name] - ref[name]).abs().max()) > 1e-3, name
        torch.testing.assert_close(after[name], ref[name], rtol=0, atol=1e-5)
    assert [r.nodes[0] for r in corrected.meta[TRANSFORMS_KEY]] == names


def test_it_takes_a_converted_model_and_its_float_graph():
    model, x, _ = _known_shift_model(True)
    gm = qviz.export(model, (x,))
    converted = quantize(gm, x, config=FOUR_BIT).converted
    with pytest.raises(ConfigError, match="convert_pt2e"):
        bias_correction(gm, gm, x)
    with pytest.raises(ConfigError, match="float"):
        bias_correction(converted, converted, x)
    with pytest.raises(ConfigError, match="reference"):
        bias_correction(converted, gm, x, reference="both")


@pytest.mark.slow
def test_digits_at_4_bit_weights_gets_closer_to_float():
    from qviz.data import digits_loaders, digits_model, evaluate

    loaders = digits_loaders(batch_size=64)
    example = next(iter(loaders.calibration))[0]
    gm = qviz.export(digits_model(), (example,), dynamic_batch=True)
    converted = quantize(gm, loaders.calibration, config=FOUR_BIT).converted
    test = torch.cat([images for images, _ in loaders.test])
    with torch.no_grad():
        reference = gm(test)
        db_before = sqnr(reference, converted(test))
        corrected = bias_correction(converted, gm, loaders.calibration)
        db_after = sqnr(reference, corrected(test))
        weight_only = bias_correction(converted, gm, loaders.calibration, reference="quantized")
        db_weight_only = sqnr(reference, weight_only(test))
    # measured: 16.4 dB -> 22.4 dB (float reference), 20.7 dB (weight error only)
    assert db_after > db_before + 3 and db_weight_only > db_before + 2
    assert evaluate(corrected, loaders.test) >= evaluate(converted, loaders.test)
    assert len(corrected.meta[TRANSFORMS_KEY]) == 6


def test_in_place_ops_after_a_layer_do_not_change_what_is_measured():
    """The in-place model computes the same function as the out-of-place one, so its
    corrections are the same: each layer's output is measured before ``add_`` / ``relu_``
    write into it."""
    torch.manual_seed(0)
    functional = Residual(inplace=False).eval()
    inplace = Residual(inplace=True).eval()
    inplace.load_state_dict(functional.state_dict())
    x = torch.randn(32, 4, 8, 8)
    biases = []
    for model in (functional, inplace):
        gm = qviz.export(model, (x,))
        assert any(n.target == torch.ops.aten.add_.Tensor for n in gm.graph.nodes) == (
            model.inplace
        )
        corrected = bias_correction(quantize(gm, x, config=FOUR_BIT).converted, gm, x)
        layers = [n for n in corrected.graph.nodes if n.target == torch.ops.aten.conv2d.default]
        biases.append([get_attr_value(corrected, n.args[2]) for n in layers])
    for a, b in zip(*biases, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
