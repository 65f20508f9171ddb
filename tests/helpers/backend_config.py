"""The BackendConfig tutorial's backend, built in either library: only the module differs, which
is the tutorial's "ports by changing imports"."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.qat  # the tutorial's set_qat_module(torch.nn.qat.Linear)
from torch import nn
from torch.ao.quantization.observer import MinMaxObserver

nni, nniqat = torch.ao.nn.intrinsic, torch.ao.nn.intrinsic.qat
nnqr = torch.ao.nn.quantized.reference


def tutorial_backend(api):
    """The tutorial's backend, in ``api`` (qviz's backend_config or torch.ao's)."""
    act = api.DTypeWithConstraints(
        dtype=torch.quint8, quant_min_lower_bound=0, quant_max_upper_bound=255,
        scale_min_lower_bound=2**-12,
    )  # fmt: skip
    weight = api.DTypeWithConstraints(
        dtype=torch.qint8, quant_min_lower_bound=-128, quant_max_upper_bound=127,
        scale_min_lower_bound=2**-12,
    )  # fmt: skip
    dtypes = api.DTypeConfig(
        input_dtype=act, output_dtype=act, weight_dtype=weight, bias_dtype=torch.float
    )
    different = api.ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT

    def fuse_conv2d_relu(is_qat, conv, relu):
        return nni.ConvReLU2d(conv, relu)

    linear = (
        api.BackendPatternConfig(nn.Linear)
        .set_observation_type(different)
        .add_dtype_config(dtypes)
        .set_root_module(nn.Linear)
        .set_qat_module(torch.ao.nn.qat.Linear)
        .set_reference_quantized_module(nnqr.Linear)
    )
    conv_relu = (
        api.BackendPatternConfig((nn.Conv2d, nn.ReLU))
        .set_observation_type(different)
        .add_dtype_config(dtypes)
        .set_fused_module(nni.ConvReLU2d)
        .set_fuser_method(fuse_conv2d_relu)
    )
    fused_conv_relu = (
        api.BackendPatternConfig(nni.ConvReLU2d)
        .set_observation_type(different)
        .add_dtype_config(dtypes)
        .set_root_module(nn.Conv2d)
        .set_qat_module(nniqat.ConvReLU2d)
        .set_reference_quantized_module(nnqr.Conv2d)
    )
    return (
        api.BackendConfig("my_backend")
        .set_backend_pattern_config(linear)
        .set_backend_pattern_config(conv_relu)
        .set_backend_pattern_config(fused_conv_relu)
    )


class MyModel(nn.Module):
    """The tutorial's model: linear, conv, optional batch norm, relu, sigmoid."""

    def __init__(self, use_bn: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(10, 3)
        self.conv = nn.Conv2d(3, 3, 3)
        self.bn = nn.BatchNorm2d(3)
        self.relu = nn.ReLU()
        self.sigmoid = nn.Sigmoid()
        self.use_bn = use_bn

    def forward(self, x):
        x = self.conv(self.linear(x))
        if self.use_bn:
            x = self.bn(x)
        return self.sigmoid(self.relu(x))


def constrained_qconfig(api_qconfig):
    return api_qconfig(
        activation=MinMaxObserver.with_args(
            dtype=torch.quint8, quant_min=0, quant_max=255, eps=2**-12
        ),
        weight=MinMaxObserver.with_args(
            dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, eps=2**-12
        ),
    )


def tutorial_api(library: str) -> SimpleNamespace:
    """The names the BackendConfig tutorial imports, from torch.ao (``"torch.ao"``) or from qviz
    (``"qviz"``: its ``qviz.engine.backend_config``; the observers stay torch.ao's)."""
    from torch.ao.quantization import default_weight_observer

    if library == "torch.ao":
        from torch.ao.quantization import QConfig, QConfigMapping, get_default_qconfig_mapping
        from torch.ao.quantization import backend_config as configs
    else:
        from qviz.engine import backend_config as configs
        from qviz.engine.backend_config import QConfig, QConfigMapping, get_default_qconfig_mapping
    return SimpleNamespace(
        BackendConfig=configs.BackendConfig,
        BackendPatternConfig=configs.BackendPatternConfig,
        DTypeConfig=configs.DTypeConfig,
        DTypeWithConstraints=configs.DTypeWithConstraints,
        ObservationType=configs.ObservationType,
        QConfig=QConfig,
        QConfigMapping=QConfigMapping,
        get_default_qconfig_mapping=get_default_qconfig_mapping,
        MinMaxObserver=MinMaxObserver,
        default_weight_observer=default_weight_observer,
    )


def the_tutorials_backend_config(api, activation_dtype=None):
    """The tutorial's BackendConfig, statement for statement (its ``\\`` continuations as
    parentheses): ``(Conv2d, ReLU)`` only fuses (no observation type, no dtype configs), its
    ``ConvReLU2d`` config quantizes, the weight dtype has no constraints. ``activation_dtype``
    (not the tutorial's) swaps the activation DTypeWithConstraints for another."""
    quint8_with_constraints = api.DTypeWithConstraints(
        dtype=torch.quint8,
        quant_min_lower_bound=0,
        quant_max_upper_bound=255,
        scale_min_lower_bound=2**-12,
    )
    if activation_dtype is not None:
        quint8_with_constraints = activation_dtype

    # Specify the dtypes passed to the quantized ops in the reference model spec
    weighted_int8_dtype_config = api.DTypeConfig(
        input_dtype=quint8_with_constraints,
        output_dtype=quint8_with_constraints,
        weight_dtype=torch.qint8,
        bias_dtype=torch.float,
    )

    linear_config = (
        api.BackendPatternConfig()
        .set_pattern(torch.nn.Linear)
        .set_observation_type(api.ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
        .add_dtype_config(weighted_int8_dtype_config)
        .set_root_module(torch.nn.Linear)
        .set_qat_module(torch.nn.qat.Linear)
        .set_reference_quantized_module(torch.ao.nn.quantized.reference.Linear)
    )

    def fuse_conv2d_relu(is_qat, conv, relu):
        """Return a fused ConvReLU2d from individual conv and relu modules."""
        return torch.ao.nn.intrinsic.ConvReLU2d(conv, relu)

    # For fusing Conv2d + ReLU into ConvReLU2d
    # No need to set observation type and dtype config here, since we are not
    # inserting quant-dequant ops in this step yet
    conv_relu_config = (
        api.BackendPatternConfig()
        .set_pattern((torch.nn.Conv2d, torch.nn.ReLU))
        .set_fused_module(torch.ao.nn.intrinsic.ConvReLU2d)
        .set_fuser_method(fuse_conv2d_relu)
    )

    # For quantizing ConvReLU2d
    fused_conv_relu_config = (
        api.BackendPatternConfig()
        .set_pattern(torch.ao.nn.intrinsic.ConvReLU2d)
        .set_observation_type(api.ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
        .add_dtype_config(weighted_int8_dtype_config)
        .set_root_module(torch.nn.Conv2d)
        .set_qat_module(torch.ao.nn.intrinsic.qat.ConvReLU2d)
        .set_reference_quantized_module(torch.ao.nn.quantized.reference.Conv2d)
    )

    backend_config = (
        api.BackendConfig("my_backend")
        .set_backend_pattern_config(linear_config)
        .set_backend_pattern_config(conv_relu_config)
        .set_backend_pattern_config(fused_conv_relu_config)
    )
    return backend_config


def the_tutorials_qconfig_mapping(api, activation_observer=None, weight_observer=None):
    """The tutorial's QConfigMapping, statement for statement; ``activation_observer`` /
    ``weight_observer`` (not the tutorial's) replace its two observers."""
    # Define a QConfig that satisfies the constraints specified in DTypeConfig
    # Note: Here we use a quant_max of 127, but this could be up to 255 (see `quint8_with_constraints`)  # noqa: E501
    activation_observer = activation_observer or api.MinMaxObserver.with_args(
        quant_min=0, quant_max=127, eps=2**-12
    )
    qconfig = api.QConfig(
        activation=activation_observer, weight=weight_observer or api.default_weight_observer
    )

    # Note: All individual items of a fused pattern, e.g. Conv2d and ReLU in
    # (Conv2d, ReLU), must have the same QConfig
    qconfig_mapping = (
        api.QConfigMapping()
        .set_object_type(torch.nn.Linear, qconfig)
        .set_object_type(torch.nn.Conv2d, qconfig)
        .set_object_type(torch.nn.BatchNorm2d, qconfig)
        .set_object_type(torch.nn.ReLU, qconfig)
    )
    return qconfig_mapping
