"""The BackendConfig tutorial's three scenarios on qviz's PT2E engine, with torch.ao's FX mode
(prepare_fx / convert_to_reference_fx) as the reference: the same operators quantized, the
same activation qparams bit for bit, outputs within one quantization step; and a reason for
every node left in float, where FX says nothing.

The backend is built by one function for both libraries: only the module it takes differs,
which is the tutorial's "ports by changing imports".
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import qviz
from qviz.engine import backend_config as qviz_api
from qviz.engine.backend_config.quantizer import BackendConfigQuantizer
from qviz.engine.pt2e.plan import FloatReason
from qviz.errors import ConfigError
from tests.helpers.backend_config import MyModel, constrained_qconfig, tutorial_backend

ao_api = pytest.importorskip("torch.ao.quantization.backend_config")
quantize_fx = pytest.importorskip("torch.ao.quantization.quantize_fx")
ao_qconfig = pytest.importorskip("torch.ao.quantization")

nni, nniqat = torch.ao.nn.intrinsic, torch.ao.nn.intrinsic.qat
nnqr = torch.ao.nn.quantized.reference


def _default_qconfig(api_qconfig):
    return api_qconfig(*ao_qconfig.get_default_qconfig("x86"))


def _fx_flow(model, mapping, backend, batches):
    """FX mode's reference model, and every activation observer's (scale, zero_point), sorted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = quantize_fx.prepare_fx(
            copy.deepcopy(model), mapping, batches[0], backend_config=backend
        )
        for b in batches:
            prepared(*b)
        qparams = sorted(
            tuple(float(v) for v in m.calculate_qparams())
            for name, m in prepared.named_modules()
            if name.startswith("activation_post_process")
        )
        return quantize_fx.convert_to_reference_fx(prepared, backend_config=backend), qparams


def _fx(model, qconfig, batches):
    mapping = ao_qconfig.QConfigMapping().set_global(qconfig(ao_qconfig.QConfig))
    converted, qparams = _fx_flow(model, mapping, tutorial_backend(ao_api), batches)
    quantized = {  # the reference quantized modules (a fused conv-relu's conv is "conv.0")
        name.removesuffix(".0")
        for name, module in converted.named_modules()
        if type(module).__module__.startswith("torch.ao.nn.quantized.reference")
    }
    return converted, qparams, quantized


def _qviz(model, qconfig, batches):
    mapping = qviz_api.QConfigMapping().set_global(qconfig(qviz_api.QConfig))
    gm = qviz.export(model, batches[0])
    prepared = qviz.prepare_pt2e(gm, BackendConfigQuantizer(tutorial_backend(qviz_api), mapping))
    if prepared.plan.groups:
        qviz.calibrate(prepared, batches, progress=False)
        converted = qviz.convert_pt2e(prepared)
    else:
        converted = prepared
    plan = converted.plan
    qparams = sorted(
        (float(g.qparams.scale), float(g.qparams.zero_point))
        for g in plan.groups
        if g.spec.dtype == "quint8"
    )
    floats = {f.node for f in plan.float_nodes}
    quantized = {
        n.meta["nn_module_stack"][next(reversed(n.meta["nn_module_stack"]))][0]
        for n in converted.graph.nodes
        if n.op == "call_function"
        and n.target in (torch.ops.aten.linear.default, torch.ops.aten.conv2d.default)
        and n.name not in floats
    }
    return converted, plan, qparams, quantized


SCENARIOS = {
    "conv-relu": (False, constrained_qconfig, {"linear", "conv"}),
    "conv-bn-relu": (True, constrained_qconfig, {"linear"}),
    "default-qconfig": (False, _default_qconfig, set()),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_tutorials_scenarios_match_fx_mode(name):
    use_bn, qconfig, expected = SCENARIOS[name]
    torch.manual_seed(0)
    model = MyModel(use_bn).eval()
    if use_bn:
        with torch.no_grad():
            model.bn.running_mean.uniform_(-0.2, 0.2)
            model.bn.running_var.uniform_(0.5, 1.5)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.rand(1, 3, 10, 10, generator=g),) for _ in range(3)]
    fx, fx_qparams, fx_quantized = _fx(model, qconfig, batches)
    ours, plan, qparams, quantized = _qviz(model, qconfig, batches)
    assert quantized == fx_quantized == expected
    assert qparams == fx_qparams  # every activation's scale and zero_point, bit for bit
    step = max((s for s, _ in qparams), default=0.0)
    for b in batches:
        diff = (ours(*b) - fx(*b)).abs().max().item()
        assert diff <= step + 1e-6, f"{name}: {diff} > one step {step}"
    # and every quantizable node left in float says why
    reasons = {f.node: (f.reason, f.detail) for f in plan.float_nodes}
    assert "sigmoid" in reasons and reasons["sigmoid"][0] is FloatReason.PATTERN_UNSUPPORTED
    assert "has no pattern for Sigmoid" in reasons["sigmoid"][1]
    if name == "conv-bn-relu":
        reason, detail = reasons["conv2d"]
        assert reason is FloatReason.PATTERN_UNSUPPORTED
        assert "no pattern for (Conv2d, BatchNorm2d, ReLU); closest: (Conv2d, ReLU)" in detail
        reason, detail = reasons["relu"]
        assert detail.startswith("relu: part of (Conv2d, BatchNorm2d, ReLU) at conv2d")
    if name == "default-qconfig":
        reason, detail = reasons["linear"]
        assert reason is FloatReason.DTYPE_CONSTRAINT
        assert "eps=1.19e-07 is below the backend's scale_min_lower_bound=0.000244" in detail
        assert set(reasons) == {"linear", "conv2d", "relu", "sigmoid"}


def test_torch_aos_own_backend_and_mapping_objects_are_accepted():
    torch.manual_seed(0)
    model = MyModel(False).eval()
    x = (torch.rand(1, 3, 10, 10),)
    mapping = ao_qconfig.QConfigMapping().set_global(constrained_qconfig(ao_qconfig.QConfig))
    quantizer = BackendConfigQuantizer(tutorial_backend(ao_api), mapping)
    plan = qviz.prepare_pt2e(qviz.export(model, x), quantizer).plan
    assert {f.node for f in plan.float_nodes} == {"sigmoid"}


def test_a_qconfig_of_none_keeps_that_module_float_and_says_so():
    torch.manual_seed(0)
    model = MyModel(False).eval()
    x = (torch.rand(1, 3, 10, 10),)
    mapping = (
        qviz_api.QConfigMapping()
        .set_global(constrained_qconfig(qviz_api.QConfig))
        .set_module_name("linear", None)
    )
    quantizer = BackendConfigQuantizer(tutorial_backend(qviz_api), mapping)
    plan = qviz.prepare_pt2e(qviz.export(model, x), quantizer).plan
    (linear,) = [f for f in plan.float_nodes if f.node == "linear"]
    assert linear.reason is FloatReason.USER_FALLBACK
    assert "QConfigMapping gives None for Linear at linear" in linear.detail


def test_a_mapping_naming_a_module_the_model_lacks_is_a_config_error():
    mapping = qviz_api.QConfigMapping().set_module_name("linaer", None)
    quantizer = BackendConfigQuantizer(tutorial_backend(qviz_api), mapping)
    gm = qviz.export(MyModel(False).eval(), (torch.rand(1, 3, 10, 10),))
    with pytest.raises(ConfigError, match=r"'linaer'.*closest: \['linear'\]"):
        qviz.prepare_pt2e(gm, quantizer)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_torchvision_models_under_the_x86_backend_match_fx_mode(name):
    """torch.ao's own x86 BackendConfig and default QConfigMapping, random weights with
    warmed-up BatchNorm statistics: every activation's qparams bit for bit and nothing left
    float. The outputs differ by a few steps of the output grid (measured: resnet18 at most 5,
    mean 1.1; mobilenet_v2 at most 2): FX's reference model rounds with torch's native
    ``quantize_per_tensor``, the PT2E format with ``quantized_decomposed`` (``x * (1 / scale)``),
    so a value on a rounding boundary lands one step apart (one input element of the resnet18
    batch does), and a random-weight network amplifies that flip layer after layer."""
    torchvision = pytest.importorskip("torchvision")
    from torch.ao.quantization.backend_config.x86 import get_x86_backend_config

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    with torch.no_grad():
        for _ in range(3):  # BatchNorm statistics of real data-like activations
            model.train()(torch.randn(4, 3, 64, 64))
    model.eval()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 3, 64, 64, generator=g),) for _ in range(3)]
    mapping = ao_qconfig.get_default_qconfig_mapping("x86")
    fx, fx_qparams = _fx_flow(model, mapping, get_x86_backend_config(), batches)
    quantizer = BackendConfigQuantizer(get_x86_backend_config(), mapping)
    prepared = qviz.prepare_pt2e(qviz.export(model, batches[0]), quantizer)
    assert prepared.plan.float_nodes == ()
    qviz.calibrate(prepared, batches, progress=False)
    ours = qviz.convert_pt2e(prepared)
    qparams = sorted(
        (float(gr.qparams.scale), float(gr.qparams.zero_point))
        for gr in ours.plan.groups
        if gr.spec.dtype == "quint8"
    )
    assert qparams == fx_qparams
    (out,) = next(n for n in ours.graph.nodes if n.op == "output").args[0]
    step = ours.plan.group_of_node(out.name).qparams.scale
    for b in batches:
        diff = (ours(*b) - fx(*b)).abs()
        assert diff.max().item() <= 8 * step
        assert diff.mean().item() <= 1.5 * step


def test_an_edit_outside_the_backends_dtype_configs_is_refused_by_validate():
    from qviz.engine.quantizers import OverrideQuantizer
    from qviz.errors import AnnotationError

    torch.manual_seed(0)
    gm = qviz.export(MyModel(False).eval(), (torch.rand(1, 3, 10, 10),))
    mapping = qviz_api.QConfigMapping().set_global(constrained_qconfig(qviz_api.QConfig))
    base = BackendConfigQuantizer(tutorial_backend(qviz_api), mapping)
    edited = OverrideQuantizer(base, {"relu": {"quant_min": 0, "quant_max": 127}})  # in [0, 255]
    assert qviz.prepare_pt2e(gm, edited).plan.group_of("relu").spec.quant_max == 127
    too_wide = OverrideQuantizer(base, {"x -> linear": {"dtype": "int8"}})
    with pytest.raises(AnnotationError, match=r"cannot run Linear as annotated: the annotation's"):
        qviz.prepare_pt2e(gm, too_wide)


def test_a_qconfig_for_the_nth_call_of_a_type_matches_fx_mode():
    """``set_module_name_object_type_order("", nn.Linear, 1, None)``: the second Linear the
    top-level module calls stays float, in FX and in qviz (with the reason)."""

    class TwoLinears(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.second(self.first(x))

    torch.manual_seed(0)
    model = TwoLinears().eval()
    batches = [(torch.rand(2, 4),)]

    def mapping(api_mapping, api_qconfig):
        return (
            api_mapping()
            .set_global(constrained_qconfig(api_qconfig))
            .set_module_name_object_type_order("", nn.Linear, 1, None)
        )

    fx, _ = _fx_flow(
        model, mapping(ao_qconfig.QConfigMapping, ao_qconfig.QConfig), tutorial_backend(ao_api),
        batches,
    )  # fmt: skip
    fx_quantized = {
        n for n, m in fx.named_modules() if type(m).__module__.startswith("torch.ao.nn.quantized")
    }
    quantizer = BackendConfigQuantizer(
        tutorial_backend(qviz_api), mapping(qviz_api.QConfigMapping, qviz_api.QConfig)
    )
    plan = qviz.prepare_pt2e(qviz.export(model, batches[0]), quantizer).plan
    assert fx_quantized == {"first"}
    assert [(f.node, f.reason) for f in plan.float_nodes] == [
        ("linear_1", FloatReason.USER_FALLBACK)
    ]
    assert plan.group_of("linear").spec.dtype == "quint8"  # the first Linear is quantized


def test_a_conv_whose_batch_norm_no_pattern_names_stays_float_where_fx_splits_it():
    """A backend that declares ``nn.Conv2d`` but nothing with ``nn.BatchNorm2d``, on conv ->
    bn -> relu. A deliberate difference from FX: FX quantizes the conv alone and runs the
    BatchNorm in float on its dequantized output. PT2E's prepare folds every eval BatchNorm into
    its conv (torchao's does too), so the node a backend would run is a conv that computes
    conv + BatchNorm, which this backend never declared: qviz leaves it float and names the
    pattern to add. With ``(nn.Conv2d, nn.BatchNorm2d)`` declared, the folded conv is quantized
    and the BatchNorm costs nothing at run time, which FX cannot do without a fuser method."""
    api = qviz_api
    dtypes = tutorial_backend(api).configs[0].dtype_configs[0]

    def backend(api, *patterns):
        b = api.BackendConfig("conv_only")
        for p in patterns:
            b.set_backend_pattern_config(api.BackendPatternConfig(p).add_dtype_config(dtypes))
        return b

    torch.manual_seed(0)
    model = MyModel(True).eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.2, 0.2)
        model.bn.running_var.uniform_(0.5, 1.5)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.rand(1, 3, 10, 10, generator=g),) for _ in range(2)]

    ao_dtypes = ao_api.DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float)
    ao_backend = ao_api.BackendConfig("conv_only")
    for p, ref in ((nn.Linear, nnqr.Linear), (nn.Conv2d, nnqr.Conv2d)):
        ao_backend.set_backend_pattern_config(
            ao_api.BackendPatternConfig(p)
            .add_dtype_config(ao_dtypes)
            .set_root_module(p)
            .set_reference_quantized_module(ref)
        )
    fx_mapping = ao_qconfig.QConfigMapping().set_global(constrained_qconfig(ao_qconfig.QConfig))
    fx, _ = _fx_flow(model, fx_mapping, ao_backend, batches)
    fx_quantized = {
        name
        for name, module in fx.named_modules()
        if type(module).__module__.startswith("torch.ao.nn.quantized.reference")
    }
    assert fx_quantized == {"linear", "conv"}  # FX: the conv alone, BatchNorm in float

    mapping = api.QConfigMapping().set_global(constrained_qconfig(api.QConfig))
    gm = qviz.export(model, batches[0])
    plan = qviz.prepare_pt2e(
        gm, BackendConfigQuantizer(backend(api, nn.Linear, nn.Conv2d), mapping)
    ).plan
    reasons = {f.node: (f.reason, f.detail) for f in plan.float_nodes}
    reason, detail = reasons["conv2d"]
    assert reason is FloatReason.PATTERN_UNSUPPORTED
    assert "backend 'conv_only' has no pattern for (Conv2d, BatchNorm2d, ReLU)" in detail

    fused = backend(api, nn.Linear, (nn.Conv2d, nn.BatchNorm2d))
    prepared = qviz.prepare_pt2e(gm, BackendConfigQuantizer(fused, mapping))
    assert "conv2d" not in {f.node for f in prepared.plan.float_nodes}
    qviz.calibrate(prepared, batches, progress=False)
    converted = qviz.convert_pt2e(prepared)
    assert not any("batch_norm" in str(n.target) for n in converted.graph.nodes)
    for b in batches:  # the folded, quantized conv still computes the float model's function
        assert torch.allclose(converted(*b), model(*b), atol=0.05)
