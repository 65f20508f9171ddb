"""Does a user's QConfig fit a backend's DTypeConfig? If not, which constraint fails, and why.

The reference's rules (torch.ao FX): the activation observer's dtype must be the pattern's
input and output dtype, the weight observer's its weight dtype, dynamic must agree, and each
DTypeWithConstraints bound must hold: ``quant_min >= quant_min_lower_bound``,
``quant_max <= quant_max_upper_bound``, the observer's ``eps`` (its smallest scale)
``>= scale_min_lower_bound``, and fixed qparams equal ``scale_exact_match`` /
``zero_point_exact_match``. Where the reference silently ignores the QConfig, qviz returns the
sentence a backend author can act on.

Example:
    >>> import torch
    >>> from qviz.engine.backend_config.dtypes import DTypeConfig, DTypeWithConstraints
    >>> from qviz.engine.backend_config.observers import ObserverFacts
    >>> act = ObserverFacts("HistogramObserver", torch.quint8, 0, 255, eps=2**-23)
    >>> bounded = DTypeWithConstraints(torch.quint8, 0, 255, scale_min_lower_bound=2**-12)
    >>> dtype_config_problem(DTypeConfig(bounded, bounded), act, None, has_weight=False)
    "the qconfig's activation eps=1.19e-07 is below the backend's scale_min_lower_bound=0.000244 for quint8 (its smallest scale would be smaller than the backend accepts)"
"""  # noqa: E501

from __future__ import annotations

import torch

from qviz.engine.backend_config.dtypes import DTypeConfig, DTypeWithConstraints
from qviz.engine.backend_config.observers import ObserverFacts

__all__ = ["dtype_config_problem"]

_FLOAT = (torch.float32, torch.float16, torch.bfloat16, torch.float64, None)


def _name(dtype: torch.dtype | None) -> str:
    return str(dtype).replace("torch.", "")


def _bounds_problem(role: str, c: DTypeWithConstraints, facts: ObserverFacts) -> str | None:
    dtype = _name(c.dtype)
    if c.quant_min_lower_bound is not None and facts.quant_min is not None:
        if facts.quant_min < c.quant_min_lower_bound:
            return (
                f"the qconfig's {role} quant_min={facts.quant_min} is below the backend's "
                f"quant_min_lower_bound={c.quant_min_lower_bound} for {dtype}"
            )
    if c.quant_max_upper_bound is not None and facts.quant_max is not None:
        if facts.quant_max > c.quant_max_upper_bound:
            return (
                f"the qconfig's {role} quant_max={facts.quant_max} is above the backend's "
                f"quant_max_upper_bound={c.quant_max_upper_bound} for {dtype}"
            )
    if c.scale_min_lower_bound is not None and facts.eps is not None and facts.scale is None:
        if facts.eps < c.scale_min_lower_bound:
            return (
                f"the qconfig's {role} eps={facts.eps:.3g} is below the backend's "
                f"scale_min_lower_bound={c.scale_min_lower_bound:.3g} for {dtype} (its smallest "
                f"scale would be smaller than the backend accepts)"
            )
    if c.scale_exact_match is not None or c.zero_point_exact_match is not None:
        if (facts.scale, facts.zero_point) != (c.scale_exact_match, c.zero_point_exact_match):
            return (
                f"the backend runs this pattern only with fixed qparams scale="
                f"{c.scale_exact_match} zero_point={c.zero_point_exact_match} for {dtype}; the "
                f"qconfig's {role} observer is {facts.observer}"
                + (f" (scale={facts.scale}, zero_point={facts.zero_point})" if facts.scale else "")
                + ": use a FixedQParamsObserver with these values"
            )
    return None


def _dtype_problem(role: str, c: DTypeWithConstraints, facts: ObserverFacts | None) -> str | None:
    observed = facts.dtype if facts is not None else None
    if c.dtype in _FLOAT and observed in _FLOAT:
        return None
    if observed != c.dtype:
        return f"the qconfig's {role} dtype is {_name(observed)}, the backend's is {_name(c.dtype)}"
    return _bounds_problem(role, c, facts) if facts is not None else None


def dtype_config_problem(
    config: DTypeConfig,
    activation: ObserverFacts | None,
    weight: ObserverFacts | None,
    has_weight: bool = True,
) -> str | None:
    """Why a QConfig with these ``activation`` / ``weight`` observers does not fit ``config``,
    or None when it does; ``has_weight=False`` for patterns without a weight."""
    dynamic = bool(activation is not None and activation.is_dynamic)
    if bool(config.is_dynamic) != dynamic:
        want = "dynamic" if config.is_dynamic else "static"
        return f"the backend runs this pattern {want}, the qconfig's activation is not"
    for role, constraint, facts in (
        ("activation", config.input_dtype_with_constraints, activation),
        ("output activation", config.output_dtype_with_constraints, activation),
        ("weight", config.weight_dtype_with_constraints, weight),
    ):
        if role == "output activation" and config.output_dtype is None:
            continue
        if role == "weight" and not has_weight:
            continue
        problem = _dtype_problem(role, constraint, facts)
        if problem is not None:
            return problem
    return None
