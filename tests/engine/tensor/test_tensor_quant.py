"""tensor_quant / fake_tensor_quant: published values, STE gradients, per-axis amax, edge cases."""

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qviz.engine.tensor.tensor_quant import fake_tensor_quant, tensor_quant
from qviz.errors import QuantizationError, QvizError

PUBLISHED_X = [0.9817, 0.8796, 0.9921, 0.4611, 0.0832, 0.1784, 0.3674, 0.5676, 0.3376, 0.2119]
PUBLISHED_FQ = [0.9843, 0.8828, 0.9921, 0.4609, 0.0859, 0.1797, 0.3672, 0.5703, 0.3359, 0.2109]
PUBLISHED_Q = [126, 113, 127, 59, 11, 23, 47, 73, 43, 27]


def _published_x() -> torch.Tensor:
    torch.manual_seed(12345)
    return torch.rand(10)


def test_published_example_reproduces():
    x = _published_x()
    assert torch.allclose(x, torch.tensor(PUBLISHED_X), atol=5e-5)
    fq = fake_tensor_quant(x, x.abs().max())
    assert torch.allclose(fq, torch.tensor(PUBLISHED_FQ), atol=5e-5)
    q, scale = tensor_quant(x, x.abs().max())
    assert q.tolist() == [float(v) for v in PUBLISHED_Q]
    assert round(float(scale), 4) == 128.0057
    assert torch.equal(fq, q / scale)


def test_integer_output_dtype():
    x = _published_x()
    q, _ = tensor_quant(x, x.abs().max(), output_dtype=torch.int8)
    assert q.dtype == torch.int8
    assert q.tolist() == PUBLISHED_Q


@pytest.mark.parametrize("fn", ["fake", "int"])
def test_ste_gradient_passes_inside_and_blocks_outside(fn):
    x = torch.tensor([-2.0, -1.0, -0.3, 0.0, 0.4, 1.0, 1.5], requires_grad=True)
    amax = torch.tensor(1.0)
    out = fake_tensor_quant(x, amax) if fn == "fake" else tensor_quant(x, amax)[0]
    grad = torch.arange(1.0, 8.0)
    out.backward(grad)
    inside = (x.abs() <= amax).float()
    assert torch.equal(x.grad, grad * inside)
    assert x.grad.tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0]


def test_ste_gradient_per_channel():
    x = torch.tensor([[0.5, 2.0], [0.5, 2.0]], requires_grad=True)
    amax = torch.tensor([[1.0], [3.0]])
    fake_tensor_quant(x, amax).sum().backward()
    assert x.grad.tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_per_channel_amax_equals_quantizing_each_channel():
    w = torch.randn(6, 3, 3, 3)
    amax = w.abs().amax(dim=(1, 2, 3), keepdim=True)
    assert amax.shape == (6, 1, 1, 1)
    per_channel = fake_tensor_quant(w, amax)
    for c in range(6):
        assert torch.equal(per_channel[c], fake_tensor_quant(w[c], amax[c].reshape(())))
    # linear weights (out, in): one amax per row
    lw = torch.randn(5, 7)
    lamax = lw.abs().amax(dim=1, keepdim=True)
    assert fake_tensor_quant(lw, lamax).shape == lw.shape


def test_agrees_with_torch_quantize_per_tensor():
    """Independent reference: torch's quantized_decomposed op (the PT2E graph format).

    The integer levels agree except on exact rounding ties (x / scale vs x * multiplier round
    differently in float32); the dequantized values then agree to float32 precision.
    """
    x = torch.randn(100_000) * 3
    amax = 4.0
    q, multiplier = tensor_quant(x, amax, output_dtype=torch.int32)
    importlib.import_module("torch.ao.quantization.fx._decomposed")  # registers the ops
    ops = torch.ops.quantized_decomposed
    ref = ops.quantize_per_tensor(x, amax / 127, 0, -127, 127, torch.int8)
    differs = q != ref.int()
    assert float(differs.float().mean()) < 1e-4
    assert bool(((q - ref.int()).abs() <= 1).all())
    near_tie = ((x * multiplier).abs().frac() - 0.5).abs() < 1e-3
    assert bool(near_tie[differs].all())
    same = ~differs
    assert torch.allclose(fake_tensor_quant(x, amax)[same], ref[same] * (amax / 127), rtol=1e-6)


def test_zero_amax_quantizes_to_zero_with_unit_multiplier():
    x = torch.tensor([[0.3, -0.2], [0.5, 0.1]])
    amax = torch.tensor([[0.0], [1.0]])
    q, scale = tensor_quant(x, amax)
    assert q[0].tolist() == [0.0, 0.0]
    assert scale[0].item() == 1.0 and scale[1].item() == 127.0
    assert fake_tensor_quant(x, 0.0).abs().sum() == 0


def test_unsigned_and_narrow_ranges():
    x = torch.tensor([0.0, 0.5, 1.0, 2.0])
    q, _ = tensor_quant(x, 1.0, unsigned=True)
    assert q.tolist() == [0.0, 128.0, 255.0, 255.0]
    q, _ = tensor_quant(-x, 1.0, narrow_range=False)
    assert q.tolist() == [0.0, -64.0, -127.0, -128.0]
    q, _ = tensor_quant(-x, 1.0)
    assert q.tolist() == [0.0, -64.0, -127.0, -127.0]


def test_half_inputs_are_computed_in_float32():
    x = torch.randn(1000).half()
    fq = fake_tensor_quant(x, 2.0)
    assert fq.dtype == torch.half
    assert torch.equal(fq, fake_tensor_quant(x.float(), 2.0).half())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"inputs": torch.tensor([-1.0, 1.0]), "amax": 1.0, "unsigned": True}, "negative inputs"),
        ({"inputs": torch.ones(3), "amax": -1.0}, "amax must be >= 0"),
        ({"inputs": torch.ones(3), "amax": float("nan")}, "finite"),
        ({"inputs": torch.ones(2, 3), "amax": torch.ones(3, 1)}, "does not broadcast"),
        ({"inputs": torch.ones(3, dtype=torch.int32), "amax": 1.0}, "floating-point"),
    ],
)
def test_bad_input_raises_a_clear_error(kwargs, match):
    with pytest.raises(QuantizationError, match=match):
        fake_tensor_quant(**kwargs)
    assert issubclass(QuantizationError, QvizError)


finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(finite, min_size=1, max_size=64),
    amax=st.floats(0.0010000000474974513, 1e3, width=32),
    num_bits=st.integers(2, 12),
)
def test_properties_of_fake_quantization(values, amax, num_bits):
    x = torch.tensor(values, dtype=torch.float32)
    fq = fake_tensor_quant(x, amax, num_bits)
    step = amax / (2 ** (num_bits - 1) - 1)
    inside = x.abs() <= amax
    # rounding error at most half a step inside the range (plus float32 slack)
    err = (x - fq).abs()[inside]
    assert bool((err <= step / 2 * (1 + 1e-5) + 1e-6 * amax).all())
    # outside the range, values clip to the largest level
    assert torch.allclose(fq[~inside].abs(), torch.full_like(fq[~inside], amax), rtol=1e-6)
    # idempotent, odd, and zero maps to zero
    assert torch.equal(fake_tensor_quant(fq, amax, num_bits), fq)
    assert torch.equal(fake_tensor_quant(-x, amax, num_bits), -fq)
    assert fake_tensor_quant(torch.zeros(1), amax, num_bits).item() == 0.0


@settings(max_examples=100, deadline=None)
@given(values=st.lists(finite, min_size=1, max_size=64), num_bits=st.integers(2, 16))
def test_integer_values_stay_on_the_grid(values, num_bits):
    x = torch.tensor(values)
    q, _ = tensor_quant(x, x.abs().max().clamp(min=1e-3), num_bits)
    hi = 2 ** (num_bits - 1) - 1
    assert bool((q == q.round()).all()) and int(q.abs().max()) <= hi
