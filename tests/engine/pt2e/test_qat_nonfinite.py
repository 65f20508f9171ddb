"""QAT with a NaN or Inf in the data (house rule 15, nothing lost on failure): the digits model
prepared with qviz.prepare_qat_pt2e refuses a batch with one NaN pixel at the first fake-quantize
module that observes it, naming that module and the edge, with every fake-quantize scale and
BatchNorm statistic as before the batch; convert_pt2e refuses NaN/Inf ranges or BatchNorm
values, naming the node, instead of folding them into NaN biases."""

from __future__ import annotations

import copy

import pytest
import torch

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.observers.fake_quantize import is_fake_quantize
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import CalibrationError


@pytest.fixture(scope="module")
def digits_qat():
    torch.manual_seed(0)
    x, y = next(iter(digits_loaders(64).train))
    gm = qviz.export(digits_model().train(), (x,), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True, is_qat=True)
    return gm, x, y, XNNPACKQuantizer().set_global(config)


def _prepared(digits_qat) -> tuple[torch.fx.GraphModule, torch.Tensor]:
    gm, x, y, quantizer = digits_qat
    model = qviz.prepare_qat_pt2e(gm, quantizer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    return model, x


def _state(model) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_one_bad_pixel_is_refused_naming_the_module_and_nothing_changes(digits_qat, bad):
    model, x = _prepared(digits_qat)
    before = _state(model)
    poisoned = x.clone()
    poisoned[3, 0, 4, 5] = bad
    with pytest.raises(CalibrationError, match=r"activation_post_process_\d+ \(observing x ->"):
        model(poisoned)
    after = model.state_dict()
    for key, value in before.items():  # fake-quantize scales, ranges, BatchNorm statistics
        assert torch.equal(after[key], value), key  # the weights' ran first: put back too
    quantized = qviz.convert_pt2e(model)
    for name, value in [*quantized.named_parameters(), *quantized.named_buffers()]:
        assert torch.isfinite(value.float()).all(), name


def test_convert_refuses_a_nan_range_naming_the_observer_and_its_tensor(digits_qat):
    model, _ = _prepared(digits_qat)
    name, fq = next((n, m) for n, m in model.named_children() if is_fake_quantize(m))
    fq.activation_post_process.min_val.fill_(float("nan"))  # e.g. a state_dict from a bad run
    with pytest.raises(
        CalibrationError, match=rf"(?s)NaN or Inf range.*  {name} \(observes x -> conv2d\)"
    ):
        qviz.convert_pt2e(model)


def test_convert_refuses_nan_batch_norm_statistics_naming_the_node(digits_qat):
    model, _ = _prepared(digits_qat)
    model.get_buffer("stem.1.running_var")[2] = float("nan")
    with pytest.raises(CalibrationError, match=r"batch_norm.*running_var.*NaN or Inf"):
        qviz.convert_pt2e(model)


def test_a_forward_failing_part_way_puts_back_what_ran_before_it(digits_qat):
    """A NaN produced inside the model (here by a NaN BatchNorm weight) reaches a fake-quantize
    module after the input's, the weights' and a BatchNorm have moved: all are put back, in a
    deep copy too; the converted model carries no such hooks."""
    model, x = _prepared(digits_qat)
    copied = copy.deepcopy(model)
    for m in (model, copied):
        m.get_parameter("stem.1.weight").data[0] = float("nan")
        before = _state(m)
        with pytest.raises(CalibrationError, match=r"activation_post_process_\d+ \(observing"):
            m(x)
        after = m.state_dict()
        for key, value in before.items():
            assert torch.equal(after[key].nan_to_num(), value.nan_to_num()), key
    quantized = qviz.convert_pt2e(_prepared(digits_qat)[0])
    assert not quantized._forward_hooks and not quantized._forward_pre_hooks
