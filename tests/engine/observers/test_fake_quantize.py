"""qviz's fake-quantize modules against torchao's (the reference): bit for bit.

Forward outputs, input gradients (the STE), scale / zero_point and the observer's state after
each of N steps, per tensor and per channel, affine and symmetric, with the switches on and off;
state_dict keys, dtypes and a round trip through torchao's state_dict.
"""

from __future__ import annotations

import pytest
import torch

import qviz.engine.observers as qobs
import qviz.engine.observers.fake_quantize as qfq
from qviz.errors import CalibrationError, ConfigError

tfq = pytest.importorskip("torchao.quantization.pt2e.fake_quantize")
tobs = pytest.importorskip("torchao.quantization.pt2e.observer")

# (module, observer name, kwargs); the same names exist in both packages
CASES = {
    "fq-pt-affine": ("FakeQuantize", "MovingAverageMinMaxObserver", {
        "dtype": torch.int8, "quant_min": -128, "quant_max": 127,
        "qscheme": torch.per_tensor_affine, "eps": 2**-12}),
    "fq-pc-symmetric": ("FakeQuantize", "MovingAveragePerChannelMinMaxObserver", {
        "dtype": torch.int8, "quant_min": -127, "quant_max": 127,
        "qscheme": torch.per_channel_symmetric, "ch_axis": 1}),
    "fq-pt-minmax-uint8": ("FakeQuantize", "MinMaxObserver", {
        "dtype": torch.quint8, "quant_min": 0, "quant_max": 255}),
    "fused-pt-affine": ("FusedMovingAvgObsFakeQuantize", "MovingAverageMinMaxObserver", {
        "dtype": torch.int8, "quant_min": -128, "quant_max": 127,
        "qscheme": torch.per_tensor_affine, "eps": 2**-12}),
    "fused-pt-symmetric": ("FusedMovingAvgObsFakeQuantize", "MovingAverageMinMaxObserver", {
        "dtype": torch.int8, "quant_min": -127, "quant_max": 127,
        "qscheme": torch.per_tensor_symmetric, "eps": 2**-12}),
    "fused-pc-symmetric": ("FusedMovingAvgObsFakeQuantize",
                           "MovingAveragePerChannelMinMaxObserver", {
        "dtype": torch.int8, "quant_min": -127, "quant_max": 127,
        "qscheme": torch.per_channel_symmetric, "eps": 2**-12}),
}  # fmt: skip


def _pair(case: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    module, observer, kwargs = CASES[case]
    ours = getattr(qfq, module).with_args(observer=getattr(qobs, observer), **kwargs)()
    theirs = getattr(tfq, module).with_args(observer=getattr(tobs, observer), **kwargs)()
    return ours, theirs


def _batches(n: int, shape=(4, 3, 5, 5)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(shape, generator=g) * (1 + i) + 0.3 * i for i in range(n)]


def _step(module: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    y = module(x)
    (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    return y.detach(), x.grad


def _assert_same_state(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, equal_nan=True, msg=key)


@pytest.mark.parametrize("case", list(CASES))
def test_steps_match_torchao_bitwise(case: str) -> None:
    ours, theirs = _pair(case)
    _assert_same_state(ours, theirs)
    for x in _batches(4):
        y_ours, g_ours = _step(ours, x)
        y_theirs, g_theirs = _step(theirs, x)
        assert torch.equal(y_ours, y_theirs)
        assert torch.equal(g_ours, g_theirs)
        _assert_same_state(ours, theirs)
    for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("case", ["fq-pt-affine", "fused-pc-symmetric"])
def test_switches_match_torchao(case: str) -> None:
    ours, theirs = _pair(case)
    batches = _batches(6)
    for module in (ours, theirs):
        module(batches[0])
        module.disable_observer()  # frozen qparams, still fake-quantized
    for x in batches[1:3]:
        assert torch.equal(_step(ours, x)[0], _step(theirs, x)[0])
    _assert_same_state(ours, theirs)
    for module in (ours, theirs):
        module.disable_fake_quant()
        module.enable_observer()  # observing, output unchanged
    for x in batches[3:5]:
        y_ours, y_theirs = ours(x), theirs(x)
        assert torch.equal(y_ours, x) and torch.equal(y_theirs, x)
    _assert_same_state(ours, theirs)
    for module in (ours, theirs):
        module.enable_fake_quant()
    assert torch.equal(ours(batches[5]), theirs(batches[5]))
    _assert_same_state(ours, theirs)


def test_switch_buffers_as_torchao() -> None:
    plain, fused = qfq.FakeQuantize(), qfq.FusedMovingAvgObsFakeQuantize()
    assert plain.fake_quant_enabled.dtype == torch.uint8
    assert fused.observer_enabled.dtype == torch.long
    assert plain.zero_point.dtype == torch.int32 and plain.scale.shape == (1,)
    assert fused.quant_min == 0 and fused.quant_max == 255


def test_loads_torchao_state_dict() -> None:
    ours, theirs = _pair("fused-pc-symmetric")
    for x in _batches(2):
        theirs(x)
    ours.load_state_dict(theirs.state_dict())
    _assert_same_state(ours, theirs)
    x = _batches(3)[2]
    assert torch.equal(ours(x), theirs(x))


def test_with_args_and_bad_arguments() -> None:
    make = qfq.FusedMovingAvgObsFakeQuantize.with_args(eps=2**-12)
    assert make.__name__ == "FusedMovingAvgObsFakeQuantize" and make().quant_max == 255
    assert qfq.is_fake_quantize(make()) and not qfq.is_fake_quantize(qobs.MinMaxObserver())
    with pytest.raises(ConfigError, match="does not fit"):
        qfq.FakeQuantize(dtype=torch.int8, quant_min=0, quant_max=255)
    with pytest.raises(ConfigError, match="MovingAverageMinMaxObserver"):
        qfq.FusedMovingAvgObsFakeQuantize(observer=qobs.MinMaxObserver)
    with pytest.raises(ConfigError, match="quant_min"):
        qfq.FakeQuantize(quant_min=5, quant_max=1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("case", list(CASES))
def test_a_non_finite_value_is_refused_before_the_state_changes(case: str, bad: float) -> None:
    ours, _ = _pair(case)
    ours.qviz_label = "activation_post_process_3 (observing conv -> relu)"
    good, x = _batches(2)
    _step(ours, good)
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    x[0, 1, 2, 3] = bad
    with pytest.raises(CalibrationError, match=r"activation_post_process_3 \(observing conv"):
        ours(x)
    after = ours.state_dict()
    for key, value in before.items():
        assert torch.equal(after[key], value), f"{case}: {key} changed"
    x[0, 1, 2, 3] = 0.0
    ours.disable_observer()
    x[0, 1, 2, 3] = bad  # the observer is off: nothing is updated, nothing to refuse
    ours(x)
