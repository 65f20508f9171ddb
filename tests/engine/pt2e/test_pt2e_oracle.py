"""prepare / calibrate / convert against the reference (torchao 0.18), bit for bit.

Both flows get the same exported graph (each its own copy), the same quantizer (torchao's
XNNPACKQuantizer: qviz accepts torchao quantizers by duck typing) and the same batches; the
converted models must agree bitwise, and so must every scale and zero_point.
"""

import copy
import io

import pytest
import torch
from torch import nn

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.graph.get_attr import get_attr_value
from qviz.errors import CalibrationError, ConfigError
from tests.helpers.quantize import quantize

ref_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ref_xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")

qd = torch.ops.quantized_decomposed


def _ref_quantizer(**config):
    return ref_xnnpack.XNNPACKQuantizer().set_global(
        ref_xnnpack.get_symmetric_quantization_config(**config)
    )


def _qparams(gm: torch.fx.GraphModule) -> set:
    """Every (op, scale, zero_point, quant_min, quant_max, dtype) of the per-tensor q/dq ops.

    A set: the reference duplicates a dequantize for each of its consumers (DuplicateDQPass),
    which changes the node count but not the arithmetic.
    """
    ops = (qd.quantize_per_tensor.default, qd.dequantize_per_tensor.default)
    per_tensor = {
        (n.target.__name__, *n.args[1:])
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target in ops
    }
    per_channel = {
        (
            tuple(get_attr_value(gm, n.args[1]).tolist()),  # every channel's scale
            tuple(get_attr_value(gm, n.args[2]).tolist()),  # and zero_point
            str(get_attr_value(gm, n.args[2]).dtype),
            *n.args[3:],
        )
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target == qd.dequantize_per_channel.default
    }
    return per_tensor | per_channel


def _both(model: nn.Module, batches: list, **config):
    gm = qviz.export(model.eval(), (batches[0],))
    ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), _ref_quantizer(**config))
    for b in batches:
        ref(b)
    ours = quantize(gm, batches, _ref_quantizer(**config)).converted
    return gm, ref_pt2e.convert_pt2e(ref), ours


class Toy(nn.Module):
    """conv-bn-relu, a residual add, cat of two branches, pooling, flatten, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.branch_a, self.branch_b = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = y + self.conv_skip(y)
        y = torch.cat([self.branch_a(y), self.branch_b(y)], 1)
        return self.fc(torch.flatten(self.pool(y), 1))

    def conv_skip(self, y):
        return torch.relu(y) * 0.5


def _toy_batches(n: int = 4) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, 3, 8, 8, generator=g) for _ in range(n)]


@pytest.mark.parametrize("per_channel", [False, True])
def test_digits_model_bitwise(per_channel):
    batches = [b[0] for b in digits_loaders(batch_size=36).calibration]
    _, ref, ours = _both(digits_model(), batches, is_per_channel=per_channel)
    assert _qparams(ours) == _qparams(ref)
    for x in batches:
        assert torch.equal(ours(x), ref(x))


@pytest.mark.parametrize("per_channel", [False, True])
def test_toy_patterns_bitwise(per_channel):
    model = Toy()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so folding matters
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    batches = _toy_batches()
    _, ref, ours = _both(model, batches, is_per_channel=per_channel)
    assert _qparams(ours) == _qparams(ref)
    for x in batches:
        assert torch.equal(ours(x), ref(x))


def test_dynamic_linear_bitwise():
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    batches = [torch.randn(3, 16) for _ in range(3)]
    _, ref, ours = _both(model, batches, is_per_channel=True, is_dynamic=True)
    targets = {n.target for n in ours.graph.nodes if n.op == "call_function"}
    assert qd.choose_qparams.tensor in targets
    for x in batches:
        assert torch.equal(ours(x), ref(x))


def test_the_exported_model_is_never_changed():
    model = digits_model()
    batches = [b[0] for b in digits_loaders(batch_size=36).calibration][:2]
    gm = qviz.export(model, (batches[0],))
    before = {k: v.clone() for k, v in gm.state_dict().items()}
    graph_before = str(gm.graph)
    prepared = qviz.prepare_pt2e(gm, _ref_quantizer())
    qviz.calibrate(prepared, batches, progress=False)
    qviz.convert_pt2e(prepared)
    assert str(gm.graph) == graph_before
    assert all(torch.equal(v, before[k]) for k, v in gm.state_dict().items())
    # the reference folds BatchNorm into the module it is given
    ref_in = qviz.export(model, (batches[0],))
    ref_pt2e.prepare_pt2e(ref_in, _ref_quantizer())
    assert not all(torch.equal(v, before[k]) for k, v in ref_in.state_dict().items() if k in before)


def test_convert_refuses_observers_that_saw_no_data():
    gm = qviz.export(Toy().eval(), (_toy_batches()[0],))
    prepared = qviz.prepare_pt2e(gm, _ref_quantizer())
    message = (
        r"(?s)13 observer\(s\) saw no data.*\n  activation_post_process_0 \(observes x -> conv2d\)"
    )
    with pytest.raises(CalibrationError, match=message):
        qviz.convert_pt2e(prepared)


def test_weights_are_stored_as_int8_and_the_file_shrinks():
    batches = [b[0] for b in digits_loaders(batch_size=36).calibration]
    gm, _, quantized = _both(digits_model(), batches, is_per_channel=True)
    ints = [v for v in quantized.state_dict().values() if v.dtype == torch.int8]
    floats = [v for v in quantized.state_dict().values() if v.is_floating_point()]
    assert sum(v.numel() for v in ints) > 70_000  # every conv/linear weight
    assert sum(v.numel() for v in floats) < 1_000  # biases and per-channel scales remain

    def saved_size(module: nn.Module) -> int:
        buffer = io.BytesIO()
        program = torch.export.export(module, (batches[0],))
        torch.export.save(program, buffer)
        return len(buffer.getvalue())

    def tensor_bytes(module: nn.Module) -> int:
        return sum(v.numel() * v.element_size() for v in module.state_dict().values())

    # the weights take 4x less room; the saved program also holds a graph of fixed size
    assert tensor_bytes(quantized) < tensor_bytes(gm) / 3.5
    assert saved_size(quantized) < saved_size(gm) / 2


def test_saved_program_loads_back_bit_identical(tmp_path):
    batches = [b[0] for b in digits_loaders(batch_size=36).calibration]
    _, _, quantized = _both(digits_model(), batches)
    path = tmp_path / "digits_int8.pt2"
    torch.export.save(torch.export.export(quantized, (batches[0],)), path)
    loaded = torch.export.load(path).module()
    for x in batches:
        assert torch.equal(loaded(x), quantized(x))


def test_plan_is_carried_through_convert_with_qparams():
    batches = [b[0] for b in digits_loaders(batch_size=36).calibration]
    _, ref, quantized = _both(digits_model(), batches)
    plan = quantized.plan
    scales = {g.qparams.scale for g in plan.groups if isinstance(g.qparams.scale, float)}
    ref_scales = {args[1] for args in _qparams(ref)}
    assert scales == ref_scales


def test_calibrate_accepts_the_usual_forms_of_data():
    data = _toy_batches(3)
    gm = qviz.export(Toy().eval(), (data[0],))

    def observed(d, **kw):
        prepared = qviz.prepare_pt2e(gm, _ref_quantizer())
        qviz.calibrate(prepared, d, progress=False, **kw)
        return qviz.convert_pt2e(prepared)(data[0])

    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.cat(data), torch.zeros(6)), batch_size=2
    )
    as_list = observed(data)
    assert torch.equal(observed(loader), as_list)  # (inputs, labels) batches
    assert torch.equal(observed([(x,) for x in data]), as_list)
    assert torch.equal(observed([*data, torch.full((2, 3, 8, 8), 1e3)], max_batches=3), as_list)
    observed(data[0])  # a single tensor is one batch
    with pytest.raises(ConfigError, match="drop_last=True"):
        observed([torch.randn(3, 3, 8, 8)])
    with pytest.raises(CalibrationError, match="no batches"):
        observed([])


torchvision = pytest.importorskip("torchvision")


def _qviz_only(model: nn.Module, batches: list, per_channel: bool):
    """qviz's own XNNPACKQuantizer and observers through qviz; torchao's through torchao."""
    gm = qviz.export(model.eval(), (batches[0],))
    ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), _ref_quantizer(is_per_channel=per_channel))
    for b in batches:
        ref(b)
    return ref_pt2e.convert_pt2e(ref), quantize(gm, batches, per_channel=per_channel).converted


@pytest.mark.parametrize("per_channel", [False, True])
def test_qviz_quantizer_and_observers_end_to_end_digits(per_channel):
    batches = [b[0] for b in digits_loaders(batch_size=36).calibration]
    ref, ours = _qviz_only(digits_model(), batches, per_channel)
    assert _qparams(ours) == _qparams(ref)
    for x in batches:
        assert torch.equal(ours(x), ref(x))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "resnet50"])
def test_qviz_quantizer_and_observers_end_to_end_torchvision(name):
    model = getattr(torchvision.models, name)(weights=None)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(2, 3, 224, 224, generator=g) for _ in range(2)]
    ref, ours = _qviz_only(model, batches, per_channel=True)
    assert _qparams(ours) == _qparams(ref)
    assert torch.equal(ours(batches[1]), ref(batches[1]))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "per_channel"),
    [("resnet18", True), ("resnet18", False), ("mobilenet_v2", True), ("resnet50", True)],
)
def test_torchvision_models_bitwise(name, per_channel):
    """Random weights (fixed seed): degenerate as classifiers, but every op runs."""
    model = getattr(torchvision.models, name)(weights=None)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(2, 3, 224, 224, generator=g) for _ in range(2)]
    _, ref, ours = _both(model, batches, is_per_channel=per_channel)
    assert _qparams(ours) == _qparams(ref)
    assert torch.equal(ours(batches[1]), ref(batches[1]))


@pytest.mark.slow
def test_x86_inductor_quantizer_on_a_strict_export_bitwise():
    """A second reference quantizer (it needs strict export: it reads source_fn_stack)."""
    x86 = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    model = torchvision.models.resnet18(weights=None).eval()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(2, 3, 224, 224, generator=g) for _ in range(2)]
    gm = qviz.export(model, (batches[0],), strict=True)

    def quantizer():
        return x86.X86InductorQuantizer().set_global(
            x86.get_default_x86_inductor_quantization_config()
        )

    ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), quantizer())
    for b in batches:
        ref(b)
    ref_q, ours_q = ref_pt2e.convert_pt2e(ref), quantize(gm, batches, quantizer()).converted
    assert _qparams(ours_q) == _qparams(ref_q)
    assert torch.equal(ours_q(batches[1]), ref_q(batches[1]))


def _prepared_both(model: nn.Module, batches: list, own: bool, per_channel: bool):
    """torchao's and qviz's prepared models, calibrated on ``batches``; qviz's with torchao's
    quantizer or (``own``) its own XNNPACKQuantizer and observers."""
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    gm = qviz.export(model.eval(), (batches[0],))
    ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), _ref_quantizer(is_per_channel=per_channel))
    config = get_symmetric_quantization_config(is_per_channel=per_channel)
    quantizer = (
        XNNPACKQuantizer().set_global(config) if own else _ref_quantizer(is_per_channel=per_channel)
    )
    ours = qviz.prepare_pt2e(gm, quantizer)
    for b in batches:
        ref(b)
    qviz.calibrate(ours, batches, progress=False)
    return gm, ref, ours, quantizer


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize(
    ("make", "own"),
    [("digits", False), ("digits", True), ("toy", False)],
    ids=["digits-torchao_quantizer", "digits-qviz_quantizer", "toy-torchao_quantizer"],
)
def test_observers_are_named_as_torchao_and_state_dicts_load_both_ways(make, per_channel, own):
    """Each observer call is ``activation_post_process_<n>`` in torchao's order, and a shared
    observer is registered under each call's name, as torchao does: the calibrated state_dicts
    have the same keys and values, and each loads into the other's fresh prepared model, which
    then converts to the same model. (qviz's own quantizer also annotates the toy's cat and
    max_pool2d, which torchao's leaves in float: there the models differ by design.)"""
    if make == "digits":
        model, batches = digits_model(), [b[0] for b in digits_loaders(batch_size=36).calibration]
    else:
        model, batches = Toy(), _toy_batches()
    gm, ref, ours, quantizer = _prepared_both(model, batches, own, per_channel)
    ref_state, our_state = ref.state_dict(), ours.state_dict()
    assert sorted(ref_state) == sorted(our_state)
    for key, value in ref_state.items():
        assert torch.equal(value, our_state[key]), key
    fresh_ours = qviz.prepare_pt2e(gm, quantizer)
    fresh_ours.load_state_dict(ref_state)  # torchao's checkpoint into qviz
    fresh_ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), _ref_quantizer(is_per_channel=per_channel))
    fresh_ref.load_state_dict(our_state)  # and qviz's into torchao
    ref_q, ours_q = ref_pt2e.convert_pt2e(fresh_ref), qviz.convert_pt2e(fresh_ours)
    assert _qparams(ours_q) == _qparams(ref_q) == _qparams(qviz.convert_pt2e(ours))
    for x in batches[:2]:
        assert torch.equal(ours_q(x), ref_q(x))
