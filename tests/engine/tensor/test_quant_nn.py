"""quant_nn: the quantized drop-in layers against their torch.nn parents and a hand computation.

Every layer is checked three ways: with its quantizers disabled it is its ``torch.nn`` parent bit
for bit; with them on it equals ``fake_tensor_quant`` applied by hand to the input and the
weight (per-channel amax computed by hand) followed by the torch functional op, bit for bit; and
for a conv and a linear it equals nvidia-modelopt's quant modules with the same amax (the
oracle, skipped where modelopt cannot be imported). QuantLSTM has its own file,
test_quant_rnn.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qviz.engine import quant_nn
from qviz.engine.tensor.descriptor import (
    QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    QUANT_DESC_8BIT_PER_TENSOR,
)
from qviz.engine.tensor.tensor_quant import QuantDescriptor, TensorQuantizer, fake_tensor_quant
from qviz.errors import ConfigError

_DEFAULT_ATTRS = ("default_quant_desc_input", "default_quant_desc_weight")


@dataclass
class Case:
    qcls: type
    fcls: type
    args: tuple
    kwargs: dict
    shape: tuple
    ref: Callable  # weighted: (x, w, bias) -> out; pooling: (x) -> out
    weight_axis: int | None = None  # the axis keeping its own amax; None: no weight
    call_kwargs: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return self.qcls.__name__


CASES = [
    Case(quant_nn.QuantLinear, nn.Linear, (5, 3), {}, (4, 5), F.linear, 0),
    Case(
        quant_nn.QuantConv1d,
        nn.Conv1d,
        (2, 4, 3),
        {"padding": 1, "stride": 2},
        (2, 2, 7),
        lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1),
        0,
    ),
    Case(
        quant_nn.QuantConv2d,
        nn.Conv2d,
        (4, 6, 3),
        {"groups": 2, "dilation": 2, "padding": 2, "padding_mode": "reflect", "bias": False},
        (2, 4, 7, 7),
        lambda x, w, b: F.conv2d(F.pad(x, (2, 2, 2, 2), mode="reflect"), w, b, 1, 0, 2, 2),
        0,
    ),
    Case(
        quant_nn.QuantConv3d,
        nn.Conv3d,
        (2, 3, 2),
        {"stride": 2, "padding": 1, "padding_mode": "circular"},
        (1, 2, 4, 4, 4),
        lambda x, w, b: F.conv3d(F.pad(x, (1,) * 6, mode="circular"), w, b, stride=2),
        0,
    ),
    Case(
        quant_nn.QuantConvTranspose1d,
        nn.ConvTranspose1d,
        (2, 3, 3),
        {"stride": 2, "output_padding": 1},
        (2, 2, 5),
        lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, output_padding=1),
        1,
    ),
    Case(
        quant_nn.QuantConvTranspose2d,
        nn.ConvTranspose2d,
        (4, 4, 3),
        {"stride": 2, "padding": 1, "groups": 2},
        (1, 4, 4, 4),
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, groups=2),
        1,
    ),
    Case(
        quant_nn.QuantConvTranspose3d,
        nn.ConvTranspose3d,
        (2, 2, 2),
        {"stride": 2, "dilation": 2, "bias": False},
        (1, 2, 3, 3, 3),
        lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2, dilation=2),
        1,
    ),
    Case(
        quant_nn.QuantMaxPool1d,
        nn.MaxPool1d,
        (3,),
        {"stride": 2, "padding": 1, "ceil_mode": True},
        (2, 3, 8),
        lambda x: F.max_pool1d(x, 3, 2, 1, ceil_mode=True),
    ),
    Case(
        quant_nn.QuantMaxPool2d,
        nn.MaxPool2d,
        (2,),
        {"return_indices": True},
        (2, 3, 6, 6),
        lambda x: F.max_pool2d(x, 2, return_indices=True),
    ),
    Case(
        quant_nn.QuantMaxPool3d,
        nn.MaxPool3d,
        (2,),
        {"stride": 1, "dilation": 2},
        (1, 2, 5, 5, 5),
        lambda x: F.max_pool3d(x, 2, 1, dilation=2),
    ),
    Case(
        quant_nn.QuantAvgPool1d,
        nn.AvgPool1d,
        (3,),
        {"stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
        (2, 3, 8),
        lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    ),
    Case(
        quant_nn.QuantAvgPool2d,
        nn.AvgPool2d,
        (3,),
        {"stride": 2, "padding": 1, "count_include_pad": False, "divisor_override": 2},
        (2, 3, 7, 7),
        lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False, divisor_override=2),
    ),
    Case(
        quant_nn.QuantAvgPool3d,
        nn.AvgPool3d,
        (2,),
        {"ceil_mode": True},
        (1, 2, 5, 5, 5),
        lambda x: F.avg_pool3d(x, 2, ceil_mode=True),
    ),
    Case(
        quant_nn.QuantAdaptiveAvgPool1d,
        nn.AdaptiveAvgPool1d,
        (3,),
        {},
        (2, 3, 7),
        lambda x: F.adaptive_avg_pool1d(x, 3),
    ),
    Case(
        quant_nn.QuantAdaptiveAvgPool2d,
        nn.AdaptiveAvgPool2d,
        ((2, None),),
        {},
        (2, 3, 5, 4),
        lambda x: F.adaptive_avg_pool2d(x, (2, None)),
    ),
    Case(
        quant_nn.QuantAdaptiveAvgPool3d,
        nn.AdaptiveAvgPool3d,
        (1,),
        {},
        (1, 2, 3, 3, 3),
        lambda x: F.adaptive_avg_pool3d(x, 1),
    ),
]
WEIGHTED = [c for c in CASES if c.weight_axis is not None]


def _quantizers(module: nn.Module) -> list[TensorQuantizer]:
    return [m for m in module.modules() if isinstance(m, TensorQuantizer)]


def _assert_same(a, b) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)
    else:
        assert torch.equal(a, b)


def _pair(case: Case) -> tuple[nn.Module, nn.Module]:
    """A float layer and a quantized layer holding the float layer's state_dict."""
    float_layer = case.fcls(*case.args, **case.kwargs)
    quant_layer = case.qcls(*case.args, **case.kwargs)
    quant_layer.load_state_dict(float_layer.state_dict(), strict=True)
    return float_layer, quant_layer


def _weight_amax(w: torch.Tensor, axis: int) -> torch.Tensor:
    return w.detach().abs().amax(dim=[d for d in range(w.dim()) if d != axis], keepdim=True)


def _by_hand(case: Case, layer: nn.Module, x: torch.Tensor, scale: float | None) -> object:
    """fake_tensor_quant on the input (and weight), then the torch functional op."""
    x_amax = x.abs().amax() * (scale or 1.0)
    xq = fake_tensor_quant(x, x_amax, 8, narrow_range=False)
    if case.weight_axis is None:
        return case.ref(xq)
    w_amax = _weight_amax(layer.weight, case.weight_axis) * (scale or 1.0)
    wq = fake_tensor_quant(layer.weight, w_amax, 8, narrow_range=False)
    return case.ref(xq, wq, layer.bias)


# -- equivalences --------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=str)
def test_disabled_quantizers_give_the_float_layer_bit_for_bit(case):
    float_layer, quant_layer = _pair(case)
    assert isinstance(quant_layer, case.fcls)
    assert quant_layer.state_dict().keys() == float_layer.state_dict().keys()
    for q in _quantizers(quant_layer):
        q.disable()
    x = torch.randn(case.shape)
    _assert_same(quant_layer(x), float_layer(x))


@pytest.mark.parametrize("scale", [None, 0.5], ids=["dynamic", "clipping"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_quantized_forward_equals_the_hand_computation(case, scale):
    _, layer = _pair(case)
    x = torch.randn(case.shape)
    if scale is not None:  # a loaded amax below the data's range: values clip
        layer.input_quantizer.amax = x.abs().amax() * scale
        if case.weight_axis is not None:
            layer.weight_quantizer.amax = _weight_amax(layer.weight, case.weight_axis) * scale
    _assert_same(layer(x), _by_hand(case, layer, x, scale))


@pytest.mark.parametrize("case", WEIGHTED, ids=str)
def test_default_weight_quantizer_keeps_one_amax_per_output_channel(case):
    _, layer = _pair(case)
    assert layer.weight_quantizer.axis == (case.weight_axis,)
    assert layer.input_quantizer.axis is None
    groups = case.kwargs.get("groups", 1) if case.weight_axis == 1 else 1  # (in, out / groups)
    assert layer.weight.shape[case.weight_axis] * groups == case.args[1]


@pytest.mark.parametrize("output_size", [[9, 9], [1, 4, 10, 10]])
def test_conv_transpose_output_size_matches_torch(output_size):
    float_layer = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1)
    layer = quant_nn.QuantConvTranspose2d.from_float(float_layer)
    x = torch.randn(1, 4, 5, 5)
    out = layer(x, output_size=output_size)
    for q in _quantizers(layer):
        q.disable()
    assert torch.equal(layer(x, output_size=output_size), float_layer(x, output_size=output_size))
    xq = fake_tensor_quant(x, x.abs().amax(), 8, narrow_range=False)
    wq = fake_tensor_quant(layer.weight, _weight_amax(layer.weight, 1), 8, narrow_range=False)
    output_padding = output_size[-1] - 9  # (5 - 1) * 2 - 2 * 1 + 3 = 9
    expected = F.conv_transpose2d(xq, wq, layer.bias, 2, 1, output_padding)
    assert out.shape[-2:] == tuple(output_size[-2:]) and torch.equal(out, expected)
    with pytest.raises(ValueError, match="output size"):
        layer(x, output_size=[20, 20])


# -- the oracle: nvidia-modelopt's quant modules -------------------------------------------------
def _modelopt_nn():
    return pytest.importorskip(
        "modelopt.torch.quantization.nn", reason="nvidia-modelopt is the oracle"
    )


@pytest.mark.parametrize("clip", [False, True], ids=["dynamic", "loaded-amax"])
@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_matches_nvidia_modelopt(kind, clip):
    mo = _modelopt_nn()
    if kind == "conv":
        float_layer, shape = nn.Conv2d(3, 4, 3, padding=1, groups=1), (2, 3, 6, 6)
        ref = mo.QuantConv2d(3, 4, 3, padding=1)
        ours = quant_nn.QuantConv2d.from_float(float_layer)
    else:
        float_layer, shape = nn.Linear(5, 3), (4, 5)
        ref = mo.QuantLinear(5, 3)
        ours = quant_nn.QuantLinear.from_float(float_layer)
    ref.load_state_dict(float_layer.state_dict(), strict=False)
    x = torch.randn(shape)
    if clip:
        x_amax = x.abs().amax() * 0.6
        w_amax = _weight_amax(float_layer.weight, 0) * 0.7
        ref.input_quantizer.amax, ref.weight_quantizer.amax = x_amax, w_amax
        ours.input_quantizer.amax, ours.weight_quantizer.amax = x_amax, w_amax
    assert torch.equal(ours(x), ref(x))


# -- gradients -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[5]], ids=str)
def test_straight_through_gradients_reach_input_and_weight(case):
    _, layer = _pair(case)
    x = torch.randn(case.shape, requires_grad=True)
    x_amax = x.detach().abs().amax() * 0.5
    w_amax = _weight_amax(layer.weight, case.weight_axis) * 0.5
    layer.input_quantizer.amax, layer.weight_quantizer.amax = x_amax, w_amax
    grad_out = torch.randn_like(layer(x))
    layer(x).backward(grad_out)
    # the float op's gradient at the quantized operands, masked where the value was clipped
    xq = fake_tensor_quant(x.detach(), x_amax, 8, narrow_range=False).requires_grad_()
    wq = fake_tensor_quant(layer.weight.detach(), w_amax, 8, narrow_range=False)
    wq.requires_grad_()
    case.ref(xq, wq, layer.bias).backward(grad_out)
    x_kept = x.detach().abs() <= x_amax
    w_kept = layer.weight.detach().abs() <= w_amax
    assert bool((~x_kept).any()) and bool((~w_kept).any())  # some values clip, and get 0
    assert torch.equal(x.grad, torch.where(x_kept, xq.grad, 0.0))
    assert torch.equal(layer.weight.grad, torch.where(w_kept, wq.grad, 0.0))


# -- state_dict ----------------------------------------------------------------------------------
def _calibrate(layer: nn.Module, batches: list[torch.Tensor]) -> None:
    for q in _quantizers(layer):
        q.disable_quant()
        q.enable_calib()
    for x in batches:
        layer(x)
    for q in _quantizers(layer):
        q.load_calib_amax()
        q.disable_calib()
        q.enable_quant()


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[6], CASES[8]], ids=str)
def test_calibrated_checkpoint_round_trip(case):
    float_layer, layer = _pair(case)
    batches = [torch.randn(case.shape) for _ in range(2)]
    _calibrate(layer, batches)
    state = layer.state_dict()
    amax_keys = {"_input_quantizer._amax"}
    if case.weight_axis is not None:
        amax_keys.add("_weight_quantizer._amax")
    assert set(state) == set(float_layer.state_dict()) | amax_keys
    assert torch.equal(state["_input_quantizer._amax"], torch.stack(batches).abs().amax())
    fresh = case.qcls(*case.args, **case.kwargs)
    fresh.load_state_dict(state, strict=True)
    for key in amax_keys:
        assert torch.equal(fresh.state_dict()[key], state[key])
    x = torch.randn(case.shape)
    _assert_same(fresh(x), layer(x))
    with pytest.raises(RuntimeError, match="Unexpected key"):
        case.fcls(*case.args, **case.kwargs).load_state_dict(state, strict=True)


# -- from_float ----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=str)
def test_from_float_keeps_settings_and_weights_and_shares_nothing(case):
    float_layer = case.fcls(*case.args, **case.kwargs).eval()
    before = {k: v.clone() for k, v in float_layer.state_dict().items()}
    layer = case.qcls.from_float(float_layer)
    assert type(layer) is case.qcls and not layer.training
    assert case.fcls.extra_repr(layer) == float_layer.extra_repr()
    x = torch.randn(case.shape)
    _, reference = _pair(case)
    reference.load_state_dict(float_layer.state_dict())
    _assert_same(layer(x), reference(x))
    for name, param in layer.named_parameters():
        original = dict(float_layer.named_parameters())[name]
        assert param is not original and param.data_ptr() != original.data_ptr()
        with torch.no_grad():
            param.add_(1.0)
    for key, value in float_layer.state_dict().items():
        assert torch.equal(value, before[key])


def test_from_float_keeps_dtype_requires_grad_padding_same_and_descriptors():
    conv = nn.Conv2d(2, 2, 3, padding="same", dtype=torch.float64)
    conv.bias.requires_grad_(False)
    desc = QuantDescriptor(num_bits=4, axis=0)
    layer = quant_nn.QuantConv2d.from_float(conv, quant_desc_weight=desc)
    assert layer.padding == "same" and layer.weight.dtype == torch.float64
    assert layer.weight.requires_grad and not layer.bias.requires_grad
    assert layer.weight_quantizer.quant_desc == desc
    assert layer.input_quantizer.quant_desc == QUANT_DESC_8BIT_PER_TENSOR
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64)
    assert layer(x).dtype == torch.float64 and layer(x).shape == (1, 2, 5, 5)


def test_from_float_refuses_what_it_cannot_convert():
    class MyConv(nn.Conv2d):
        pass

    with pytest.raises(ConfigError, match=r"QuantConv2d.from_float needs a torch.nn.Conv2d"):
        quant_nn.QuantConv2d.from_float(MyConv(1, 1, 1))
    with pytest.raises(ConfigError, match=r"needs a torch\.nn\.Conv2d, got Linear"):
        quant_nn.QuantConv2d.from_float(nn.Linear(1, 1))
    with pytest.raises(ConfigError, match="already quantized"):
        quant_nn.QuantConv2d.from_float(quant_nn.QuantConv2d(1, 1, 1))
    with pytest.raises(ConfigError, match="QuantMaxPool2d has no weight"):
        quant_nn.QuantMaxPool2d.from_float(nn.MaxPool2d(2), quant_desc_weight=QuantDescriptor())
    conv = nn.Conv2d(1, 1, 1)
    conv.register_buffer("extra", torch.zeros(1))
    with pytest.raises(ConfigError, match=r"unexpected keys.*extra"):
        quant_nn.QuantConv2d.from_float(conv)


# -- defaults ------------------------------------------------------------------------------------
_ALL_CLASSES = sorted(
    {
        c
        for q in quant_nn.QUANT_MODULES.values()
        for c in q.__mro__
        if issubclass(c, quant_nn.QuantInputMixin)
    },
    key=lambda c: c.__qualname__,
)


def _default_holders() -> dict[tuple[str, str], QuantDescriptor]:
    return {
        (c.__qualname__, a): c.__dict__[a]
        for c in _ALL_CLASSES
        for a in _DEFAULT_ATTRS
        if a in c.__dict__
    }


_HOLDERS_AT_IMPORT = _default_holders()


@pytest.fixture
def restore_defaults():
    """Put every class's own default descriptors back exactly as they were."""
    saved = {c: {a: c.__dict__[a] for a in _DEFAULT_ATTRS if a in c.__dict__} for c in _ALL_CLASSES}
    yield
    for cls, attrs in saved.items():
        for attr in _DEFAULT_ATTRS:
            if attr in attrs:
                setattr(cls, attr, attrs[attr])
            elif attr in cls.__dict__:
                delattr(cls, attr)


def test_setting_a_default_changes_only_that_class(restore_defaults):
    existing = quant_nn.QuantConv2d(1, 1, 1)
    four_bit = QuantDescriptor(num_bits=4, axis=0)
    unsigned = QuantDescriptor(num_bits=8, unsigned=True)
    quant_nn.QuantConv2d.set_default_quant_desc_weight(four_bit)
    quant_nn.QuantConv2d.set_default_quant_desc_input(unsigned)
    assert quant_nn.Conv2d(1, 1, 1).weight_quantizer.quant_desc == four_bit
    assert quant_nn.QuantConv2d.from_float(nn.Conv2d(1, 1, 1)).input_quantizer.unsigned
    assert existing.weight_quantizer.num_bits == 8 and not existing.input_quantizer.unsigned
    for other in (quant_nn.QuantConv1d(1, 1, 1), quant_nn.QuantConv3d(1, 1, 1)):
        assert other.weight_quantizer.num_bits == 8 and not other.input_quantizer.unsigned
    assert quant_nn.QuantLinear(1, 1).weight_quantizer.num_bits == 8
    quant_nn.QuantMaxPool2d.set_default_quant_desc_input(unsigned)
    assert quant_nn.QuantMaxPool2d(2).input_quantizer.unsigned
    assert not quant_nn.QuantMaxPool1d(2).input_quantizer.unsigned


def test_a_wrong_default_is_refused_with_the_class_and_expected_type(restore_defaults):
    with pytest.raises(ConfigError, match=r"QuantConv2d.set_default_quant_desc_weight.*Quant"):
        quant_nn.QuantConv2d.set_default_quant_desc_weight({"num_bits": 4})
    with pytest.raises(ConfigError, match=r"QuantLinear.set_default_quant_desc_input"):
        quant_nn.QuantLinear.set_default_quant_desc_input(None)
    assert quant_nn.QuantConv2d.default_quant_desc_weight == (
        QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL
    )


_NVIDIA_WEIGHT_DEFAULTS = {
    quant_nn.QuantLinear: QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    quant_nn.QuantConv1d: QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    quant_nn.QuantConv2d: QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    quant_nn.QuantConv3d: QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    quant_nn.QuantConvTranspose1d: QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
    quant_nn.QuantConvTranspose2d: QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
    quant_nn.QuantConvTranspose3d: QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
    quant_nn.QuantLSTM: QUANT_DESC_8BIT_PER_TENSOR,
}


@pytest.mark.parametrize("cls", list(quant_nn.QUANT_MODULES.values()), ids=lambda c: c.__name__)
def test_defaults_are_nvidias_and_no_test_left_one_changed(cls):
    assert cls.default_quant_desc_input == QUANT_DESC_8BIT_PER_TENSOR
    if cls in _NVIDIA_WEIGHT_DEFAULTS:
        assert cls.default_quant_desc_weight == _NVIDIA_WEIGHT_DEFAULTS[cls]
    assert _default_holders() == _HOLDERS_AT_IMPORT  # no class gained or lost its own default


def test_transposed_conv_weight_default_keeps_the_output_channel_axis():
    for desc in (
        QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
        QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
        QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
    ):
        assert desc.axis == (1,) and desc.num_bits == 8
    layer = quant_nn.QuantConvTranspose2d(4, 6, 3, groups=2)
    _calibrate(layer, [torch.randn(1, 4, 3, 3)])
    assert layer.weight_quantizer.amax.shape == (1, 3, 1, 1)  # (in, out / groups, kh, kw)


# -- the source document's calibration recipe ----------------------------------------------------
def test_calibration_recipe_gives_the_max_of_each_layer_input():
    model = nn.Sequential(
        quant_nn.Conv2d(2, 4, 3, padding=1),
        nn.ReLU(),
        quant_nn.MaxPool2d(2),
        quant_nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        quant_nn.Linear(16, 3),
    )
    seen: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(_module, args):
            m = args[0].detach().abs().amax()
            seen[name] = torch.maximum(seen[name], m) if name in seen else m

        return hook

    for name, module in model.named_children():
        if isinstance(module, quant_nn.QuantInputMixin):
            module.register_forward_pre_hook(record(name))
    quantizers = {n: m for n, m in model.named_modules() if n.endswith("_input_quantizer")}
    assert sorted(quantizers) == [f"{i}._input_quantizer" for i in (0, 2, 3, 5)]
    for q in quantizers.values():
        q.disable_quant()
        q.enable_calib()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 2, 8, 8) * 3)
    for q in quantizers.values():
        q.load_calib_amax()
        q.disable_calib()
        q.enable_quant()
    for name, q in quantizers.items():
        assert torch.equal(q.amax, seen[name.split(".")[0]]), name
    assert model[0].weight_quantizer.amax is None  # weights were left dynamic
    x = torch.randn(4, 2, 8, 8)
    assert model(x).shape == (4, 3)


# -- surface and errors --------------------------------------------------------------------------
def test_aliases_reexports_and_quant_modules():
    aliases = {
        "Linear": quant_nn.QuantLinear,
        "Conv1d": quant_nn.QuantConv1d,
        "Conv2d": quant_nn.QuantConv2d,
        "Conv3d": quant_nn.QuantConv3d,
        "ConvTranspose1d": quant_nn.QuantConvTranspose1d,
        "ConvTranspose2d": quant_nn.QuantConvTranspose2d,
        "ConvTranspose3d": quant_nn.QuantConvTranspose3d,
        "MaxPool1d": quant_nn.QuantMaxPool1d,
        "MaxPool2d": quant_nn.QuantMaxPool2d,
        "MaxPool3d": quant_nn.QuantMaxPool3d,
        "AvgPool1d": quant_nn.QuantAvgPool1d,
        "AvgPool2d": quant_nn.QuantAvgPool2d,
        "AvgPool3d": quant_nn.QuantAvgPool3d,
        "AdaptiveAvgPool1d": quant_nn.QuantAdaptiveAvgPool1d,
        "AdaptiveAvgPool2d": quant_nn.QuantAdaptiveAvgPool2d,
        "AdaptiveAvgPool3d": quant_nn.QuantAdaptiveAvgPool3d,
        "LSTM": quant_nn.QuantLSTM,
    }
    for name, cls in aliases.items():
        assert getattr(quant_nn, name) is cls and name in quant_nn.__all__
        float_cls = getattr(nn, name)
        assert quant_nn.QUANT_MODULES[float_cls] is cls and issubclass(cls, float_cls)
    assert len(quant_nn.QUANT_MODULES) == len(aliases)
    assert quant_nn.TensorQuantizer is TensorQuantizer
    assert quant_nn.QuantDescriptor is QuantDescriptor
    with pytest.raises(TypeError):
        quant_nn.QUANT_MODULES[nn.ReLU] = quant_nn.QuantLinear  # read-only


def test_repr_shows_the_quantizers():
    text = repr(quant_nn.QuantConv2d(1, 2, 3))
    assert text.startswith("QuantConv2d(\n  1, 2, kernel_size=(3, 3), stride=(1, 1)\n")
    assert "(_input_quantizer): TensorQuantizer(8bit fake per-tensor amax=dynamic" in text
    assert "(_weight_quantizer): TensorQuantizer(8bit fake axis=(0,) amax=dynamic" in text


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ConfigError, match="QuantConv2d: quant_desc_input must be a QuantDesc"):
        quant_nn.QuantConv2d(1, 1, 1, quant_desc_input={"num_bits": 8})
    with pytest.raises(ConfigError, match="QuantLinear: quant_desc_weight must be"):
        quant_nn.QuantLinear(1, 1, quant_desc_weight="per-channel")
    with pytest.raises(ConfigError, match=r"keeps axis \(2,\).*has 2 dims"):
        quant_nn.QuantLinear(2, 2, quant_desc_weight=QuantDescriptor(axis=2))
    pool = quant_nn.QuantMaxPool2d(2)
    with pytest.raises(ConfigError, match="input_quantizer must be a TensorQuantizer"):
        pool.input_quantizer = nn.Identity()
    with pytest.raises(TypeError):
        quant_nn.QuantMaxPool2d(2, quant_desc_weight=QuantDescriptor())


def test_assigning_a_quantizer_through_the_property_replaces_the_submodule():
    layer = quant_nn.QuantLinear(3, 2)
    four_bit = TensorQuantizer(QuantDescriptor(num_bits=4))
    layer.input_quantizer = four_bit
    assert layer._input_quantizer is four_bit and "input_quantizer" not in layer._modules
    assert [n for n, _ in layer.named_children()] == ["_input_quantizer", "_weight_quantizer"]
