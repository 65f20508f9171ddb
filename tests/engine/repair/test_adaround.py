"""AdaRound (qviz.engine.repair.adaround) on toy layers with known answers and on digits."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.compat import quantized_decomposed
from qviz.engine.quantizers import get_symmetric_quantization_config
from qviz.engine.repair.adaround import adaround
from qviz.engine.specs import QuantizationConfig
from qviz.errors import CalibrationError, ConfigError
from tests.helpers.metrics import output_sqnr
from tests.helpers.quantize import quantize
from tests.helpers.residual import Residual


def _config(qmax: int = 7, *, per_channel: bool = True) -> QuantizationConfig:
    """XNNPACK's symmetric configuration with weights on [-qmax, qmax] (4-bit by default)."""
    return get_symmetric_quantization_config(
        is_per_channel=per_channel, weight_qmin=-qmax, weight_qmax=qmax
    )


def _int_weights(gm) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in gm.named_buffers() if v.dtype == torch.int8}


def _input_qdq(converted, x):
    """The linear's input as the converted model computes it (its input quantize's grid)."""
    qd = quantized_decomposed()
    q = next(n for n in converted.graph.nodes if n.target == qd.quantize_per_tensor.default)
    scale, zp, qmin, qmax, dtype = q.args[1:]
    return qd.dequantize_per_tensor(
        qd.quantize_per_tensor(x, scale, zp, qmin, qmax, dtype), scale, zp, qmin, qmax, dtype
    )


def test_one_flip_provably_reduces_the_loss():
    """One output, inputs x = (t, t, u): w1 = 0.45 and w2 = 0.35 steps both round down to
    nearest, so the output misses 0.8 t; rounding exactly one of them up misses 0.2 t. The
    optimum (brute force over every floor / ceil choice, on the model's own quantized inputs) is
    what AdaRound picks. (With w1 = w2 the soft optimum is a saddle that gradient descent cannot
    leave: AdaRound rounds both down.)"""
    gen = torch.Generator().manual_seed(0)
    data = []
    for _ in range(4):
        t, u = torch.randn(32, 1, generator=gen), torch.randn(32, 1, generator=gen)
        data.append(torch.cat([t, t, u], dim=1))
    model = nn.Linear(3, 1, bias=False)
    with torch.no_grad():  # per-tensor 3-bit: max |w| = 7 makes the step exactly 1.0
        model.weight.copy_(torch.tensor([[0.45, 0.35, 7.0]]))
    gm, _, converted = quantize(model, data, config=_config(per_channel=False), dynamic_batch=True)
    (key,) = _int_weights(converted)
    assert converted.get_buffer(key).tolist() == [[0, 0, 7]]  # nearest
    out = adaround(converted, gm, data, iterations=2000, progress=False)
    x = torch.cat(data)
    xq, ref = _input_qdq(converted, x), x @ model.weight.detach().T

    def loss(codes):
        return float((xq @ torch.tensor([codes], dtype=torch.float32).T - ref).pow(2).mean())

    best = min(itertools.product([0, 1], [0, 1], [7]), key=loss)
    chosen = out.get_buffer(key)[0].tolist()
    assert sorted(best[:2]) == [0, 1] and loss(chosen) == pytest.approx(loss(best))
    assert chosen == [1, 0, 7]  # the weight nearer the middle goes up
    params = dict(out.plan.transforms[-1].params)
    assert params["loss_after"] < params["loss_before"] / 4
    assert params["flipped"] == pytest.approx(1 / 3)


def test_nearest_is_kept_where_it_is_optimal():
    """One-hot inputs make the reconstruction loss a sum over single weights: each weight's best
    choice is the integer closest to w / (s x_q) on its own, computed here independently."""
    torch.manual_seed(1)
    model = nn.Linear(8, 6, bias=False)
    eye = torch.eye(8)
    data = [eye.repeat(4, 1) * 0.9]
    gm, _, converted = quantize(model, data, config=_config(), dynamic_batch=True)
    (key,) = _int_weights(converted)
    out = adaround(converted, gm, data, iterations=500, progress=False)
    qd = quantized_decomposed()
    dq = next(n for n in converted.graph.nodes if n.target == qd.dequantize_per_channel.default)
    scale = converted.get_buffer(str(dq.args[1].target))[:, None]
    w = model.weight.detach()
    xq = float(_input_qdq(converted, torch.tensor([0.9]))[0])
    lo, hi = torch.floor(w / scale), torch.floor(w / scale) + 1
    best = torch.where(
        (lo * scale * xq - 0.9 * w).abs() <= (hi * scale * xq - 0.9 * w).abs(), lo, hi
    )
    best = best.clamp(-7, 7)
    chosen, nearest = out.get_buffer(key).float(), converted.get_buffer(key).float()
    assert float((chosen == best).float().mean()) >= 0.95
    assert float((chosen == nearest).float().mean()) >= 0.9  # nearest is (almost) optimal here


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def _convnet():
    torch.manual_seed(2)
    model = ConvNet().eval()
    with torch.no_grad():
        model.bn.running_mean.normal_(0, 0.2)
        model.bn.running_var.uniform_(0.5, 2.0)
    gen = torch.Generator().manual_seed(3)
    data = [torch.randn(16, 2, 4, 4, generator=gen) for _ in range(3)]
    return model, data


def test_floor_or_ceil_grid_and_caller_unchanged():
    model, data = _convnet()
    gm, _, converted = quantize(model, data, config=_config(3), dynamic_batch=True)
    ints_before = _int_weights(converted)
    floats_before = {k: v.clone() for k, v in converted.state_dict().items()}
    graph_before = str(converted.graph)
    out = adaround(converted, gm, data, iterations=150, progress=False)
    for key, value in converted.state_dict().items():  # the caller's model is untouched
        assert torch.equal(value, floats_before[key]), key
    assert str(out.graph) == graph_before  # the grid: same q/dq ops, same arguments
    for key, value in out.state_dict().items():
        if value.is_floating_point() or "zero_point" in key:
            assert torch.equal(value, floats_before[key]), key
    qd = quantized_decomposed()
    dqs = [n for n in out.graph.nodes if n.target == qd.dequantize_per_channel.default]
    folded = {  # the float weights the integers were rounded from: conv with BatchNorm folded
        "conv": torch.nn.utils.fusion.fuse_conv_bn_eval(model.conv, model.bn).weight.detach(),
        "fc": model.fc.weight.detach(),
    }
    flips = 0
    for dq, w in zip(dqs, folded.values(), strict=True):
        key, scale = str(dq.args[0].target), out.get_buffer(str(dq.args[1].target))
        ratio = w / scale.reshape(-1, *[1] * (w.ndim - 1))
        chosen = out.get_buffer(key).float()
        ok = (chosen == torch.floor(ratio).clamp(-3, 3)) | (
            chosen == torch.ceil(ratio).clamp(-3, 3)
        )
        assert bool(ok.all()), key
        flips += int((chosen != ints_before[key].float()).sum())
    assert flips > 0
    records = out.plan.transforms
    assert [r.nodes for r in records] == [("conv2d",), ("linear",)]
    assert all(dict(r.params)["loss_after"] <= dict(r.params)["loss_before"] for r in records)
    again = adaround(converted, gm, data, iterations=150, progress=False)
    assert all(torch.equal(again.get_buffer(k), out.get_buffer(k)) for k in ints_before)


def test_errors():
    model, data = _convnet()
    gm, _, converted = quantize(model, data, config=_config(3), dynamic_batch=True)
    other = qviz.export(ConvNet().eval(), (data[0],), dynamic_batch=True)
    with pytest.raises(ConfigError, match="prepared from another float model"):
        adaround(converted, other, data, iterations=5, progress=False)
    with pytest.raises(ConfigError, match="adaround takes"):
        adaround(gm, gm, data, iterations=5, progress=False)
    with pytest.raises(ConfigError, match="iterations must be"):
        adaround(converted, gm, data, iterations=0, progress=False)
    bad = [data[0], torch.full_like(data[0], float("nan"))]
    with pytest.raises(CalibrationError, match="batch 1"):
        adaround(converted, gm, bad, iterations=5, progress=False)


def test_digits_4bit_per_channel_improves():
    """Measured: nearest 0.9917 / 18.9 dB, AdaRound (300 iterations, about 2 s) 0.9972 / 29.2 dB."""
    from qviz.data import digits_loaders, digits_model, evaluate

    model, loaders = digits_model(), digits_loaders(batch_size=64)
    calib = list(loaders.calibration)
    gm, _, converted = quantize(model, [b[0] for b in calib], config=_config(), dynamic_batch=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = adaround(converted, gm, calib, iterations=300, progress=False)
    before, after = output_sqnr(gm, converted, loaders.test), output_sqnr(gm, out, loaders.test)
    assert after > before + 5, (before, after)
    assert evaluate(out, loaders.test) >= evaluate(converted, loaders.test)
    assert len(out.plan.transforms) == 6


def test_in_place_ops_after_a_layer_do_not_change_its_target():
    """A residual block written with ``out += x`` / ``relu_`` (torchvision's ResNet) computes
    the function of the out-of-place block, so AdaRound chooses the same integers: each
    layer's float target and input are taken before an in-place op writes into them."""
    torch.manual_seed(0)
    functional = Residual(inplace=False).eval()
    inplace = Residual(inplace=True).eval()
    inplace.load_state_dict(functional.state_dict())
    gen = torch.Generator().manual_seed(1)
    data = [torch.randn(16, 4, 8, 8, generator=gen) for _ in range(2)]
    chosen = []
    for model in (functional, inplace):
        gm, _, converted = quantize(model, data, config=_config(3), dynamic_batch=True)
        out = adaround(converted, gm, data, iterations=100, progress=False)
        chosen.append(sorted(_int_weights(out).items()))
    assert [k for k, _ in chosen[0]] == [k for k, _ in chosen[1]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(*chosen, strict=True))


def test_nodes_rounds_only_the_named_layer():
    """``nodes=``: the layer a diagnosis named is rounded, the others keep nearest rounding."""
    model, data = _convnet()
    gm, _, converted = quantize(model, data, config=_config(3), dynamic_batch=True)
    before = _int_weights(converted)
    out = adaround(converted, gm, data, iterations=150, nodes="linear", progress=False)
    after = _int_weights(out)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    linear_dq = next(n for n in out.graph.nodes if n.name == "linear").args[1]
    assert changed == {str(linear_dq.args[0].target)}
    assert [r.nodes for r in out.plan.transforms] == [("linear",)]
    with pytest.raises(ConfigError, match="'conv2d_9' is not a conv / linear"):
        adaround(converted, gm, data, iterations=5, nodes=["conv2d_9"], progress=False)


def test_a_layer_learned_from_the_same_content_takes_the_integers_it_chose(monkeypatch):
    """A layer whose weights, grid, inputs and settings are what they were is not learned again
    (a RepairSession rebuilding after a quantizer change): its integers and record are the ones
    learned then, bit for bit; a layer whose content changed is learned again."""
    import copy
    import sys

    from qviz.engine.repair.adaround import RECENT_ROUNDINGS

    module = sys.modules["qviz.engine.repair.adaround"]  # the package's name is the function

    learned = []
    real = module._learn
    monkeypatch.setattr(module, "_learn", lambda layer, *a: learned.append(layer.node.name)
                        or real(layer, *a))  # fmt: skip
    RECENT_ROUNDINGS.clear()
    model, data = _convnet()
    gm, _, converted = quantize(model, data, config=_config(3), dynamic_batch=True)
    first = adaround(converted, gm, data, iterations=150, progress=False)
    assert learned == ["conv2d", "linear"]
    again = adaround(converted, gm, data, iterations=150, progress=False)
    assert learned == ["conv2d", "linear"]  # nothing learned again
    ints = _int_weights(first)
    assert all(torch.equal(again.get_buffer(k), v) for k, v in ints.items())
    assert again.plan.transforms == first.plan.transforms
    adaround(converted, gm, data, iterations=151, progress=False)  # other settings
    assert learned[2:] == ["conv2d", "linear"]

    changed = copy.deepcopy(model)  # only the head changes: the conv's content is the same
    with torch.no_grad():
        changed.fc.weight.add_(0.05)
    gm2, _, converted2 = quantize(changed, data, config=_config(3), dynamic_batch=True)
    del learned[:]
    reused = adaround(converted2, gm2, data, iterations=150, progress=False)
    assert learned == ["linear"]
    RECENT_ROUNDINGS.clear()
    fresh = adaround(converted2, gm2, data, iterations=150, progress=False)
    assert learned == ["linear", "conv2d", "linear"]
    for key, value in _int_weights(fresh).items():
        assert torch.equal(reused.get_buffer(key), value), key
    assert reused.plan.transforms == fresh.plan.transforms
