"""What a quantizer can quantize, before it sees a model: one record per pattern and dtype choice.

``quantizer.quantization_capabilities()`` answers the PT2E tutorial's question "what does this
(composed) quantizer support?" as plain records: the pattern, how its output is observed, the
input / output / weight / bias dtypes with their constraints, and which setting declares it
(global, a module, an operator; the backend for a BackendConfigQuantizer). ``qviz.viz.capabilities``
shows them as a table.

Example:
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> rows = XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()).quantization_capabilities()
    >>> row = next(r for r in rows if r.pattern == "linear")
    >>> row.input, row.weight, row.observation
    ('int8 [-128, 127] per_tensor_affine', 'int8 [-127, 127] per_tensor_symmetric', 'own observer')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Capability:
    """One pattern a quantizer quantizes, with one combination of dtypes."""

    quantizer: str
    pattern: str
    observation: (
        str  # "own observer", "shares its input's observer", "not observed", "fixed qparams"
    )
    input: str
    output: str
    weight: str
    bias: str
    dynamic: bool = False
    setting: str = "global"


def describe_spec(spec: Any) -> str:
    """``int8 [-128, 127] per_tensor_affine`` (or ``float`` for None, ``fixed scale=...``).

    Example:
        >>> describe_spec(None)
        'float'
    """
    if spec is None:
        return "float"
    if callable(spec) and not hasattr(spec, "dtype"):
        return "derived (int32 from input and weight scales)"
    dtype = str(getattr(spec, "dtype", "")).replace("torch.", "")
    qmin, qmax = getattr(spec, "quant_min", None), getattr(spec, "quant_max", None)
    text = dtype + (f" [{qmin}, {qmax}]" if qmin is not None else "")
    qscheme = getattr(spec, "qscheme", None)
    if qscheme is not None:
        text += " " + str(qscheme).replace("torch.", "")
    if hasattr(spec, "scale") and hasattr(spec, "zero_point"):
        text += f" fixed scale={float(spec.scale):.6g} zp={int(spec.zero_point)}"
    return text
