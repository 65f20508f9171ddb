"""What XNNPACKQuantizer quantizes, as capability records (see
:mod:`qviz.engine.quantizers.capabilities`).

The patterns are those of the annotators in :mod:`qviz.engine.quantizers.annotators`, in the
order they claim nodes; the dtypes come from each configured setting (global, module name,
module type, operator). A dynamic config covers linear only.

Example:
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_dynamic=True))
    >>> [(r.pattern, r.output, r.dynamic) for r in q.quantization_capabilities()]
    [('linear', 'float', True)]
"""

from __future__ import annotations

from typing import Any

from qviz.engine.quantizers.annotators import FIXED_QPARAMS_OPS, SHARE_OPS
from qviz.engine.quantizers.capabilities import Capability, describe_spec
from qviz.engine.specs import QuantizationConfig

#: The annotators' patterns in claiming order: name, and whether it has a weight.
WEIGHTED = (
    "(conv, batch_norm, relu)", "(conv, batch_norm)", "(conv_transpose, batch_norm, relu)",
    "(conv_transpose, batch_norm)", "(linear, relu)", "linear", "(conv, relu)", "conv",
    "(conv_transpose, relu)",
)  # fmt: skip
ACTIVATION = ("(add, relu)", "add", "(mul, relu)", "mul")
SHARED = ("adaptive_avg_pool2d", "cat")


def _op_name(op: Any) -> str:
    return getattr(op, "__name__", str(op)).split(".")[0]


def _rows(config: QuantizationConfig, setting: str) -> list[Capability]:
    act, out = describe_spec(config.input_activation), describe_spec(config.output_activation)
    weight, bias = describe_spec(config.weight), describe_spec(config.bias)
    dynamic = bool(getattr(config.input_activation, "is_dynamic", False))
    common = {"quantizer": "XNNPACKQuantizer", "dynamic": dynamic, "setting": setting}
    if dynamic:
        return [Capability(pattern="linear", observation="own observer", input=act,
                           output=out, weight=weight, bias=bias, **common)]  # fmt: skip
    rows = [
        Capability(pattern=p, observation="own observer", input=act, output=out,
                   weight=weight, bias=bias, **common)
        for p in WEIGHTED
    ]  # fmt: skip
    rows += [
        Capability(pattern=p, observation="own observer", input=act, output=out,
                   weight="-", bias="-", **common)
        for p in ACTIVATION
    ]  # fmt: skip
    shared_ops = (*SHARED, *dict.fromkeys(_op_name(op) for op in SHARE_OPS))
    rows += [
        Capability(pattern=p, observation="shares its input's observer", input=act,
                   output=act, weight="-", bias="-", **common)
        for p in dict.fromkeys(shared_ops)
    ]  # fmt: skip
    for op, (low, high) in FIXED_QPARAMS_OPS.items():
        rows.append(
            Capability(pattern=_op_name(op), observation=f"fixed qparams for [{low}, {high}]",
                       input=act, output=f"{config.output_activation.dtype} fixed".replace(
                           "torch.", "") if config.output_activation else "float",
                       weight="-", bias="-", **common)
        )  # fmt: skip
    return rows


def xnnpack_capabilities(quantizer: Any) -> list[Capability]:
    """Capability records of an XNNPACKQuantizer's settings (None settings declare nothing)."""
    settings: list[tuple[str, QuantizationConfig | None]] = [("global", quantizer.global_config)]
    settings += [(f"module name {k!r}", c) for k, c in quantizer.module_name_config.items()]
    settings += [
        (f"module type {getattr(k, '__name__', k)}", c)
        for k, c in quantizer.module_type_config.items()
    ]
    settings += [(f"operator {_op_name(k)}", c) for k, c in quantizer.operator_type_config.items()]
    return [row for name, config in settings if config is not None for row in _rows(config, name)]
