"""XNNPACK's quantization configs: symmetric int8 weights, affine int8 activations.

:func:`get_symmetric_quantization_config` builds the same specs as torchao's function of that
name (observer classes, ``eps=2**-12``, ranges), with qviz's observers.
:func:`check_config` rejects configs XNNPACK cannot run, with the fix.

Example:
    >>> config = get_symmetric_quantization_config(is_per_channel=True)
    >>> config.weight.qscheme, config.weight.ch_axis, config.weight.quant_min
    (torch.per_channel_symmetric, 0, -127)
    >>> config.input_activation.observer_or_fake_quant_ctr
    HistogramObserver.with_args(eps=0.000244140625)
    >>> get_symmetric_quantization_config(is_qat=True).weight.observer_or_fake_quant_ctr
    FusedMovingAvgObsFakeQuantize.with_args(eps=0.000244140625, observer=<class 'qviz.engine.observers.minmax.MovingAverageMinMaxObserver'>)
"""  # noqa: E501

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from qviz.engine.observers import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from qviz.engine.observers.fake_quantize import FakeQuantize, FusedMovingAvgObsFakeQuantize
from qviz.engine.specs import QuantizationConfig, QuantizationSpec
from qviz.errors import ConfigError

#: Smallest scale the observers return (as torchao's XNNPACK config).
_EPS = 2**-12
_PER_TENSOR = (torch.per_tensor_affine, torch.per_tensor_symmetric)
_WEIGHT_SCHEMES = (torch.per_tensor_symmetric, torch.per_channel_symmetric, None)


@functools.lru_cache
def get_symmetric_quantization_config(
    is_per_channel: bool = False,
    *,
    is_dynamic: bool = False,
    is_qat: bool = False,
    act_qmin: int = -128,
    act_qmax: int = 127,
    weight_qmin: int = -127,
    weight_qmax: int = 127,
    switchable: bool = False,
) -> QuantizationConfig:
    """int8 config for XNNPACK: activations per-tensor affine, weights symmetric, bias float.

    Args:
        is_per_channel: weights per output channel (``ch_axis=0``) instead of per tensor.
        is_dynamic: activations quantized at run time from each input (dynamic quantization,
            linear only); there is then no output activation spec.
        is_qat: quantization-aware training: fake-quantize modules instead of observers
            (FusedMovingAvgObsFakeQuantize with moving-average min/max observers, as torchao;
            dynamic: FakeQuantize); use with :func:`qviz.prepare_qat_pt2e`.
        act_qmin, act_qmax: activation integer range.
        weight_qmin, weight_qmax: weight integer range (-127..127 keeps the grid symmetric).
        switchable: activation HistogramObservers also keep an |x| histogram, so that every
            calibration method (max, percentile, entropy, mse, l2) can be read, drawn
            (``qviz.viz.histogram``) and chosen after calibration, at about twice the
            observers' cost per batch. A qviz extension; the default matches torchao.

    Everything after ``is_per_channel`` is keyword-only: torchao's function takes ``is_qat``
    second and ``is_dynamic`` third, so a positional call could silently mean something else.

    Returns:
        The config; equal arguments return the same object.

    Raises:
        ConfigError: ``is_qat`` with ``switchable``, or a range that does not fit int8.

    Example:
        >>> dynamic = get_symmetric_quantization_config(is_dynamic=True)
        >>> dynamic.input_activation.is_dynamic, dynamic.output_activation
        (True, None)
        >>> act = get_symmetric_quantization_config(switchable=True).input_activation
        >>> act.observer_or_fake_quant_ctr().switchable
        True
    """
    _check_options(is_qat, switchable)
    activation = _activation_spec(is_dynamic, switchable, act_qmin, act_qmax, is_qat)
    weight = _weight_spec(is_per_channel, weight_qmin, weight_qmax, is_qat)
    output = None if is_dynamic else activation
    config = QuantizationConfig(activation, output, weight, None, is_qat)
    _remember_origin(
        config,
        is_per_channel=is_per_channel,
        is_dynamic=is_dynamic,
        is_qat=is_qat,
        act_qmin=act_qmin,
        act_qmax=act_qmax,
        weight_qmin=weight_qmin,
        weight_qmax=weight_qmax,
        switchable=switchable,
    )
    return config


def _check_options(is_qat: bool, switchable: Any) -> None:
    if not isinstance(switchable, bool):
        raise ConfigError(f"switchable must be True or False, got {switchable!r}")
    if is_qat and switchable:
        raise ConfigError(
            "get_symmetric_quantization_config(is_qat=True, switchable=True): switchable "
            "histograms are for calibration; QAT fake-quantizes with moving-average ranges: "
            "leave switchable out"
        )


def _activation_spec(
    is_dynamic: bool, switchable: bool, qmin: int, qmax: int, is_qat: bool
) -> QuantizationSpec:
    if is_qat and is_dynamic:
        observer = MovingAverageMinMaxObserver.with_args(averaging_constant=1)
        ctr = FakeQuantize.with_args(eps=_EPS, observer=observer)
    elif is_qat:
        ctr = FusedMovingAvgObsFakeQuantize.with_args(eps=_EPS)
    elif is_dynamic:
        ctr = PlaceholderObserver.with_args(eps=_EPS)
    elif switchable:
        ctr = HistogramObserver.with_args(eps=_EPS, switchable=True)
    else:
        ctr = HistogramObserver.with_args(eps=_EPS)
    return QuantizationSpec(
        dtype=torch.int8,
        observer_or_fake_quant_ctr=ctr,
        quant_min=qmin,
        quant_max=qmax,
        qscheme=torch.per_tensor_affine,
        is_dynamic=is_dynamic,
    )


def _weight_spec(is_per_channel: bool, qmin: int, qmax: int, is_qat: bool) -> QuantizationSpec:
    observer = PerChannelMinMaxObserver if is_per_channel else MinMaxObserver
    ctr = observer.with_args(eps=_EPS)
    if is_qat:
        moving = MovingAveragePerChannelMinMaxObserver if is_per_channel else None
        ctr = FusedMovingAvgObsFakeQuantize.with_args(
            eps=_EPS, observer=moving or MovingAverageMinMaxObserver
        )
    return QuantizationSpec(
        dtype=torch.int8,
        observer_or_fake_quant_ctr=ctr,
        quant_min=qmin,
        quant_max=qmax,
        qscheme=torch.per_channel_symmetric if is_per_channel else torch.per_tensor_symmetric,
        ch_axis=0,
        is_dynamic=False,
    )


def _remember_origin(config: QuantizationConfig, **given: Any) -> None:
    """Record the call that built ``config``: only the arguments that differ from the defaults."""
    params = inspect.signature(get_symmetric_quantization_config.__wrapped__).parameters
    args = ", ".join(f"{k}={v!r}" for k, v in given.items() if v != params[k].default)
    _ORIGINS[id(config)] = f"get_symmetric_quantization_config({args})"


#: ``id(config) -> the call that made it``; the lru_cache keeps those configs alive.
_ORIGINS: dict[int, str] = {}


def config_code(config: QuantizationConfig | None) -> str | None:
    """The Python expression that builds ``config``, when it came from this module (else None).

    Example:
        >>> config_code(get_symmetric_quantization_config(is_per_channel=True))
        'get_symmetric_quantization_config(is_per_channel=True)'
        >>> config_code(None)
        'None'
    """
    if config is None:
        return "None"
    return _ORIGINS.get(id(config))


def _check_spec(spec: Any, role: str, where: str, schemes: tuple) -> None:
    if spec is None:
        return
    if not isinstance(spec, QuantizationSpec):
        raise ConfigError(
            f"{where}: the {role} spec is a {type(spec).__name__}; XNNPACKQuantizer needs a "
            f"QuantizationSpec (or None) there"
        )
    if spec.qscheme not in schemes:
        names = ", ".join(str(s) for s in schemes)
        raise ConfigError(
            f"{where}: the {role} spec has qscheme {spec.qscheme}; XNNPACK supports {names} "
            f"there (get_symmetric_quantization_config builds a valid config)"
        )


def check_config(config: Any, where: str, *, allow_none: bool = True) -> None:
    """Raise ConfigError unless ``config`` is a QuantizationConfig XNNPACK can run (or None).

    Activations must be per-tensor, weights symmetric (per tensor or per channel), and the
    bias, if quantized, stays float.

    Example:
        >>> check_config(get_symmetric_quantization_config(), "set_global")
        >>> check_config("int8", "set_global")
        Traceback (most recent call last):
        ...
        qviz.errors.ConfigError: set_global: expected a QuantizationConfig (e.g. get_symmetric_quantization_config()), got str
    """  # noqa: E501
    if config is None and allow_none:
        return
    if not isinstance(config, QuantizationConfig):
        raise ConfigError(
            f"{where}: expected a QuantizationConfig (e.g. get_symmetric_quantization_config()), "
            f"got {type(config).__name__}"
        )
    _check_spec(config.input_activation, "input activation", where, _PER_TENSOR)
    _check_spec(config.output_activation, "output activation", where, _PER_TENSOR)
    _check_spec(config.weight, "weight", where, _WEIGHT_SCHEMES)
    bias = config.bias
    if bias is not None and getattr(bias, "dtype", None) != torch.float:
        raise ConfigError(
            f"{where}: the bias spec must keep bias in torch.float (XNNPACK quantizes bias "
            f"itself); set bias=None"
        )
