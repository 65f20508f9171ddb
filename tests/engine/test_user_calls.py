"""The user's own callables (a metric, a loss function) go through one guard: their error, or a
value of the wrong type, is a ConfigError naming the callable, the batch and the original error
(qviz.engine.user_calls), on the public paths that call them: compare's metric, fine_tune's
loss_fn."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from qviz.engine import quant_nn
from qviz.engine.tensor.calibrate_quantizers import calibrate_quantizers
from qviz.engine.tensor.fine_tune import fine_tune
from qviz.engine.user_calls import call_user, callable_name
from qviz.errors import ConfigError
from qviz.numeric import compare
from tests.helpers.quantize import quantize


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def my_metric(float_out, quant_out, target):
    raise KeyError("logits")


def test_a_failing_callable_is_named_with_where_and_its_error_chained():
    with pytest.raises(ConfigError) as info:
        call_user(my_metric, 1, 2, 3, role="metric", where="compare: batch 4",
                  signature="metric(float_out, quant_out, target)")  # fmt: skip
    message = str(info.value)
    assert message.startswith("compare: batch 4: the metric my_metric raised KeyError: 'logits'")
    assert "metric(float_out, quant_out, target)" in message
    assert isinstance(info.value.__cause__, KeyError)


def test_a_wrong_return_type_is_named_with_what_was_expected():
    with pytest.raises(ConfigError, match=r"batch 1: the loss_fn returned str 'low'; f\(x\) must "
                       r"return a tensor \(the loss_fn given: .*<lambda>\)") as info:  # fmt: skip
        call_user(lambda x: "low", 1, role="loss_fn", where="batch 1", signature="f(x)",
                  convert=torch.as_tensor, expected="a tensor")  # fmt: skip
    assert isinstance(info.value.__cause__, TypeError | ValueError)
    assert call_user(len, [1, 2], role="metric", where="b", signature="len(x)") == 2


def test_callables_are_named_by_what_the_user_wrote():
    assert callable_name(my_metric) == "my_metric"
    assert callable_name(nn.CrossEntropyLoss()) == "CrossEntropyLoss instance"
    assert callable_name(functools.partial(my_metric, 1)) == "partial(my_metric)"


@pytest.fixture(scope="module")
def quantized():
    torch.manual_seed(0)
    x = torch.randn(4, 4)
    gm, _, converted = quantize(nn.Sequential(nn.Linear(4, 4)), [x], per_channel=False)
    return gm, converted, x


def test_a_metric_that_raises_is_named_by_compare_with_the_batch(quantized):
    """It escaped raw from deep in compare's loop."""
    gm, model, x = quantized
    before, calls = _state(model), []

    def flaky_metric(float_out, quant_out, target):
        calls.append(1)
        if len(calls) == 2:
            raise KeyError("logits")
        return 1.0

    words = r"compare: batch 1: the metric .*flaky_metric raised KeyError: 'logits'; it is called"
    with pytest.raises(ConfigError, match=words) as info:
        compare(gm, model, [x, x], metric=flaky_metric, progress=False)
    assert isinstance(info.value.__cause__, KeyError)
    _unchanged(model, before)


def bad_loss(outputs, labels):
    raise KeyError("logits")


def _calibrated_quant_linear():
    torch.manual_seed(0)
    model = nn.Sequential(quant_nn.QuantLinear(4, 3))
    data = [(torch.randn(8, 4), torch.randint(0, 3, (8,))) for _ in range(2)]
    calibrate_quantizers(model, data, progress=False)
    return model, data


@pytest.mark.parametrize(
    ("loss_fn", "words"),
    [(lambda out, y: "0.5", r"the loss_fn returned str '0\.5'; loss_fn\(outputs, labels\) must "
      r"return the loss as a one-element tensor"),
     (lambda out, y: nn.functional.cross_entropy(out, y).item(),
      r"the loss_fn returned float .* not a float"),
     (bad_loss, r"the loss_fn bad_loss raised KeyError: 'logits'")],
)  # fmt: skip
def test_a_loss_fn_that_raises_or_returns_no_tensor_is_named_and_the_model_restored(loss_fn, words):
    """A string loss escaped as AttributeError from loss.detach()."""
    model, data = _calibrated_quant_linear()
    before = _state(model)
    with pytest.raises(ConfigError, match=r"fine_tune: epoch 1, batch 0: " + words):
        fine_tune(model, data, epochs=1, lr=1e-2, loss_fn=loss_fn, progress=False)
    _unchanged(model, before)
