"""quant_modules on a Hugging Face model: GPT-2's transformers ``Conv1D`` projections.

``Conv1D`` computes ``x @ weight + bias`` with ``weight [in, out]``; it is no ``nn.Linear``, so
``quantize_model`` swaps only GPT-2's ``lm_head`` and warns about the 8 projections it left
float (2 layers x attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj), unless
``custom_quant_modules`` maps ``Conv1D`` to ``quant_nn.quant_transposed_linear(Conv1D)``.

Measured (torch 2.14.1, transformers 5.24, CPU; asserted below): the mapped GPT-2 (random
weights, n_layer=2, n_embd=32), max-calibrated on 4 batches of 4x16 tokens, gives logits at
39.6 dB SQNR against the float model (8-bit inputs per tensor, 8-bit weights per output
feature); its ONNX QDQ file (18 QuantizeLinear / DequantizeLinear pairs, 9 layers x input and
weight) runs in onnxruntime within 1.2e-7 of torch's logits.
"""

from __future__ import annotations

import pickle
import warnings

import pytest
import torch
from torch import nn

from qviz.engine import quant_modules, quant_nn
from qviz.engine.tensor.calibrate_quantizers import calibrate_quantizers
from qviz.engine.tensor.descriptor import QuantDescriptor
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import ConfigError

transformers = pytest.importorskip("transformers")
from transformers import pytorch_utils  # noqa: E402
from transformers.models.gpt2 import modeling_gpt2  # noqa: E402

Conv1D = pytorch_utils.Conv1D
PROJECTIONS = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]


@pytest.fixture(autouse=True)
def _nothing_leaks():
    yield
    quant_modules.deactivate()


def _gpt2(use_cache: bool = True) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32, use_cache=use_cache
    )
    return transformers.GPT2LMHeadModel(config).eval()


def _conv1d_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, Conv1D)]


def _mapping() -> list[tuple]:
    return [(pytorch_utils, "Conv1D", quant_nn.quant_transposed_linear(Conv1D))]


def _quantize_quietly(model: nn.Module, **kwargs) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a mapped model leaves no linear-like layer float
        return quant_modules.quantize_model(model, **kwargs)


def test_without_a_mapping_conv1d_is_named_once_with_its_count_and_the_entry_to_pass():
    model = _gpt2()
    with pytest.warns(UserWarning) as caught:
        q = quant_modules.quantize_model(model)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "left 8 linear-like layers float" in message
    assert "transformers.pytorch_utils.Conv1D x 8: transformer.h.0.attn.c_attn, " in message
    assert (
        "custom_quant_modules=[(transformers.pytorch_utils, 'Conv1D', "
        "quant_nn.quant_transposed_linear(transformers.pytorch_utils.Conv1D))]" in message
    )
    assert type(q.lm_head) is quant_nn.QuantLinear  # the one nn.Linear
    left = quant_modules.unquantized_linear_layers(q)
    expected = [f"transformer.h.{i}.{p}" for i in range(2) for p in PROJECTIONS]
    assert [r.name for r in left] == expected
    assert {r.module_class for r in left} == {Conv1D}
    assert left[0].weight_shape == (32, 96)
    assert left[0].class_name == "transformers.pytorch_utils.Conv1D"
    # embeddings (2-D lookups) and LayerNorms (1-D) are not linear-like
    assert not any(".wte" in r.name or "ln_" in r.name for r in left)


def test_with_the_mapping_every_conv1d_is_quantized_calibrated_and_close_to_float():
    model = _gpt2()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    classes = [type(m) for m in model.modules()]
    q = _quantize_quietly(model, custom_quant_modules=_mapping())
    names = _conv1d_names(q)
    assert len(names) == 8 and names == _conv1d_names(model)
    quantized = quant_nn.quant_transposed_linear(Conv1D)
    assert all(type(q.get_submodule(n)) is quantized for n in names)  # still isinstance Conv1D
    assert quant_modules.unquantized_linear_layers(q) == ()
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 100, (4, 16), generator=g) for _ in range(4)]
    table = calibrate_quantizers(q, batches, progress=False)
    assert len(table) == 18  # 8 Conv1D + lm_head, input and weight each
    c_attn = q.transformer.h[0].attn.c_attn
    assert c_attn.weight_quantizer.amax.shape == (1, 96)  # one amax per output feature
    assert torch.equal(
        c_attn.weight_quantizer.amax.flatten(), c_attn.weight.detach().abs().amax(dim=0)
    )
    ids = torch.randint(0, 100, (2, 16), generator=g)
    with torch.no_grad():
        expected, got = model(ids).logits, q(ids).logits
    sqnr = 10 * torch.log10(expected.pow(2).sum() / (expected - got).pow(2).sum())
    assert sqnr > 35, float(sqnr)  # measured 39.6 dB
    # the user's float model is untouched: same values, same classes
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert [type(m) for m in model.modules()] == classes
    assert all(type(model.get_submodule(n)) is Conv1D for n in names)


def test_building_gpt2_under_enable_uses_the_namespace_its_code_reads():
    quantized = quant_nn.quant_transposed_linear(Conv1D)
    with quant_modules.enable(custom_quant_modules=[(modeling_gpt2, "Conv1D", quantized)]):
        q = _gpt2()
    assert modeling_gpt2.Conv1D is Conv1D and not quant_modules.is_active()
    assert [type(q.get_submodule(n)) for n in _conv1d_names(q)] == [quantized] * 8
    assert type(q.lm_head) is quant_nn.QuantLinear
    assert quant_modules.unquantized_linear_layers(q) == ()


def _calibrated_pair(per_channel: bool):
    torch.manual_seed(2)
    float_layer = Conv1D(24, 16)
    with torch.no_grad():
        float_layer.bias.normal_()
    axis = (1, 0) if per_channel else (None, None)
    layer = quant_nn.quant_transposed_linear(Conv1D).from_float(
        float_layer, quant_desc_weight=QuantDescriptor(num_bits=8, axis=axis[0])
    )
    linear = nn.Linear(16, 24)
    with torch.no_grad():
        linear.weight.copy_(float_layer.weight.t())
        linear.bias.copy_(float_layer.bias)
    twin = quant_nn.QuantLinear.from_float(
        linear, quant_desc_weight=QuantDescriptor(num_bits=8, axis=axis[1])
    )
    x = torch.randn(3, 5, 16)
    for m in (layer, twin):
        calibrate_quantizers(m, [x], progress=False)
    return float_layer, layer, twin, x


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_quantized_conv1d_is_conv1d_when_off_and_the_transposed_quant_linear_when_on(per_channel):
    float_layer, layer, twin, x = _calibrated_pair(per_channel)
    amax, twin_amax = layer.weight_quantizer.amax, twin.weight_quantizer.amax
    assert amax.shape == ((1, 24) if per_channel else ())
    assert torch.equal(amax, twin_amax.t() if per_channel else twin_amax)
    # the fake-quantized weights are the same values, elementwise, in transposed layouts
    wq = layer.weight_quantizer(layer.weight)
    assert torch.equal(wq, twin.weight_quantizer(twin.weight).t())
    with torch.no_grad():
        # on: one addmm of the same operands; F.linear's addmm reads the transposed weight
        # through a view, and the CPU gemm sums in the same order here (bitwise, measured)
        assert torch.equal(layer(x), twin(x))
        for m in layer.modules():
            if isinstance(m, TensorQuantizer):
                m.disable()
        assert torch.equal(layer(x), float_layer(x))  # off: Conv1D's own addmm, bit for bit


def test_the_quantized_conv1d_keeps_the_float_layers_settings_and_round_trips():
    float_layer = Conv1D(6, 4).to(torch.float64)
    layer = quant_nn.quant_transposed_linear(Conv1D).from_float(float_layer)
    assert (layer.nf, layer.nx, layer.weight.dtype) == (6, 4, torch.float64)
    assert layer.weight.data_ptr() != float_layer.weight.data_ptr()
    assert "weight=[in, out]" in repr(layer) and "_weight_quantizer" in repr(layer)
    again = pickle.loads(pickle.dumps(layer))
    assert type(again) is type(layer) and torch.equal(again.weight, layer.weight)
    assert set(layer.state_dict()) >= set(float_layer.state_dict())

    class Conv1D_(Conv1D):  # another foreign class of the same name: its own quantized class
        pass

    Conv1D_.__name__ = "Conv1D"
    other = quant_nn.quant_transposed_linear(Conv1D_)
    assert other.__name__ == "QuantConv1D" and other.__qualname__ != type(layer).__qualname__
    assert type(pickle.loads(pickle.dumps(other.from_float(Conv1D_(2, 2))))) is other


def test_quant_transposed_linear_names_what_is_wrong():
    with pytest.raises(ConfigError, match=r"float_class must be an nn\.Module class"):
        quant_nn.quant_transposed_linear(Conv1D(2, 2))
    quantized = quant_nn.quant_transposed_linear(Conv1D)
    with pytest.raises(ConfigError, match="already quantized"):
        quant_nn.quant_transposed_linear(quantized)
    with pytest.raises(ConfigError, match=r"needs a float transformers\.pytorch_utils\.Conv1D"):
        quantized.from_float(nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="init_args is a tuple"):
        quant_nn.quant_transposed_linear(Conv1D, init_args=["nf", "nx"])

    class Conv(nn.Module):
        def __init__(self, nf, nx):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(nf, nx, 3))

    with pytest.raises(ConfigError, match=r"2-D weight \[in, out\].*got \(2, 2, 3\)"):
        quant_nn.quant_transposed_linear(Conv)(2, 2)


def test_other_foreign_layers_are_named_and_float_module_list_is_respected():
    class Proj(nn.Module):  # a linear layer of unknown layout: the entry names what it needs
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(3, 4))

        def forward(self, x):
            return x @ self.weight.t()

    class MyLinear(nn.Linear):  # a subclass keeps its own forward: left alone
        pass

    model = nn.Sequential(nn.Embedding(10, 4), Proj(), MyLinear(3, 3), nn.Linear(3, 2))
    with pytest.warns(UserWarning, match="left 2 linear-like layers float") as caught:
        q = quant_modules.quantize_model(model)
    message = str(caught[0].message)
    assert ".Proj x 1: 1" in message and ".MyLinear x 1: 2" in message
    assert "<a quantized Proj with from_float(layer)" in message
    assert [type(m).__name__ for m in q] == ["Embedding", "Proj", "MyLinear", "QuantLinear"]
    # a class kept float on purpose is not warned about
    plain = nn.Sequential(nn.Conv2d(1, 1, 1), nn.Flatten(), nn.Linear(4, 2))
    q = _quantize_quietly(plain, float_module_list=["Linear"])
    assert [r.name for r in quant_modules.unquantized_linear_layers(q)] == ["2"]


@pytest.mark.slow
def test_the_mapped_gpt2_exports_to_onnx_and_runs_in_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime")
    import qviz

    # use_cache=False: with a cache GPT-2 returns a DynamicCache, which torch.export cannot
    # flatten (no pytree registration); the logits are what is exported
    q = _quantize_quietly(_gpt2(use_cache=False), custom_quant_modules=_mapping())
    g = torch.Generator().manual_seed(1)
    calibrate_quantizers(q, [torch.randint(0, 100, (4, 16), generator=g)], progress=False)
    ids = torch.randint(0, 100, (2, 16), generator=g)
    result = qviz.export_onnx(q, (ids,), tmp_path / "gpt2.onnx")
    assert (result.quantize_linear, result.dequantize_linear) == (18, 18)
    session = result.session()  # exact on this CPU (uint8 weights where U8S8 saturates)
    (logits,) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
    with torch.no_grad():
        expected = q(ids).logits
    assert torch.allclose(torch.from_numpy(logits), expected, atol=1e-5, rtol=0)
