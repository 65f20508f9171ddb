"""``use_fb_fake_quant``: TensorQuantizer through torch's fake_quantize ops, checked against
torch's ``quantize_per_tensor`` / ``quantize_per_channel`` (the independent reference for the
integer grid) and against qviz's own arithmetic."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qviz.engine.qparams import quant_range
from qviz.engine.tensor.fake_quant import torch_fake_quant
from qviz.engine.tensor.tensor_quant import QuantDescriptor, TensorQuantizer, fake_tensor_quant
from qviz.engine.tensor.tensor_quantizer import fb_fake_quant
from qviz.errors import QuantizationError


def _grid(values: torch.Tensor, amax: torch.Tensor, quant_max: int) -> torch.Tensor:
    return torch.round(values * (quant_max / amax))


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
@settings(max_examples=60, deadline=None)
@given(
    num_bits=st.integers(2, 8),
    unsigned=st.booleans(),
    narrow=st.booleans(),
    per_channel=st.booleans(),
    seed=st.integers(0, 2**16),
    spread=st.floats(0.01, 100.0),
)
def test_the_fb_path_picks_torchs_integer_grid_and_qvizs_values(
    num_bits, unsigned, narrow, per_channel, seed, spread
):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 4, 5, generator=g) * spread
    if unsigned:
        x = x.abs()
    if per_channel:
        amax = x.abs().amax(dim=(1, 2), keepdim=True) * 0.8
    else:
        amax = x.abs().amax() * 0.8
    axis = (0,) if per_channel else None
    ours = fake_tensor_quant(x, amax, num_bits, unsigned, narrow_range=narrow)
    fb = torch_fake_quant(x, amax, num_bits, unsigned, narrow, axis)
    quant_min, quant_max = quant_range(num_bits, unsigned=unsigned, narrow_range=narrow)
    # the reference grid: torch's own quantize op with the same step size and range
    scale = amax / quant_max
    if per_channel:
        q = torch.quantize_per_channel(
            torch.clamp(x, quant_min * scale, quant_max * scale),
            scale.flatten().double(), torch.zeros(3, dtype=torch.long), 0, torch.qint32,
        ).int_repr()  # fmt: skip
    else:
        q = torch.quantize_per_tensor(
            torch.clamp(x, quant_min * scale, quant_max * scale), float(scale), 0, torch.qint32
        ).int_repr()
    assert torch.equal(_grid(fb, amax, quant_max), q.float())
    assert torch.equal(_grid(ours, amax, quant_max), q.float())
    # the floats: q * scale (torch) vs q / multiplier (NVIDIA), two roundings each:
    # at most two float32 ulps apart
    assert torch.allclose(fb, ours, rtol=2**-22, atol=0)


def test_the_class_switch_and_the_context_manager_restore_what_was_there():
    x = torch.randn(64)
    tq = TensorQuantizer(QuantDescriptor(amax=1.5))
    own = tq(x)
    with fb_fake_quant():
        assert TensorQuantizer.use_fb_fake_quant and "fb" in repr(tq)
        fb = tq(x)
    assert not TensorQuantizer.use_fb_fake_quant
    assert torch.equal(fb, torch.fake_quantize_per_tensor_affine(x, 1.5 / 127, 0, -128, 127))
    assert torch.allclose(own, fb, rtol=2**-22, atol=0)
    tq.use_fb_fake_quant = True  # NVIDIA's per-instance way
    with pytest.raises(RuntimeError, match="boom"), fb_fake_quant(tq, enabled=False):
        assert not tq.use_fb_fake_quant
        raise RuntimeError("boom")
    assert tq.use_fb_fake_quant  # the instance's own setting is back after an exception


def test_a_tiny_amax_zeroes_its_channel_as_the_toolkit_does():
    x = torch.randn(2, 6)
    amax = torch.tensor([[0.0], [1.0]])
    fb = torch_fake_quant(x, amax, axis=(0,))
    assert torch.equal(fb[0], torch.zeros(6))
    assert torch.allclose(fb, fake_tensor_quant(x, amax), rtol=2**-22, atol=0)


def test_a_per_channel_amax_over_two_axes_says_what_to_do():
    tq = TensorQuantizer(QuantDescriptor(axis=(0, 1)))
    tq.use_fb_fake_quant = True
    with pytest.raises(QuantizationError, match=r"exactly one channel axis.*axis=\(0, 1\)"):
        tq(torch.randn(2, 3, 4))


def test_an_exported_quant_nn_model_is_the_fb_path_with_any_batch_size():
    import qviz
    from qviz.engine import quant_nn
    from qviz.engine.tensor.calibrate_quantizers import calibrate_quantizers

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        quant_nn.QuantConv2d(1, 2, 3), quant_nn.QuantMaxPool2d(2), torch.nn.Flatten(),
        quant_nn.QuantLinear(18, 3, quant_desc_input=QuantDescriptor(num_bits=4)),
    ).eval()  # fmt: skip
    calibrate_quantizers(model, [torch.randn(8, 1, 8, 8)], progress=False)
    gm = qviz.export(model, (torch.randn(2, 1, 8, 8),), dynamic_batch=True)
    rounds = [n for n in gm.graph.nodes if n.target is torch.ops.aten.round.default]
    owners = [next(reversed(n.meta["nn_module_stack"].values()))[0] for n in rounds]
    quantizers = [n for n, m in model.named_modules() if isinstance(m, TensorQuantizer)]
    assert sorted(owners) == sorted(quantizers)  # one rounding each, named by its module path
    x = torch.randn(5, 1, 8, 8)
    with fb_fake_quant(model):
        assert torch.equal(gm(x), model(x))  # the exported graph is the fb path exactly
    assert torch.allclose(gm(x), model(x), rtol=1e-5, atol=1e-6)
    with fb_fake_quant(model):  # torch's operators themselves, with the shapes fixed
        fixed = qviz.export(model, (x,))
    ops = [n for n in fixed.graph.nodes if "fake_quantize" in str(n.target)]
    assert len(ops) == len(quantizers) and torch.equal(fixed(x), gm(x))


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_spelled_out_arithmetic_is_torchs_kernel_bit_for_bit(per_channel):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(16, 9, 5, 5, generator=g) * 4
    amax = x.abs().amax(dim=(0, 2, 3), keepdim=True) * 0.7 if per_channel else torch.tensor(2.5)
    axis = (1,) if per_channel else None
    for bits, narrow in ((8, False), (8, True), (4, False)):
        fused = torch_fake_quant(x, amax, bits, False, narrow, axis)
        spelled = torch_fake_quant(x, amax, bits, False, narrow, axis, torch_ops=False)
        assert torch.equal(fused, spelled)
