"""compare(float_model, quant_nn twin, data): one row per quantized layer, matched by name."""

import copy
import dataclasses

import pytest
import torch
from torch import nn

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine import quant_nn
from qviz.engine.tensor.quant_modules import quantize_model
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import ConfigError
from qviz.numeric import compare
from qviz.numeric.compare.report import COLUMNS
from qviz.numeric.measure.metrics import sqnr

LAYERS = ["stem.0", "block.conv1", "block.conv2", "pool", "conv1.0", "conv2.0", "avgpool", "fc"]


def _twin(float_model, bits):
    """quantize_model's copy at ``bits`` for every quantizer, calibrated with max."""
    q = quantize_model(float_model)
    for module in list(q.modules()):
        for attr in ("_input_quantizer", "_weight_quantizer"):
            tq = getattr(module, attr, None)
            if isinstance(tq, TensorQuantizer):
                desc = dataclasses.replace(tq.quant_desc, num_bits=bits)
                setattr(module, attr, TensorQuantizer(desc))
    data = digits_loaders(64).calibration
    qviz.calibrate_quantizers(q, data, "max", max_batches=4, progress=False)
    return q


@pytest.fixture(scope="module")
def setup():
    float_model = digits_model()
    test = [b for _, b in zip(range(3), digits_loaders(64).test, strict=False)]
    return float_model, test, {bits: _twin(float_model, bits) for bits in (8, 4)}


@pytest.fixture(scope="module")
def reports(setup):
    float_model, test, twins = setup
    return {bits: compare(float_model, q, test, progress=False) for bits, q in twins.items()}


def test_one_row_per_quantized_layer_with_the_pt2e_columns(reports):
    df = reports[8].df
    assert list(df.columns) == list(COLUMNS)
    assert list(df["node"]) == LAYERS and list(df["module"]) == LAYERS
    assert list(df["op"])[:4] == ["QuantConv2d", "QuantConv2d", "QuantConv2d", "QuantMaxPool2d"]
    assert reports[8].samples == 192 and reports[8].batches == 3


def test_errors_are_small_at_8_bits_and_larger_at_4(reports):
    eight, four = reports[8].df.set_index("node"), reports[4].df.set_index("node")
    assert (eight["local_sqnr"] > 35).all() and (eight["cumulative_sqnr"] > 30).all()
    assert reports[8].output_sqnr > 35
    for column in ("local_sqnr", "cumulative_sqnr"):
        assert (four[column] < eight[column] - 15).all(), column
    assert reports[4].output_sqnr < reports[8].output_sqnr - 15
    weighted = eight["weight_sqnr"].dropna()
    assert len(weighted) == 6 and (weighted > four["weight_sqnr"].dropna() + 15).all()
    # the error accumulates: the last layer's cumulative error is worse than its own
    assert four.loc["fc", "cumulative_sqnr"] < four.loc["fc", "local_sqnr"]


def test_local_and_weight_figures_match_a_hand_computation(setup, reports):
    float_model, test, twins = setup
    q = twins[4]
    seen = {}
    hook = float_model.fc.register_forward_hook(lambda m, a, o: seen.update(x=a[0], y=o))
    with torch.no_grad():
        float_model(test[0][0])
        hook.remove()
        local = sqnr(seen["y"], q.fc(seen["x"]))  # the quantized fc on the float fc's input
        weight = sqnr(float_model.fc.weight, q.fc._weight_quantizer(q.fc.weight))
    one_batch = compare(float_model, q, [test[0]], progress=False).df.set_index("node")
    assert one_batch.loc["fc", "local_sqnr"] == pytest.approx(local, abs=1e-3)
    assert one_batch.loc["fc", "weight_sqnr"] == pytest.approx(weight, abs=1e-3)
    row = reports[4].df.set_index("node").loc["conv1.0"]
    amax = float(q.conv1[0]._input_quantizer.amax)  # the input quantizer's 4-bit grid
    assert (row["grid_min"], row["grid_max"]) == pytest.approx((-amax * 8 / 7, amax))


def test_the_models_are_left_as_they_were(setup):
    float_model, test, twins = setup
    q = copy.deepcopy(twins[8]).train()
    before = {k: v.clone() for k, v in q.state_dict().items()}
    compare(float_model, q, test[:1], progress=False)
    assert q.training and all(m.training for m in q.modules())
    assert all(torch.equal(before[k], v) for k, v in q.state_dict().items())


def test_a_reused_layer_gets_a_row_per_call_and_the_metric_is_averaged():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(torch.relu(self.fc(x)))

    torch.manual_seed(0)
    model = Twice().eval()
    data = [torch.randn(8, 4) for _ in range(2)]
    q = quantize_model(model)
    qviz.calibrate_quantizers(q, data, progress=False)
    report = compare(model, q, data, progress=False, metric=lambda f, out, t: 1.0)
    assert list(report.df["node"]) == ["fc", "fc@1"] and report.metric == 1.0


def test_mismatched_models_are_config_errors(setup):
    float_model, test, twins = setup
    with pytest.raises(ConfigError, match=r"float model .*quantized_model"):
        compare(twins[8], twins[8], test[:1], progress=False)
    with pytest.raises(ConfigError, match=r"no module 'stem\.0'.*quantize_model"):
        compare(nn.Sequential(), twins[8], test[:1], progress=False)
    calibrating = copy.deepcopy(twins[8])
    calibrating.fc._input_quantizer.enable_calib()
    with pytest.raises(ConfigError, match=r"still calibrating.*fc\._input_quantizer"):
        compare(float_model, calibrating, test[:1], progress=False)
    with pytest.raises(ConfigError, match=r"batch 0 failed in the model"):
        compare(float_model, twins[8], [torch.randn(2, 3)], progress=False)
    layer = quant_nn.QuantLinear(2, 2)
    layer.input_quantizer.disable()
    layer.weight_quantizer.disable()
    with pytest.raises(ConfigError, match="no quantized layer"):
        compare(nn.Linear(2, 2), layer, [torch.ones(1, 2)], progress=False)
