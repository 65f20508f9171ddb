"""The BackendConfig vocabulary: the tutorial's backend written with qviz's classes, torch.ao's
shipped configs and mappings read as they are, and a backend author's mistakes named."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn
from torch.ao.quantization import observer as ao_observer

from qviz.engine.backend_config import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    ObservationType,
    QConfig,
    QConfigMapping,
    get_default_qconfig_mapping,
    pattern_name,
)
from qviz.engine.backend_config.observers import observer_spec
from qviz.engine.pt2e.prepare import observer_from_spec
from qviz.errors import ConfigError

ao_backend = pytest.importorskip("torch.ao.quantization.backend_config")


def tutorial_backend() -> BackendConfig:
    """The tutorial's backend: quantized linear and conv-relu, constrained quint8 activations."""
    act = DTypeWithConstraints(
        dtype=torch.quint8,
        quant_min_lower_bound=0,
        quant_max_upper_bound=255,
        scale_min_lower_bound=2**-12,
    )
    weight = DTypeWithConstraints(
        dtype=torch.qint8, quant_min_lower_bound=-128, quant_max_upper_bound=127,
        scale_min_lower_bound=2**-12,
    )  # fmt: skip
    dtypes = DTypeConfig(act, act, weight, torch.float)
    different = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    linear = (
        BackendPatternConfig(nn.Linear)
        .set_observation_type(different)
        .add_dtype_config(dtypes)
        .set_root_module(nn.Linear)
        .set_qat_module(torch.ao.nn.qat.Linear)
        .set_reference_quantized_module(torch.ao.nn.quantized.reference.Linear)
    )

    def fuse_conv2d_relu(is_qat, conv, relu):
        return torch.ao.nn.intrinsic.ConvReLU2d(conv, relu)

    conv_relu = (
        BackendPatternConfig((nn.Conv2d, nn.ReLU))
        .set_observation_type(different)
        .add_dtype_config(dtypes)
        .set_fused_module(torch.ao.nn.intrinsic.ConvReLU2d)
        .set_fuser_method(fuse_conv2d_relu)
    )
    return (
        BackendConfig("my_backend")
        .set_backend_pattern_config(linear)
        .set_backend_pattern_config(conv_relu)
    )


def test_the_tutorials_backend_is_recorded_as_written():
    backend = tutorial_backend()
    assert [pattern_name(c.pattern) for c in backend.configs] == ["Linear", "(Conv2d, ReLU)"]
    linear, conv_relu = backend.configs
    (dtypes,) = linear.dtype_configs
    assert (dtypes.input_dtype, dtypes.output_dtype, dtypes.weight_dtype, dtypes.bias_dtype) == (
        torch.quint8, torch.quint8, torch.qint8, torch.float,
    )  # fmt: skip
    assert dtypes.input_dtype_with_constraints.scale_min_lower_bound == 2**-12
    assert linear.root_module is nn.Linear and conv_relu.fused_module.__name__ == "ConvReLU2d"
    assert "input=quint8 [0, 255] scale >= 0.000244" in repr(dtypes)


def test_a_pattern_set_twice_keeps_the_last_config():
    first = BackendPatternConfig(nn.Linear).add_dtype_config(DTypeConfig(torch.quint8))
    second = BackendPatternConfig(nn.Linear).add_dtype_config(DTypeConfig(torch.qint8))
    backend = BackendConfig().set_backend_pattern_configs([first, second])
    assert backend.configs == [second]


SHIPPED = {
    "native": "get_native_backend_config",
    "fbgemm": "get_fbgemm_backend_config",
    "qnnpack": "get_qnnpack_backend_config",
    "x86": "x86.get_x86_backend_config",
    "onednn": "get_onednn_backend_config",
    "executorch": "executorch.get_executorch_backend_config",
}


@pytest.mark.parametrize("name", SHIPPED)
def test_torch_aos_shipped_backend_configs_are_read_whole(name):
    module, _, function = f"torch.ao.quantization.backend_config.{SHIPPED[name]}".rpartition(".")
    reference = getattr(importlib.import_module(module), function)()
    ours = BackendConfig.of(reference)
    assert len(ours.configs) + len(ours.unread) == len(reference.configs)
    simple = {c.pattern: c for c in reference.configs if c.pattern is not None}
    for config in ours.configs:
        if config.pattern in simple:
            theirs = simple[config.pattern]
            assert config.observation_type.name == theirs.observation_type.name
            assert [repr(DTypeConfig.of(d)) for d in theirs.dtype_configs] == [
                repr(d) for d in config.dtype_configs
            ]
    # only trees the chain matcher cannot express stay unread (onednn's add with a conv-bn arm)
    assert all("MatchAllNode" in text for text in ours.unread)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: BackendPatternConfig("Conv2d"), r"module type goes in as its class"),
        (lambda: BackendPatternConfig(dict), r"dict is a class but not a torch.nn.Module"),
        (lambda: BackendPatternConfig((nn.Conv2d,)), r"two or more elements"),
        (lambda: DTypeConfig(), r"names no dtype"),
        (lambda: DTypeConfig(input_dtype="quint8"), r"input_dtype must be a torch.dtype"),
        (
            lambda: DTypeWithConstraints(
                dtype=torch.quint8, quant_min_lower_bound=10, quant_max_upper_bound=5
            ),
            r"quant_min_lower_bound=10",
        ),
        (lambda: BackendPatternConfig(nn.ReLU).set_observation_type("SHARED"), r"ObservationType"),
        (lambda: BackendConfig().set_backend_pattern_config(BackendPatternConfig()), r"no pattern"),
        (lambda: BackendPatternConfig(nn.ReLU).set_root_module(torch.relu), r"Module class"),
        (lambda: QConfigMapping().set_module_name_regex("conv[", None), r"not a regex"),
        (lambda: QConfigMapping().set_global("default"), r"not a QConfig"),
        (lambda: get_default_qconfig_mapping("tpu"), r"'x86', 'fbgemm'"),
    ],
)
def test_a_backend_authors_mistakes_are_config_errors_that_name_them(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def _qconfig(tag: int) -> QConfig:
    return QConfig(ao_observer.MinMaxObserver.with_args(quant_min=0, quant_max=tag), None)


def test_qconfig_precedence_is_pytorchs():
    g, t, r, n, o = (_qconfig(i) for i in (10, 20, 30, 40, 50))
    mapping = (
        QConfigMapping()
        .set_global(g)
        .set_object_type(nn.Linear, t)
        .set_module_name_regex(r"block\d", r)
        .set_module_name("block1", n)
        .set_module_name_object_type_order("block1.sub", nn.Linear, 0, o)
    )
    assert mapping.qconfig_for("head", nn.Conv2d) is g
    assert mapping.qconfig_for("head", nn.Linear) is t
    assert mapping.qconfig_for("block2.fc", nn.Linear) is r
    assert mapping.qconfig_for("block1.sub.fc", nn.Linear) is n  # an enclosing module's name
    assert mapping.qconfig_for("block1.sub", nn.Linear, 0) is o
    assert mapping.qconfig_for("block1.sub", nn.Linear, 1) is n
    assert mapping.named_modules() == ["block1", "block1.sub"]


def test_torch_aos_default_mapping_is_read_whole():
    from torch.ao.quantization import get_default_qconfig_mapping as ao_default

    reference, ours = ao_default("x86"), get_default_qconfig_mapping("x86")
    assert repr(ours.global_qconfig) == repr(QConfig(*reference.global_qconfig))
    theirs = {k: repr(QConfig(*q) if q else q) for k, q in reference.object_type_qconfigs.items()}
    assert {k: repr(q) for k, q in ours.object_type_qconfigs.items()} == theirs
    assert QConfigMapping.of(ours) is ours


@pytest.mark.parametrize(
    "ctr",
    [
        ao_observer.HistogramObserver.with_args(reduce_range=True),
        ao_observer.MinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric),
        ao_observer.PerChannelMinMaxObserver.with_args(
            dtype=torch.qint8, qscheme=torch.per_channel_symmetric
        ),
        ao_observer.MovingAverageMinMaxObserver.with_args(averaging_constant=0.2),
    ],
    ids=["histogram-reduce-range", "minmax-symmetric", "per-channel", "moving-average"],
)
def test_a_torch_ao_observer_becomes_qvizs_with_the_same_qparams(ctr):
    """What prepare builds from the translated spec computes torch.ao's qparams bit for bit."""
    spec, facts = observer_spec(ctr, "activation")
    ours, theirs = observer_from_spec(spec, {}), ctr()
    assert type(ours).__module__.startswith("qviz.engine.observers")
    assert (facts.quant_min, facts.quant_max) == (theirs.quant_min, theirs.quant_max)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.randn(4, 3, 8, 8, generator=g) * 3
        ours(x)
        theirs(x)
    for a, b in zip(ours.calculate_qparams(), theirs.calculate_qparams(), strict=True):
        assert torch.equal(a, b)


def test_observers_that_observe_nothing_and_fixed_qparams():
    assert observer_spec(ao_observer.NoopObserver, "weight")[0] is None
    placeholder = ao_observer.PlaceholderObserver.with_args(dtype=torch.float16)
    assert observer_spec(placeholder, "activation")[0] is None
    fixed, facts = observer_spec(ao_observer.default_fixed_qparams_range_0to1_observer, "act")
    assert (fixed.scale, fixed.zero_point, facts.observer) == (1 / 256, 0, "FixedQParamsObserver")
    cache: dict = {}
    ctr = ao_observer.MinMaxObserver.with_args(dtype=torch.quint8)
    assert observer_spec(ctr, "a", cache)[0] is observer_spec(ctr, "b", cache)[0]
