"""PyTorch's "(prototype) PyTorch BackendConfig Tutorial", statement for statement, against
torch.ao's FX mode, and every observer argument a QConfig carries, through to the converted ops.

The tutorial's QConfig quantizes activations to ``[0, 127]`` ("we use a quant_max of 127, but
this could be up to 255"); its ``(Conv2d, ReLU)`` config only fuses (the dtypes are on the
``ConvReLU2d`` config); its model is never put in eval mode. Each of its three scenarios runs
through ``prepare_fx`` / ``convert_fx`` as printed and through qviz's ``BackendConfigQuantizer``
with the same objects (torch.ao's, and qviz's classes: "ports by changing imports"): the same
modules quantized with the same qparams. Then each observer argument (quant_min, quant_max, eps,
qscheme, reduce_range, dtype) is varied: the observer prepare builds has FX's attributes, and
the converted quantize / dequantize ops are those of FX's decomposed reference model, range
included, bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch

import qviz
from qviz.engine.backend_config import BackendConfigQuantizer
from qviz.engine.pt2e.plan import FloatReason
from tests.helpers.backend_config import (
    MyModel,
    the_tutorials_backend_config,
    the_tutorials_qconfig_mapping,
    tutorial_api,
)

quantize_fx = pytest.importorskip("torch.ao.quantization.quantize_fx")
from torch.ao.quantization import observer as ao  # noqa: E402

_Q = torch.ops.quantized_decomposed.quantize_per_tensor.default
_DQ = (
    torch.ops.quantized_decomposed.dequantize_per_tensor.default,
    torch.ops.quantized_decomposed.dequantize_per_channel.default,
)
_OBSERVER_ARGS = ("dtype", "qscheme", "quant_min", "quant_max", "reduce_range")


@contextlib.contextmanager
def _quiet():
    """FX mode's deprecation warnings, not what these tests are about."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _qviz(model, mapping, backend, example_inputs):
    prepared = qviz.prepare_pt2e(
        qviz.export(model, example_inputs), BackendConfigQuantizer(backend, mapping)
    )
    observers = list(  # the activations', in graph order (weights are observed too)
        dict.fromkeys(
            prepared.get_submodule(n.target)
            for n in prepared.graph.nodes
            if n.op == "call_module"
            and n.target.startswith("activation_post_process")
            and n.args[0].op != "get_attr"
        )
    )
    if not prepared.plan.groups:
        return prepared, observers, prepared
    qviz.calibrate(prepared, [example_inputs], progress=False)
    return prepared, observers, qviz.convert_pt2e(prepared)


def _activation_qdq(gm):
    """(scale, zero_point, quant_min, quant_max, dtype) of each activation quantize op."""
    return [tuple(n.args[1:]) for n in gm.graph.nodes if n.target == _Q]


# --- the three scenarios, as printed ---------------------------------------------------------

SCENARIOS = {  # use_bn, the tutorial's mapping (False: get_default_qconfig_mapping()), quantized
    "conv-relu": (False, True, {"linear": "QuantizedLinear", "conv": "QuantizedConvReLU2d"}),
    "conv-bn-relu": (True, True, {"linear": "QuantizedLinear"}),
    "default-mapping": (True, False, {}),
}


@pytest.mark.parametrize("library", ["torch.ao", "qviz"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_tutorials_three_scenarios_match_prepare_fx_and_convert_fx(scenario, library):
    use_bn, custom, expected = SCENARIOS[scenario]
    fx_api, api = tutorial_api("torch.ao"), tutorial_api(library)
    torch.manual_seed(0)
    # the tutorial, as printed (the model stays in training mode, as there)
    example_inputs = (torch.rand(1, 3, 10, 10, dtype=torch.float),)
    model = MyModel(use_bn=use_bn)
    backend_config = the_tutorials_backend_config(fx_api)
    qconfig_mapping = (
        the_tutorials_qconfig_mapping(fx_api) if custom else fx_api.get_default_qconfig_mapping()
    )
    with _quiet():
        prepared = quantize_fx.prepare_fx(
            copy.deepcopy(model), qconfig_mapping, example_inputs, backend_config=backend_config
        )
        prepared(*example_inputs)  # calibrate
        converted = quantize_fx.convert_fx(prepared, backend_config=backend_config)
        fx_out = converted(*example_inputs)
    modules = dict(converted.named_modules())
    quantized = {  # as the tutorial's print(converted) names them
        n: m._get_name() for n, m in modules.items() if m._get_name().startswith("Quantized")
    }
    assert quantized == expected  # what the tutorial prints
    fx_qparams = (
        [(float(converted.linear_input_scale_0), int(converted.linear_input_zero_point_0))]
        + [(float(modules[n].scale), int(modules[n].zero_point)) for n in expected]
        if expected
        else []
    )

    # qviz, with the same objects (torch.ao's) or the same statements on qviz's classes
    backend = the_tutorials_backend_config(api)
    mapping = the_tutorials_qconfig_mapping(api) if custom else api.get_default_qconfig_mapping()
    _, _, ours = _qviz(copy.deepcopy(model), mapping, backend, example_inputs)
    plan = ours.plan
    floats = {f.node: f for f in plan.float_nodes}
    ours_quantized = {n for n in ("linear", "conv2d") if n not in floats}
    assert ours_quantized == {{"linear": "linear", "conv": "conv2d"}[n] for n in expected}
    qdq = _activation_qdq(ours)
    assert [(s, z) for s, z, *_ in qdq] == fx_qparams  # the same scales and zero points
    assert all((lo, hi, dtype) == (0, 127, torch.uint8) for _, _, lo, hi, dtype in qdq)
    if not use_bn:  # one step of the grid apart at most: FX runs fbgemm's kernels
        step = max(s for s, _ in fx_qparams)
        assert (ours(*example_inputs) - fx_out).abs().max().item() <= step + 1e-6
    # With use_bn the model's BatchNorm is in training mode (the tutorial never calls eval()):
    # FX runs it on batch statistics, PT2E's prepare (torchao's as qviz's) folds it with its
    # running ones, so the two float functions differ and only what is quantized is compared.

    # where FX says nothing, qviz says why each quantizable node stays float
    assert floats["sigmoid"].reason is FloatReason.PATTERN_UNSUPPORTED
    if scenario == "conv-bn-relu":
        assert "no pattern for (Conv2d, BatchNorm2d, ReLU); closest: (Conv2d, ReLU)" in (
            floats["conv2d"].detail
        )
    if scenario == "default-mapping":
        assert floats["linear"].reason is FloatReason.DTYPE_CONSTRAINT
        assert "below the backend's scale_min_lower_bound=0.000244" in floats["linear"].detail


def test_a_fusing_pattern_whose_fused_module_has_no_config_stays_float_as_in_fx():
    """The tutorial's backend without its ConvReLU2d config: FX fuses conv-relu and then has
    nothing to quantize the ConvReLU2d with; qviz leaves it float too and names the missing
    config (the fusing config's own dtype configs, if it had any, are not what FX uses)."""
    api = tutorial_api("torch.ao")
    full = the_tutorials_backend_config(api)
    backend = api.BackendConfig("my_backend")
    for config in full.configs[:2]:  # Linear and the (Conv2d, ReLU) fusion
        backend.set_backend_pattern_config(config)
    torch.manual_seed(0)
    model, x = MyModel(use_bn=False).eval(), (torch.rand(1, 3, 10, 10),)
    with _quiet():
        fx = quantize_fx.prepare_fx(
            copy.deepcopy(model), the_tutorials_qconfig_mapping(api), x, backend_config=backend
        )
    assert type(fx.conv).__name__ == "ConvReLU2d"
    assert not any("activation_post_process" in str(n.target) for n in fx.graph.nodes if
                   n.prev.target == "conv")  # fmt: skip
    plan = qviz.prepare_pt2e(
        qviz.export(model, x), BackendConfigQuantizer(backend, the_tutorials_qconfig_mapping(api))
    ).plan
    conv = next(f for f in plan.float_nodes if f.node == "conv2d")
    assert conv.reason is FloatReason.PATTERN_UNSUPPORTED
    assert "fuses it into ConvReLU2d (its fuser method) but has no BackendPatternConfig(" in (
        conv.detail
    )


def test_a_fused_patterns_types_with_different_qconfigs_are_refused_as_fx_refuses_them():
    from qviz.errors import ConfigError

    api = tutorial_api("torch.ao")
    qconfig = api.QConfig(api.MinMaxObserver.with_args(eps=2**-12), api.default_weight_observer)
    mapping = api.QConfigMapping().set_object_type(torch.nn.Conv2d, qconfig)  # ReLU left unset
    model, x = MyModel(use_bn=False).eval(), (torch.rand(1, 3, 10, 10),)
    backend = the_tutorials_backend_config(api)
    with _quiet():
        with pytest.raises(LookupError, match="same qconfigs"):
            quantize_fx.prepare_fx(copy.deepcopy(model), mapping, x, backend_config=backend)
    with pytest.raises(ConfigError, match=r"gives Conv2d and ReLU different ones.*ReLU, qconfig"):
        qviz.prepare_pt2e(qviz.export(model, x), BackendConfigQuantizer(backend, mapping))


# --- every observer argument reaches the observer and the converted op ------------------------

_QINT8_ACT = dict(
    dtype=torch.qint8, quant_min_lower_bound=-128, quant_max_upper_bound=127,
    scale_min_lower_bound=2**-12,
)  # fmt: skip
#: id: (observer constructor, the backend's activation DTypeWithConstraints; None: the tutorial's)
ACTIVATIONS = {
    "tutorial": (None, None),
    "full-range": (ao.MinMaxObserver.with_args(quant_min=0, quant_max=255, eps=2**-12), None),
    "narrow-range": (ao.MinMaxObserver.with_args(quant_min=0, quant_max=200, eps=2**-12), None),
    "large-eps": (ao.MinMaxObserver.with_args(quant_min=0, quant_max=127, eps=0.05), None),
    "reduce-range": (ao.MinMaxObserver.with_args(reduce_range=True, eps=2**-12), None),
    "custom-range-reduced": (
        ao.MinMaxObserver.with_args(quant_min=0, quant_max=255, reduce_range=True, eps=2**-12),
        None,
    ),
    "symmetric": (
        ao.MinMaxObserver.with_args(qscheme=torch.per_tensor_symmetric, eps=2**-12),
        None,
    ),
    "symmetric-custom-range": (
        ao.MinMaxObserver.with_args(
            qscheme=torch.per_tensor_symmetric, quant_min=0, quant_max=127, eps=2**-12
        ),
        None,
    ),
    "histogram": (ao.HistogramObserver.with_args(quant_min=0, quant_max=127, eps=2**-12), None),
    "moving-average": (
        ao.MovingAverageMinMaxObserver.with_args(
            quant_min=0, quant_max=127, eps=2**-12, averaging_constant=0.5
        ),
        None,
    ),
    "with-args-chained": (
        ao.MinMaxObserver.with_args(eps=2**-12).with_args(quant_min=0, quant_max=100),
        None,
    ),
    "qint8": (
        ao.MinMaxObserver.with_args(dtype=torch.qint8, quant_min=-100, quant_max=100, eps=2**-12),
        _QINT8_ACT,
    ),
}
WEIGHTS = {
    "narrow-symmetric": ao.MinMaxObserver.with_args(
        dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, quant_min=-127, quant_max=127
    ),
    "reduce-range-affine": ao.MinMaxObserver.with_args(dtype=torch.qint8, reduce_range=True),
    "per-channel": ao.PerChannelMinMaxObserver.with_args(
        dtype=torch.qint8, qscheme=torch.per_channel_symmetric, eps=2**-6
    ),
    "large-eps": ao.MinMaxObserver.with_args(
        dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, eps=0.01
    ),
}
CASES = [(a, None) for a in ACTIVATIONS] + [("tutorial", w) for w in WEIGHTS]


def _weights_fx(reference):
    """Each reference module's weight qparams as the decomposed dequantize op takes them."""
    out = []
    for module in reference.modules():
        if not getattr(module, "is_decomposed", False):
            continue
        per_channel = module.weight_qscheme in (
            torch.per_channel_affine, torch.per_channel_symmetric,
        )  # fmt: skip
        scale, zero_point = module.weight_scale, module.weight_zero_point
        out.append(
            (
                scale.tolist() if per_channel else float(scale),
                zero_point.tolist() if per_channel else int(zero_point),
                *((module.weight_axis_int,) if per_channel else ()),
                module.weight_quant_min,
                module.weight_quant_max,
            )
        )
    return out


def _weights_ours(gm):
    out = []
    for node in gm.graph.nodes:
        if node.target in _DQ and node.args[0].op == "get_attr":
            args = [
                getattr(gm, a.target).tolist() if isinstance(a, torch.fx.Node) else a
                for a in node.args[1:-1]
            ]
            out.append(tuple(args))
    return out


@pytest.mark.parametrize(("activation", "weight"), CASES, ids=[f"{a}-{w}" for a, w in CASES])
def test_every_observer_argument_reaches_the_observer_and_the_converted_op(activation, weight):
    act_ctr, act_dtype = ACTIVATIONS[activation]
    api = tutorial_api("torch.ao")
    dtype = api.DTypeWithConstraints(**act_dtype) if act_dtype else None
    backend = the_tutorials_backend_config(api, dtype)
    mapping = the_tutorials_qconfig_mapping(api, act_ctr, WEIGHTS.get(weight))
    torch.manual_seed(0)
    model = MyModel(use_bn=False).eval()
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(1, 3, 10, 10, generator=g) * 4 - 1,)
    with _quiet():
        prepared = quantize_fx.prepare_fx(copy.deepcopy(model), mapping, x, backend_config=backend)
        fx_observers = [
            m for n, m in prepared.named_modules() if n.startswith("activation_post_process")
        ]
        prepared(*x)
        reference = quantize_fx._convert_to_reference_decomposed_fx(
            prepared, backend_config=backend
        )
    assert len(fx_observers) == 3  # the input, the Linear's and the ConvReLU2d's outputs

    _, observers, ours = _qviz(model, mapping, backend, x)
    # the observers prepare builds are FX's: every argument, the range FX derives from them
    assert len(observers) == len(fx_observers)
    for mine, theirs in zip(observers, fx_observers, strict=True):
        assert type(mine).__name__ == type(theirs).__name__
        for arg in _OBSERVER_ARGS:
            assert getattr(mine, arg) == getattr(theirs, arg), arg
        assert float(mine.eps) == float(theirs.eps)
        assert mine.has_customized_qrange == theirs.has_customized_qrange
    # the converted ops are FX's decomposed reference model's, range included, bit for bit
    fx_qdq = [tuple(n.args[1:]) for n in reference.graph.nodes if n.target == _Q]
    assert _activation_qdq(ours) == fx_qdq
    assert _weights_ours(ours) == _weights_fx(reference)
    assert torch.equal(ours(*x), reference(*x))
