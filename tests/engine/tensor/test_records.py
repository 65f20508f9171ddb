"""quantizer_records: what each TensorQuantizer is, read from a quant_nn model or its export."""

import io

import pytest
import torch
from torch import nn

import qviz
from qviz.engine import quant_nn
from qviz.engine.tensor.records import (
    quantizer_path,
    quantizer_records,
    quantizer_role,
    short_values,
)
from qviz.engine.tensor.tensor_quantizer import EXPORT_META_KEY, TensorQuantizer, fb_fake_quant
from qviz.errors import ConfigError

X = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def calibrated(calibrated_quant_nn_digits):
    """The digits model's quant_nn twin, inputs calibrated with entropy, block.conv2's input
    quantizer disabled."""
    return calibrated_quant_nn_digits("block.conv2._input_quantizer")


@pytest.fixture(scope="module")
def exported(calibrated):
    return qviz.export(calibrated, (X,))


def test_module_records_say_what_each_quantizer_is(calibrated):
    records = quantizer_records(calibrated)
    quantizers = [n for n, m in calibrated.named_modules() if isinstance(m, TensorQuantizer)]
    assert [r.name for r in records] == quantizers
    by_name = {r.name: r for r in records}
    conv = by_name["conv1.0._input_quantizer"]
    tq = calibrated.conv1[0]._input_quantizer
    assert (conv.role, conv.layer, conv.layer_type) == ("input", "conv1.0", "QuantConv2d")
    assert (conv.method, conv.calibrated, conv.calibrator) == (
        "entropy",
        True,
        "HistogramCalibrator",
    )
    assert (conv.num_bits, conv.quant_min, conv.quant_max, conv.dtype) == (8, -128, 127, "int8")
    assert conv.amax == pytest.approx((float(tq.amax),))
    assert conv.scale == pytest.approx((float(tq.amax) / 127,))  # PyTorch's amax / quant_max
    weight = by_name["conv1.0._weight_quantizer"]
    assert (weight.role, weight.method, weight.axis, len(weight.amax)) == (
        "weight",
        "max",
        (0,),
        64,
    )
    assert weight.per_channel and weight.amax_text.endswith("(64 ch)")
    assert not by_name["block.conv2._input_quantizer"].enabled
    assert all(r.calls == () for r in records)  # a module has no graph nodes


def test_exported_records_find_each_quantizers_nodes_and_edge(calibrated, exported):
    records = quantizer_records(exported)
    enabled = [r.name for r in quantizer_records(calibrated) if r.enabled]
    assert sorted(r.name for r in records) == sorted(enabled)  # the disabled one left no node
    for r in records:
        mine = {n.name for n in exported.graph.nodes if quantizer_path(n) == r.name}
        assert set(r.nodes) == mine and len(r.calls) == 1
    by_name = {r.name: r for r in records}
    assert by_name["pool._input_quantizer"].edges == (("relu_2", "max_pool2d"),)
    assert by_name["stem.0._input_quantizer"].edges == (("x", "conv2d"),)
    assert by_name["fc._weight_quantizer"].edges == (("fc_weight", "linear"),)
    assert by_name["conv1.0._input_quantizer"].edges == (("max_pool2d", "conv2d_3"),)
    # the facts match the module's, the amax is read from the graph module's buffer
    module = {r.name: r for r in quantizer_records(calibrated)}
    for name, r in by_name.items():
        assert (r.method, r.amax, r.scale, r.axis) == (
            module[name].method,
            module[name].amax,
            module[name].scale,
            module[name].axis,
        )


def test_fb_fake_quant_export_gives_the_same_records_with_one_op_each(calibrated, exported):
    with fb_fake_quant(calibrated):
        gm = qviz.export(calibrated, (X,))
    spelled = {r.name: r for r in quantizer_records(exported)}
    for r in quantizer_records(gm):
        ops = [n for n in r.nodes if n.startswith("fake_quantize_per_")]
        assert len(ops) == 1 and r.calls[0].output == ops[0]
        assert r.edges == spelled[r.name].edges and r.amax == spelled[r.name].amax


def test_dynamic_quantizer_and_repeated_calls():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.pool = quant_nn.QuantMaxPool2d(2)

        def forward(self, x):
            return self.pool(self.pool(x).relu())

    model = Twice()
    gm = qviz.export(model, (torch.randn(1, 1, 8, 8),))
    (record,) = quantizer_records(gm)
    assert record.dynamic and record.amax == () and record.amax_text == "dynamic"
    assert len(record.calls) == 2
    assert record.edges == (("x", "max_pool2d"), ("relu", "max_pool2d_1"))


def test_method_follows_load_calib_amax_not_a_hand_set_amax():
    tq = TensorQuantizer()
    tq.set_calib_method("percentile")
    tq.enable_calib()
    tq(torch.linspace(-1, 1, 2001))
    tq.load_calib_amax("percentile", percentile=99.9)
    assert tq.amax_method == "percentile 99.9"
    layer = quant_nn.QuantLinear(2, 2)
    layer._input_quantizer = tq
    (record, _) = quantizer_records(layer)
    assert (record.method, record.calibrated) == ("percentile 99.9", True)
    tq.amax = 0.5  # by hand: the method that picked it is no longer known
    (record, _) = quantizer_records(layer)
    assert (record.method, record.calibrated) == ("percentile", False)
    fresh = quant_nn.QuantLinear(2, 2)
    fresh.load_state_dict(layer.state_dict())
    assert fresh.input_quantizer.amax_method is None


def test_records_are_plain_data_with_tensor_free_reprs(exported):
    records = quantizer_records(exported)
    text = repr(records)
    assert "tensor(" not in text and "Tensor" not in text
    assert "QuantizerRecord('pool._input_quantizer', input of pool, int8 amax=" in text
    assert all(isinstance(v, float) for r in records for v in (*r.amax, *r.scale))


def test_the_description_survives_save_and_load():
    layer = quant_nn.QuantLinear(4, 2)
    layer.input_quantizer.amax = 2.0
    program = torch.export.export(layer, (torch.randn(1, 4),))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer).module()
    names = sorted(r.name for r in quantizer_records(loaded))
    assert names == ["_input_quantizer", "_weight_quantizer"]
    metas = [n.meta["custom"] for n in loaded.graph.nodes if quantizer_path(n)]
    assert all(set(m) == {EXPORT_META_KEY} for m in metas)  # nothing of torch's own added


def test_errors_name_the_thing_and_the_fix(exported):
    with pytest.raises(ConfigError, match=r"nn\.Module"):
        quantizer_records("model")
    gm = qviz.export(quant_nn.QuantLinear(2, 2), (torch.ones(1, 2),))
    for n in gm.graph.nodes:
        n.meta.pop("custom", None)
    with pytest.raises(ConfigError, match=r"'_input_quantizer'.*qviz\.export"):
        quantizer_records(gm)
    assert quantizer_records(nn.Linear(2, 2)) == ()


def test_small_helpers():
    assert quantizer_role("a._weight_quantizer") == "weight"
    assert quantizer_role("lstm._weight_quantizers.0") == "weight"
    assert quantizer_role("a._input_quantizer") == "input"
    assert short_values((1.0, 2.0), count=False) == "1..2"
