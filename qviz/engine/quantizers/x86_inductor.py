"""X86InductorQuantizer: int8 for x86 CPUs through Inductor (``torch.compile``), torchao's recipe.

Activations uint8 per tensor (histogram observer), weights int8 per output channel; the conv /
linear patterns Inductor fuses into one int8 kernel (with add and relu, hardtanh, ...) are
quantized as one, and pooling / cat / flatten run on int8 when their input is int8 (see
:mod:`qviz.engine.quantizers.x86_inductor_patterns`). The settings and their names are
torchao's, so a tutorial ports by changing imports:

1. ``set_module_name_qconfig(name, config)``: patterns all inside the module ``name``;
2. ``set_function_type_qconfig(fn, config)`` / ``set_module_type_qconfig(type, config)``:
   patterns with exactly one node of that operator (``F.conv2d`` / ``nn.Conv2d``: conv2d);
3. ``set_global(config)``: patterns with exactly one default-quantizable operator.

``config=None`` keeps the covered patterns in float. Static, dynamic and QAT configs cannot be
mixed (a warning, and the setting is skipped, as torchao). Every operator left in float records
why in ``node.meta["qviz_float_reason"]`` / ``["qviz_float_detail"]``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2)).eval()
    >>> gm = torch.export.export(model, (torch.randn(1, 3, 8, 8),)).module()
    >>> quantizer = X86InductorQuantizer()
    >>> quantizer = quantizer.set_global(get_default_x86_inductor_quantization_config())
    >>> gm = quantizer.annotate(gm)
    >>> nodes = {n.name: n for n in gm.graph.nodes}
    >>> nodes["relu"].meta["quantization_annotation"]._is_output_of_quantized_pattern
    True
    >>> nodes["max_pool2d"].meta["quantization_annotation"].output_qspec
    SharedQuantizationSpec(edge_or_node=(relu, max_pool2d))
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Node

from qviz.engine.observers import (
    HistogramObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
)
from qviz.engine.observers.fake_quantize import FakeQuantize, FusedMovingAvgObsFakeQuantize
from qviz.engine.quantizers.base import FLOAT_DETAIL_KEY, FLOAT_REASON_KEY, Quantizer
from qviz.engine.quantizers.x86_inductor_fusions import annotate_with_config
from qviz.engine.quantizers.x86_inductor_patterns import (
    QUANTIZABLE,
    aten,
    global_filter,
    module_name_filter,
    operator_filter,
    share_outputs,
)
from qviz.engine.quantizers.x86_inductor_reasons import record_reasons
from qviz.engine.specs import QuantizationConfig, QuantizationSpec
from qviz.errors import ConfigError

_EPS = 2**-12

#: What set_function_type_qconfig / set_module_type_qconfig accept, and their ATen operator.
FUNCTION_TO_ATEN: dict[Any, Any] = {
    F.conv1d: aten.conv1d.default,
    nn.Conv2d: aten.conv2d.default,
    F.conv2d: aten.conv2d.default,
    nn.Linear: aten.linear.default,
    F.linear: aten.linear.default,
    nn.MaxPool2d: aten.max_pool2d.default,
    F.max_pool2d: aten.max_pool2d.default,
    torch.cat: aten.cat.default,
    nn.AvgPool2d: aten.avg_pool2d.default,
    F.avg_pool2d: aten.avg_pool2d.default,
    nn.AdaptiveAvgPool2d: aten.adaptive_avg_pool2d.default,
    F.adaptive_avg_pool2d: aten.adaptive_avg_pool2d.default,
    torch.flatten: aten.flatten.using_ints,
    torch.matmul: aten.matmul.default,
    torch.mul: aten.mul.Tensor,
}


def _activation_ctr(is_qat: bool, is_dynamic: bool) -> Callable[..., Any]:
    if is_qat and is_dynamic:
        observer = MovingAverageMinMaxObserver.with_args(averaging_constant=1)
        return FakeQuantize.with_args(eps=_EPS, observer=observer)
    if is_qat:
        return FusedMovingAvgObsFakeQuantize.with_args(eps=_EPS)
    return (PlaceholderObserver if is_dynamic else HistogramObserver).with_args(eps=_EPS)


@functools.lru_cache
def get_default_x86_inductor_quantization_config(
    is_qat: bool = False, is_dynamic: bool = False, reduce_range: bool = False
) -> QuantizationConfig:
    """uint8 activations per tensor (0..255, or 0..127 with ``reduce_range`` for CPUs without
    VNNI), int8 symmetric weights per output channel, bias float; as torchao's.

    Example:
        >>> config = get_default_x86_inductor_quantization_config()
        >>> config.input_activation.dtype, config.weight.qscheme
        (torch.uint8, torch.per_channel_symmetric)
    """
    act = QuantizationSpec(
        dtype=torch.uint8,
        observer_or_fake_quant_ctr=_activation_ctr(is_qat, is_dynamic),
        quant_min=0,
        quant_max=127 if reduce_range else 255,
        qscheme=torch.per_tensor_affine,
        is_dynamic=is_dynamic,
    )
    if is_qat:
        weight_ctr = FusedMovingAvgObsFakeQuantize.with_args(
            eps=_EPS, observer=MovingAveragePerChannelMinMaxObserver
        )
    else:
        weight_ctr = PerChannelMinMaxObserver.with_args(eps=_EPS)
    weight = QuantizationSpec(
        dtype=torch.int8,
        observer_or_fake_quant_ctr=weight_ctr,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
    )
    return QuantizationConfig(act, act, weight, None, is_qat)


def _mode(configs: list[QuantizationConfig | None]) -> tuple[bool | None, bool | None]:
    """(is_qat, is_dynamic) of the configs set so far (None: not known yet)."""
    qat = dynamic = None
    for config in configs:
        if config is None:
            continue
        qat = config.is_qat if qat is None else qat
        act = config.input_activation
        if act is not None and dynamic is None:
            dynamic = act.is_dynamic
    return qat, dynamic


class X86InductorQuantizer(Quantizer):
    """Annotate an exported graph for Inductor's x86 int8 kernels (see the module docstring).

    Example:
        >>> q = X86InductorQuantizer().set_module_name_qconfig("fc", None)
        >>> q.module_name_qconfig
        {'fc': None}
    """

    module_function_to_aten_operator_type = FUNCTION_TO_ATEN

    def __init__(self) -> None:
        self.global_config: QuantizationConfig | None = None
        self.operator_type_qconfig: dict[Any, QuantizationConfig | None] = {}
        self.module_name_qconfig: dict[str, QuantizationConfig | None] = {}

    def _mixes(self, config: QuantizationConfig | None) -> bool:
        """Whether ``config`` mixes QAT / non-QAT or static / dynamic with those set (warned)."""
        if config is None:
            return False
        qat, dynamic = _mode(
            [
                *self.module_name_qconfig.values(),
                *self.operator_type_qconfig.values(),
                self.global_config,
            ]
        )
        mixed = False
        if qat is not None and qat != config.is_qat:
            warnings.warn(
                "Mixed QAT and Non-QAT quantization config is not supported.", stacklevel=2
            )
            mixed = True
        act = config.input_activation
        if dynamic is not None and act is not None and act.is_dynamic != dynamic:
            warnings.warn(
                "Mixed dynamic and static quantization config is not supported.", stacklevel=2
            )
            mixed = True
        return mixed

    def set_global(self, quantization_config: QuantizationConfig | None) -> X86InductorQuantizer:
        """Config of every pattern no other setting covers.

        Example:
            >>> X86InductorQuantizer().set_global(None).global_config is None
            True
        """
        if self._mixes(quantization_config):
            warnings.warn("Skip the global quantization config.", stacklevel=2)
            return self
        self.global_config = quantization_config
        return self

    def get_global_quantization_config(self) -> QuantizationConfig | None:
        """The global config (a warning when none is set).

        Example:
            >>> cfg = get_default_x86_inductor_quantization_config()
            >>> X86InductorQuantizer().set_global(cfg).get_global_quantization_config() is cfg
            True
        """
        if not isinstance(self.global_config, QuantizationConfig):
            warnings.warn(
                "X86InductorQuantizer has no global config: call set_global(config)", stacklevel=2
            )
        return self.global_config

    def set_function_type_qconfig(
        self, function_type: Callable, quantization_config: QuantizationConfig | None
    ) -> X86InductorQuantizer:
        """Config of patterns with one call of ``function_type`` (``F.conv2d``, ``torch.mul``,
        ``torch.matmul``, ... see :data:`FUNCTION_TO_ATEN`).

        Example:
            >>> q = X86InductorQuantizer().set_function_type_qconfig(torch.matmul, None)
            >>> q.operator_type_qconfig
            {<OpOverload(op='aten.matmul', overload='default')>: None}
        """
        return self._set_operator(function_type, quantization_config, "function")

    def set_module_type_qconfig(
        self, module_type: type, quantization_config: QuantizationConfig | None
    ) -> X86InductorQuantizer:
        """Config of patterns with one call of ``module_type``'s operator (``nn.Conv2d``, ...).

        Example:
            >>> q = X86InductorQuantizer().set_module_type_qconfig(nn.Linear, None)
            >>> list(q.operator_type_qconfig)
            [<OpOverload(op='aten.linear', overload='default')>]
        """
        return self._set_operator(module_type, quantization_config, "module")

    def _set_operator(self, key: Any, config: QuantizationConfig | None, kind: str):
        if self._mixes(config):
            warnings.warn(f"Skip the quantization config for {key}.", stacklevel=2)
            return self
        op = FUNCTION_TO_ATEN.get(key)
        if op is None or op not in QUANTIZABLE:
            known = sorted({getattr(k, "__name__", str(k)) for k in FUNCTION_TO_ATEN})
            warnings.warn(
                f"{kind}: X86InductorQuantizer cannot set a config for {key} (it knows {known})",
                stacklevel=2,
            )
            return self
        self.operator_type_qconfig[op] = config
        return self

    def set_module_name_qconfig(
        self, module_name: str, quantization_config: QuantizationConfig | None
    ) -> X86InductorQuantizer:
        """Config of the patterns all inside the submodule ``module_name`` (``"blocks.sub"``).

        Example:
            >>> X86InductorQuantizer().set_module_name_qconfig("fc", None).module_name_qconfig
            {'fc': None}
        """
        if not isinstance(module_name, str):
            raise ConfigError(
                f"set_module_name_qconfig: module_name must be a str such as 'layer1.0.conv1', "
                f"got {type(module_name).__name__}; for a class use set_module_type_qconfig"
            )
        if self._mixes(quantization_config):
            warnings.warn(f"Skip the quantization config for {module_name}.", stacklevel=2)
            return self
        self.module_name_qconfig[module_name] = quantization_config
        return self

    def annotate(self, model: GraphModule) -> GraphModule:
        """Annotate ``model`` in place, most specific setting first; return it.

        Example: see the module docstring.
        """
        if not isinstance(model, GraphModule):
            raise ConfigError(
                f"X86InductorQuantizer.annotate needs the graph module qviz.export returns, "
                f"got {type(model).__name__}"
            )
        for node in model.graph.nodes:
            node.meta.pop(FLOAT_REASON_KEY, None)
            node.meta.pop(FLOAT_DETAIL_KEY, None)
        for name, config in self.module_name_qconfig.items():
            annotate_with_config(model, config, module_name_filter(name))
        for op, config in self.operator_type_qconfig.items():
            annotate_with_config(model, config, operator_filter(op))
        if self.global_config is not None:
            annotate_with_config(model, self.global_config, global_filter)
        share_outputs(model)
        record_reasons(model, self._setting_of)
        return model

    def _setting_of(self, node: Node) -> str | None:
        """The setting with config None that covers ``node`` (None: none does)."""
        for name, config in self.module_name_qconfig.items():
            if config is None and module_name_filter(name)([node]):
                return f"set_module_name_qconfig({name!r}, None)"
        for op, config in self.operator_type_qconfig.items():
            if config is None and node.target == op:
                return f"set_function_type_qconfig / set_module_type_qconfig ({op}, None)"
        if self.global_config is None:
            return "no global config: call set_global(config) to quantize the rest"
        return None

    def validate(self, model: GraphModule) -> None:
        """Nothing to check beyond what prepare checks (torchao's validate is empty too).

        Example:
            >>> X86InductorQuantizer().validate(None)
        """
