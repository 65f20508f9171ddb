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


def _calibrated_linear(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(quant_nn.QuantLinear(4, 3))
    data = [(torch.randn(16, 4), torch.randint(0, 3, (16,))) for _ in range(4)]
    calibrate_quantizers(model, data, progress=False)
    return model, data


def _state(model: nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_state_equal(model: nn.Module, before: dict) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), f"{k} changed"


def test_a_nan_loss_stops_naming_the_batch_and_leaves_the_model_as_before_that_step():
    model, data = _calibrated_linear()
    bad = list(data)
    bad[2] = (torch.full((16, 4), float("nan")), bad[2][1])
    reference = _calibrated_linear()[0]  # the same model, trained on batches 0 and 1 only
    torch.manual_seed(1)
    fine_tune(reference, data[:2], epochs=1, lr=1e-2, progress=False)
    torch.manual_seed(1)
    with pytest.raises(CalibrationError, match=r"epoch 1, batch 2.*non-finite loss nan"):
        fine_tune(model, bad, epochs=1, lr=1e-2, progress=False)
    _assert_state_equal(model, _state(reference))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_an_infinite_learning_rate_is_refused_before_any_step():
    model, data = _calibrated_linear()
    before = _state(model)
    with pytest.raises(ConfigError, match=r"lr must be a positive finite number"):
        fine_tune(model, data, epochs=1, lr=float("inf"), progress=False)
    _assert_state_equal(model, before)


@pytest.mark.parametrize("freeze_amax", [True, False])
def test_a_failing_batch_restores_parameters_and_calibrated_amax(freeze_amax):
    model, data = _calibrated_linear()
    before = _state(model)
    amax = model[0].weight_quantizer.amax.clone()
    bad = [(torch.randn(16, 5), torch.randint(0, 3, (16,))), *data]  # wrong width: batch 0
    with pytest.raises(ConfigError, match="epoch 1, batch 0 failed"):
        fine_tune(model, bad, epochs=1, lr=1e-2, freeze_amax=freeze_amax, progress=False)
    _assert_state_equal(model, before)
    assert torch.equal(model[0].weight_quantizer.amax, amax)


def test_a_non_finite_loss_from_the_loss_function_is_refused_and_restored():
    model, data = _calibrated_linear()
    before = _state(model)
    calls = []

    def loss_fn(out, target):
        calls.append(1)
        loss = nn.functional.cross_entropy(out, target)
        return loss * float("inf") if len(calls) == 3 else loss

    with pytest.raises(CalibrationError, match=r"epoch 2, batch 0.*non-finite loss inf"):
        fine_tune(model, data[:2], epochs=2, lr=1e-2, loss_fn=loss_fn, progress=False)
    assert not torch.equal(model[0].weight, before["0.weight"])  # epoch 1 is kept
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epochs": True}, r"epochs must be a positive int.*got True"),
        ({"epochs": 2.0}, r"epochs must be a positive int"),
        ({"lr": float("nan")}, r"lr must be a positive finite number"),
        ({"lr": True}, r"lr must be a positive finite number"),
        (
            {"optimizer": "adam"},
            r"optimizer must be a torch.optim.Optimizer class.*torch.optim.Adam",
        ),
        ({"weight_decay": -1}, r"weight_decay must be a finite number >= 0.*got -1"),
        ({"eta_min": -1.0}, r"eta_min must be a finite number >= 0"),
        ({"loss_fn": "mse"}, r"loss_fn must be a callable"),
        ({"freeze_amax": "no"}, r"freeze_amax must be True or False"),
    ],
)
def test_bad_arguments_are_config_errors_naming_the_argument(kwargs, match):
    model, data = _calibrated_linear()
    before = _state(model)
    args = {"epochs": 1, "lr": 1e-2, "progress": False, **kwargs}
    with pytest.raises(ConfigError, match=match):
        fine_tune(model, data, **args)
    _assert_state_equal(model, before)


def test_unlabelled_batches_are_a_config_error_naming_the_batch():
    model, data = _calibrated_linear()
    before = _state(model)
    with pytest.raises(ConfigError, match=r"fine_tune: epoch 1, batch 0 has no target"):
        fine_tune(model, [x for x, _ in data], epochs=1, lr=1e-2, progress=False)
    _assert_state_equal(model, before)


def test_a_step_that_overflows_the_weights_is_undone_and_named():
    model, data = _calibrated_linear()
    before = _state(model)
    with pytest.raises(CalibrationError, match=r"epoch 1, batch 0: the step made parameters"):
        fine_tune(model, data, epochs=1, lr=1e10, optimizer=torch.optim.SGD,
                  loss_fn=lambda out, y: nn.functional.cross_entropy(out, y) * 1e30,
                  progress=False)  # fmt: skip
    _assert_state_equal(model, before)
