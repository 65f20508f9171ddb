"""The BackendConfig tutorial's backend, built in either library: only the module differs, which
is the tutorial's "ports by changing imports"."""

from __future__ import annotations

import torch
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
