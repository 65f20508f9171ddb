"""Quantizing a model that already holds a converted part, against the reference.

A user quantizes a block (here conv-bn-relu with XNNPACK per-channel), puts the converted block
back in the model, exports the whole model and quantizes the rest (here only the linear). The
reference's test of this flow converts the second stage without calibrating; qviz refuses
observers that saw no data unless told ``allow_uncalibrated=True``.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn

import qviz
from qviz.errors import CalibrationError

ref_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ref_xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")


class ConvBnReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.relu = nn.Conv2d(3, 3, 3), nn.BatchNorm2d(3), nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class TwoStage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_bn_relu, self.linear = ConvBnReLU(), nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(self.conv_bn_relu(x))


def _stage_quantizers() -> tuple[object, object]:
    config = ref_xnnpack.get_symmetric_quantization_config
    first = ref_xnnpack.XNNPACKQuantizer().set_global(config(is_per_channel=True))
    second = ref_xnnpack.XNNPACKQuantizer().set_module_type(nn.Linear, config(is_per_channel=False))
    return first, second


def _two_stages(prepare, convert, calibrate, example, calibrate_second=True):
    model = TwoStage().eval()
    with torch.no_grad():
        model.conv_bn_relu.bn.running_mean.uniform_(-0.5, 0.5)
        model.conv_bn_relu.bn.running_var.uniform_(0.5, 2.0)
    first, second = _stage_quantizers()
    block = torch.export.export(model.conv_bn_relu, example, strict=True).module()
    block = prepare(block, first)
    calibrate(block, example)
    model.conv_bn_relu = convert(block)
    whole = prepare(torch.export.export(model, example, strict=True).module(), second)
    if calibrate_second:
        calibrate(whole, example)
    return whole


def _ref_calibrate(gm, example):
    gm(*example)


def _qviz_calibrate(gm, example):
    qviz.calibrate(gm, [example], progress=False)


def _qdq_counts(gm) -> Counter:
    return Counter(
        n.target.__name__ for n in gm.graph.nodes if "quantize" in getattr(n.target, "__name__", "")
    )


def test_quantizing_a_model_with_a_converted_block_is_bitwise_the_reference():
    torch.manual_seed(0)
    example = (torch.randn(3, 3, 10, 10),)
    state = torch.get_rng_state()
    ref = _two_stages(ref_pt2e.prepare_pt2e, ref_pt2e.convert_pt2e, _ref_calibrate, example)
    torch.set_rng_state(state)
    ours = _two_stages(qviz.prepare_pt2e, qviz.convert_pt2e, _qviz_calibrate, example)
    ref, ours = ref_pt2e.convert_pt2e(ref), qviz.convert_pt2e(ours)
    assert (
        _qdq_counts(ours)
        == _qdq_counts(ref)
        == {
            "quantize_per_tensor.default": 4,
            "dequantize_per_tensor.default": 5,
            "dequantize_per_channel.default": 1,
        }
    )
    assert torch.equal(ours(*example), ref(*example))
    # the block quantized in the first stage is not reported as left in float
    assert [f.node for f in ours.plan.float_nodes] == []
    assert {str(t.tensor) for t in ours.plan} == {
        "dequantize_per_tensor_1 -> linear",
        "linear_weight -> linear",
        "linear",
    }


def test_uncalibrated_observers_convert_only_when_asked():
    torch.manual_seed(0)
    example = (torch.randn(3, 3, 10, 10),)
    state = torch.get_rng_state()
    ref = _two_stages(ref_pt2e.prepare_pt2e, ref_pt2e.convert_pt2e, _ref_calibrate, example, False)
    torch.set_rng_state(state)
    ours = _two_stages(qviz.prepare_pt2e, qviz.convert_pt2e, _qviz_calibrate, example, False)
    with pytest.raises(CalibrationError, match="allow_uncalibrated=True"):
        qviz.convert_pt2e(ours)
    with pytest.warns(UserWarning, match="3 observer\\(s\\) saw no data"):
        converted = qviz.convert_pt2e(ours, allow_uncalibrated=True)
    ref = ref_pt2e.convert_pt2e(copy.deepcopy(ref))
    assert _qdq_counts(converted) == _qdq_counts(ref)
    assert torch.equal(converted(*example), ref(*example))


def test_a_quantizer_that_annotates_nothing_leaves_the_model_as_it_was():
    gm = qviz.export(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), (torch.randn(2, 4),))
    nothing = ref_xnnpack.XNNPACKQuantizer()  # no global config, no module config
    prepared = qviz.prepare_pt2e(gm, nothing)
    with pytest.warns(UserWarning, match="annotated nothing"):
        converted = qviz.convert_pt2e(prepared)
    x = torch.randn(2, 4)
    assert torch.equal(converted(x), gm(x))
    assert [f.node for f in converted.plan.float_nodes] == ["linear", "relu"]
