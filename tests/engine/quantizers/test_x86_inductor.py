"""qviz's X86InductorQuantizer against torchao's (0.18), bit for bit, and on real models.

Both flows get the same exported graph (strict export, as torchao's own tests use: its recipe
finds patterns through the ``source_fn_stack`` that strict export records), qviz's quantizer
with qviz's prepare / calibrate / convert against torchao's quantizer with torchao's
prepare_pt2e / convert_pt2e. The converted graphs must have the same quantize / dequantize ops
in the same places and give torch.equal outputs.
"""

import copy

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)
from qviz.engine.quantizers.x86_inductor_patterns import X86Annotation
from tests.helpers.quantize import quantize

ref_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
xiq = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")

qd = torch.ops.quantized_decomposed
QDQ = {
    qd.quantize_per_tensor.default, qd.dequantize_per_tensor.default,
    qd.quantize_per_tensor.tensor, qd.dequantize_per_tensor.tensor,
    qd.choose_qparams.tensor, qd.quantize_per_channel.default, qd.dequantize_per_channel.default,
}  # fmt: skip


class ConvAddRelu(nn.Module):
    def __init__(self, relu=True, bn=False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6) if bn else nn.Identity()
        self.relu = nn.ReLU() if relu else nn.Identity()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)) + self.conv2(x))


class LinearAdd(nn.Module):
    def __init__(self, relu=True) -> None:
        super().__init__()
        self.fc, self.fc2 = nn.Linear(16, 16), nn.Linear(16, 16)
        self.relu = nn.ReLU() if relu else nn.Identity()

    def forward(self, x):
        return self.relu(self.fc(x) + self.fc2(x))


class PoolCatFlatten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3), nn.Conv2d(3, 4, 3)
        self.relu, self.pool = nn.ReLU(), nn.MaxPool2d(2)
        self.avg = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(32, 5)

    def forward(self, x):
        y = torch.cat([self.pool(self.relu(self.a(x))), self.pool(self.b(x))], 1)
        return self.fc(torch.flatten(self.avg(y), 1))


class Sub(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 3, 1), nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)))


class Named(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Sub(), Sub()

    def forward(self, x):
        return self.second(self.first(x))


def _img(batch=2, size=8):
    return torch.randn(batch, 3, size, size)


MODELS = {
    "conv2d": (lambda: nn.Conv2d(3, 6, 3), _img),
    "conv_bn": (lambda: nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6)), _img),
    "conv_relu": (lambda: nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU()), _img),
    "conv_bn_relu6": (
        lambda: nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU6()),
        _img,
    ),
    "conv_hardswish": (lambda: nn.Sequential(nn.Conv2d(3, 6, 3), nn.Hardswish()), _img),
    "conv_add": (lambda: ConvAddRelu(relu=False), _img),
    "conv_add_relu": (lambda: ConvAddRelu(), _img),
    "conv_bn_add_relu": (lambda: ConvAddRelu(bn=True), _img),
    "linear": (lambda: nn.Linear(16, 8), lambda: torch.randn(4, 16)),
    "linear_relu": (lambda: nn.Sequential(nn.Linear(16, 8), nn.ReLU()), lambda: torch.randn(4, 16)),
    "linear_gelu": (lambda: nn.Sequential(nn.Linear(16, 8), nn.GELU()), lambda: torch.randn(4, 16)),
    "linear_add": (lambda: LinearAdd(relu=False), lambda: torch.randn(4, 16)),
    "linear_add_relu": (lambda: LinearAdd(), lambda: torch.randn(4, 16)),
    "maxpool_cat_flatten": (PoolCatFlatten, _img),
}


def _quantizer(cls, module, **config):
    q = cls.X86InductorQuantizer()
    return q.set_global(cls.get_default_x86_inductor_quantization_config(**config))


def _qdq(gm):
    """Each q/dq op with what it reads and what reads it (op names, no node names)."""

    def kind(n):
        return str(n.target) if n.op == "call_function" else n.op

    return sorted(
        (
            kind(n),
            tuple(kind(a) for a in n.all_input_nodes),
            tuple(sorted(kind(u) for u in n.users)),
        )
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target in QDQ
    )


def _compare(model, batches, ours_q, ref_q, qat=False):
    model = model.train() if qat else model.eval()
    gm = torch.export.export(model, (batches[0],), strict=True).module()
    ref_prepare = ref_pt2e.prepare_qat_pt2e if qat else ref_pt2e.prepare_pt2e
    ours_prepare = qviz.prepare_qat_pt2e if qat else qviz.prepare_pt2e
    ref = ref_prepare(copy.deepcopy(gm), ref_q)
    ours = ours_prepare(copy.deepcopy(gm), ours_q)
    with torch.no_grad():
        for b in batches:
            ref(b)
        qviz.calibrate(ours, batches, progress=False)
    ref, ours = ref_pt2e.convert_pt2e(ref), qviz.convert_pt2e(ours)
    assert _qdq(ours) == _qdq(ref)
    assert sum(n.target in QDQ for n in ours.graph.nodes) > 0
    for b in batches:
        assert torch.equal(ours(b), ref(b))
    return ours


@pytest.mark.parametrize("name", list(MODELS))
def test_static_matches_torchao(name):
    torch.manual_seed(0)
    make, data = MODELS[name]
    batches = [data() for _ in range(3)]
    ours = _compare(
        make(), batches, _quantizer(qviz.engine.quantizers, None), _quantizer(xiq, None)
    )
    flagged = [
        n
        for n in ours.graph.nodes
        if isinstance(n.meta.get("quantization_annotation"), X86Annotation)
    ]
    assert flagged  # qviz's own annotation class survives convert


@pytest.mark.parametrize("name", ["linear", "linear_relu", "linear_add_relu", "conv_relu"])
def test_dynamic_matches_torchao(name):
    torch.manual_seed(0)
    make, data = MODELS[name]
    batches = [data() for _ in range(2)]
    ours = _quantizer(qviz.engine.quantizers, None, is_dynamic=True)
    _compare(make(), batches, ours, _quantizer(xiq, None, is_dynamic=True))


@pytest.mark.parametrize("name", ["conv_bn_relu6", "conv_bn_add_relu", "linear_relu", "conv2d"])
def test_qat_matches_torchao(name):
    torch.manual_seed(0)
    make, data = MODELS[name]
    batches = [data() for _ in range(2)]
    ours = _quantizer(qviz.engine.quantizers, None, is_qat=True)
    _compare(make(), batches, ours, _quantizer(xiq, None, is_qat=True), qat=True)


def _settings(cls, how):
    q = cls.X86InductorQuantizer()
    config = cls.get_default_x86_inductor_quantization_config()
    if how == "module_name":
        return q.set_module_name_qconfig("first", config)
    if how == "module_name_none":
        return q.set_global(config).set_module_name_qconfig("second.fc", None)
    if how == "module_type":
        return q.set_module_type_qconfig(nn.Linear, config)
    return q.set_global(config).set_function_type_qconfig(torch.nn.functional.conv2d, None)


@pytest.mark.parametrize("how", ["module_name", "module_name_none", "module_type", "function_none"])
def test_settings_match_torchao(how):
    torch.manual_seed(0)
    batches = [torch.randn(2, 3, 8, 8) for _ in range(2)]
    _compare(Named(), batches, _settings(qviz.engine.quantizers, how), _settings(xiq, how))


def test_float_nodes_have_reasons():
    gm = qviz.export(Named().eval(), (torch.randn(2, 3, 8, 8),))
    q = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared = qviz.prepare_pt2e(gm, q.set_module_name_qconfig("second", None))
    floats = {f.node: f for f in prepared.plan.float_nodes}
    assert str(floats["linear_1"].reason) == "filtered by module name"
    assert "second" in floats["linear_1"].detail


def _sqnr(ref, out):
    return 10 * torch.log10(ref.pow(2).mean() / (ref - out).pow(2).mean()).item()


def _check_real(model, batches, bound):
    model = model.eval()
    q = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    converted = quantize(model, batches, q).converted
    with torch.no_grad():
        assert _sqnr(model(batches[0]), converted(batches[0])) > bound


def test_transformer_encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    _check_real(model, [torch.randn(2, 10, 64) for _ in range(4)], 15)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2"])
def test_torchvision_models(name):
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    model = getattr(models, name)(weights=None)
    batches = [torch.randn(1, 3, 64, 64) for _ in range(4)]
    with torch.no_grad():  # batch-norm statistics of these inputs: random weights otherwise
        model.train()  # shrink mobilenet_v2's activations to ~1e-10, a meaningless SQNR
        for _ in range(3):
            model(torch.randn(8, 3, 64, 64))
    _check_real(model, batches, 10)


def test_a_post_op_fused_into_a_quantized_conv_is_not_left_in_float():
    """conv -> relu: Inductor runs the relu inside the conv's int8 kernel; the plan records it
    as fused into the conv, not among the operators left in float."""

    class ConvRelu(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return torch.sigmoid(torch.relu(self.conv(x)))

    x = torch.randn(2, 3, 8, 8)
    gm = qviz.export(ConvRelu().eval(), (x,))
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared = qviz.prepare_pt2e(gm, quantizer)
    relu = next(n for n in prepared.graph.nodes if n.target is torch.ops.aten.relu.default)
    assert relu.meta["qviz_fused_into"] == "conv2d"
    floats = {r.node: r for r in prepared.plan.float_nodes}
    assert "relu" not in floats and "sigmoid" in floats  # sigmoid: no int8 recipe
