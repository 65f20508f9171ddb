"""fine_tune on the digits model: 4-bit per-channel weights and 4-bit activations, calibrated,
then fine-tuned with the source document's schedule (10 % of the original 30 epochs, starting
at 1 % of the original learning rate, annealed to 1 % of that)."""

import pytest
import torch
from torch import nn

from qviz.data import digits_loaders, digits_model, evaluate
from qviz.data.train import TrainConfig
from qviz.engine import quant_modules, quant_nn
from qviz.engine.tensor.calibrate_quantizers import calibrate_quantizers
from qviz.engine.tensor.descriptor import QuantDescriptor
from qviz.engine.tensor.fine_tune import fine_tune
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import CalibrationError, ConfigError


def _low_bit_digits(weight_bits: int, input_bits: int) -> nn.Module:
    model = quant_modules.quantize_model(digits_model())
    for layer in model.modules():
        if isinstance(layer, quant_nn.QuantInputMixin):
            layer._input_quantizer = TensorQuantizer(QuantDescriptor(num_bits=input_bits))
        if isinstance(layer, quant_nn.QuantMixin):  # conv and linear weights: axis 0
            layer._weight_quantizer = TensorQuantizer(QuantDescriptor(num_bits=weight_bits, axis=0))
    return model


def _train_loss(model: nn.Module, loader) -> float:
    model.eval()
    with torch.no_grad():
        losses = [nn.functional.cross_entropy(model(x), y, reduction="sum") for x, y in loader]
    return float(sum(losses)) / len(loader.dataset)


@pytest.mark.slow
def test_fine_tuning_recovers_what_4_bit_quantization_lost_with_amax_frozen():
    torch.manual_seed(0)
    loaders = digits_loaders(TrainConfig.batch_size)
    model = _low_bit_digits(4, 4)
    calibrate_quantizers(model, loaders.calibration, method="max", progress=False)
    amax = {n: m.amax.clone() for n, m in model.named_modules() if isinstance(m, TensorQuantizer)}
    loss_before = _train_loss(model, loaders.train)
    history = fine_tune(
        model, loaders.train, epochs=TrainConfig.epochs // 10, lr=TrainConfig.lr / 100,
        eval_data=loaders.test, progress=False,
    )  # fmt: skip
    assert history[0].lr == pytest.approx(TrainConfig.lr / 100)
    assert history[-1].lr < history[0].lr  # cosine annealing
    assert _train_loss(model, loaders.train) < loss_before
    assert evaluate(model, loaders.test) >= evaluate(digits_model(), loaders.test) - 0.01
    for n, m in model.named_modules():
        if isinstance(m, TensorQuantizer):
            assert torch.equal(m.amax, amax[n]), f"{n}: amax changed while frozen"


def test_unfrozen_weights_follow_the_weights_and_activations_stay():
    torch.manual_seed(0)
    model = nn.Sequential(quant_nn.QuantLinear(4, 3))
    data = [(torch.randn(16, 4), torch.randint(0, 3, (16,))) for _ in range(4)]
    calibrate_quantizers(model, data, progress=False)
    act = model[0].input_quantizer.amax.clone()
    fine_tune(model, data, epochs=1, lr=1e-2, freeze_amax=False, progress=False)
    assert model[0].weight_quantizer.amax is None  # dynamic: the max of the current weights
    assert torch.equal(model[0].input_quantizer.amax, act)


def test_fine_tune_refuses_an_uncalibrated_model_and_says_what_to_run():
    model = nn.Sequential(quant_nn.QuantLinear(4, 3))
    data = [(torch.randn(2, 4), torch.tensor([0, 1]))]
    with pytest.raises(CalibrationError, match=r"\['0._input_quantizer'\].*calibrate_quantizers"):
        fine_tune(model, data, epochs=1, lr=1e-3, progress=False)
    with pytest.raises(ConfigError, match=r"got a float Linear.*quantize_model"):
        fine_tune(nn.Linear(4, 3), data, epochs=1, lr=1e-3, progress=False)
    calibrate_quantizers(model, data, progress=False)
    with pytest.raises(ConfigError, match="epoch 1, batch 0 failed"):
        fine_tune(model, [(torch.randn(2, 5), torch.tensor([0, 1]))], epochs=1, lr=1e-3,
                  progress=False)  # fmt: skip
