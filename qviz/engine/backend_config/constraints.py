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
    >>> act = ObserverFacts(observer="HistogramObserver", dtype=torch.quint8, quant_min=0, quant_max=255, eps=2**-23)
    >>> bounded = DTypeWithConstraints(dtype=torch.quint8, quant_min_lower_bound=0, quant_max_upper_bound=255, scale_min_lower_bound=2**-12)
    >>> dtype_config_problem(DTypeConfig(bounded, bounded), act, None, has_weight=False)
    "the qconfig's activation eps=1.19e-07 is below the backend's scale_min_lower_bound=0.000244 for quint8 (its smallest scale would be smaller than the backend accepts)"
"""  # noqa: E501

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from qviz.engine.backend_config.dtypes import DTypeConfig, DTypeWithConstraints
from qviz.engine.backend_config.observers import ObserverFacts
from qviz.engine.pt2e.passes.observer_to_qdq import FLOAT_DTYPES
from qviz.engine.specs import read_annotation

_FLOAT = (*FLOAT_DTYPES, None)  # None: a tensor left unquantized


def _name(dtype: torch.dtype | None) -> str:
    return str(dtype).replace("torch.", "")


def _bounds_problem(
    role: str, c: DTypeWithConstraints, facts: ObserverFacts, who: str
) -> str | None:
    dtype = _name(c.dtype)
    if c.quant_min_lower_bound is not None and facts.quant_min is not None:
        if facts.quant_min < c.quant_min_lower_bound:
            return (
                f"{who} {role} quant_min={facts.quant_min} is below the backend's "
                f"quant_min_lower_bound={c.quant_min_lower_bound} for {dtype}"
            )
    if c.quant_max_upper_bound is not None and facts.quant_max is not None:
        if facts.quant_max > c.quant_max_upper_bound:
            return (
                f"{who} {role} quant_max={facts.quant_max} is above the backend's "
                f"quant_max_upper_bound={c.quant_max_upper_bound} for {dtype}"
            )
    if c.scale_min_lower_bound is not None and facts.eps is not None and facts.scale is None:
        if facts.eps < c.scale_min_lower_bound:
            return (
                f"{who} {role} eps={facts.eps:.3g} is below the backend's "
                f"scale_min_lower_bound={c.scale_min_lower_bound:.3g} for {dtype} (its smallest "
                f"scale would be smaller than the backend accepts)"
            )
    if c.scale_exact_match is not None or c.zero_point_exact_match is not None:
        if (facts.scale, facts.zero_point) != (c.scale_exact_match, c.zero_point_exact_match):
            return (
                f"the backend runs this pattern only with fixed qparams scale="
                f"{c.scale_exact_match} zero_point={c.zero_point_exact_match} for {dtype}; the "
                f"{who} {role} observer is {facts.observer}"
                + (f" (scale={facts.scale}, zero_point={facts.zero_point})" if facts.scale else "")
                + ": use a FixedQParamsObserver with these values"
            )
    return None


def _dtype_problem(
    role: str, c: DTypeWithConstraints, facts: ObserverFacts | None, who: str
) -> str | None:
    observed = facts.dtype if facts is not None else None
    if c.dtype in _FLOAT and observed in _FLOAT:
        return None
    if observed != c.dtype:
        return f"{who} {role} dtype is {_name(observed)}, the backend's is {_name(c.dtype)}"
    return _bounds_problem(role, c, facts, who) if facts is not None else None


def dtype_config_problem(
    config: DTypeConfig,
    activation: ObserverFacts | None,
    weight: ObserverFacts | None,
    has_weight: bool = True,
    who: str = "the qconfig's",
) -> str | None:
    """Why a QConfig with these ``activation`` / ``weight`` observers does not fit ``config``,
    or None when it does; ``has_weight=False`` for patterns without a weight; ``who`` names
    where the observers come from in the sentence."""
    dynamic = bool(activation is not None and activation.is_dynamic)
    if bool(config.is_dynamic) != dynamic:
        want = "dynamic" if config.is_dynamic else "static"
        return f"the backend runs this pattern {want}, {who} activation is not"
    for role, constraint, facts in (
        ("activation", config.input_dtype_with_constraints, activation),
        ("output activation", config.output_dtype_with_constraints, activation),
        ("weight", config.weight_dtype_with_constraints, weight),
    ):
        if role == "output activation" and config.output_dtype is None:
            continue
        if role == "weight" and not has_weight:
            continue
        problem = _dtype_problem(role, constraint, facts, who)
        if problem is not None:
            return problem
    return None


def spec_facts(spec: Any) -> ObserverFacts | None:
    """The facts of the observer prepare would build for ``spec`` (None: not quantized, or a
    shared / derived spec, checked where its group is defined)."""
    if spec is None or not hasattr(spec, "dtype") or hasattr(spec, "derived_from"):
        return None
    if hasattr(spec, "scale") and hasattr(spec, "zero_point"):
        return ObserverFacts(
            observer="FixedQParamsObserver",
            dtype=spec.dtype,
            quant_min=spec.quant_min,
            quant_max=spec.quant_max,
            scale=float(spec.scale),
            zero_point=int(spec.zero_point),
        )
    from qviz.engine.pt2e.prepare import observer_from_spec

    obs = observer_from_spec(spec, {})
    eps = getattr(obs, "eps", None)
    return ObserverFacts(
        observer=type(obs).__name__,
        dtype=spec.dtype,
        quant_min=getattr(obs, "quant_min", spec.quant_min),
        quant_max=getattr(obs, "quant_max", spec.quant_max),
        eps=float(eps) if isinstance(eps, torch.Tensor) else None,
        is_dynamic=bool(spec.is_dynamic),
    )


#: ATen operator name prefixes of the weighted layers (a weight input; chains like conv-bn-relu)
WEIGHTED_OPS = ("conv", "linear")


def is_weighted(node: Node) -> bool:
    """Whether ``node`` is a conv / linear call (its second argument is a weight)."""
    return getattr(node.target, "__name__", "").startswith(WEIGHTED_OPS)


def weight_of(anchor: Node) -> Node | None:
    """The weight of a conv / linear (a ``get_attr`` as its second argument), else None."""
    if not is_weighted(anchor) or len(anchor.args) < 2:
        return None
    weight = anchor.args[1]
    return weight if isinstance(weight, Node) and weight.op == "get_attr" else None


def annotation_problem(config: Any, anchor: Node, last: Node) -> str | None:
    """Why the annotations of a match (first node ``anchor``, output node ``last``) fit none of
    ``config``'s DTypeConfigs, or None when one fits."""
    annotation = read_annotation(anchor)
    if annotation is None:
        return None
    weight = weight_of(anchor)
    activation = weight_facts = None
    for producer, spec in annotation.input_qspec_map.items():
        if producer is weight:
            weight_facts = spec_facts(spec)
        elif activation is None:
            activation = spec_facts(spec)
    output = read_annotation(last)
    output_facts = spec_facts(output.output_qspec) if output is not None else None
    if activation is None and output_facts is None:
        return None  # left unquantized by an edit: nothing the backend must run
    problems = []
    for dtypes in config.dtype_configs:
        has_weight = weight in annotation.input_qspec_map
        who = "the annotation's"
        problem = dtype_config_problem(
            dtypes, activation or output_facts, weight_facts, has_weight, who
        )
        if problem is None and output_facts is not None and activation is not None:
            problem = dtype_config_problem(dtypes, output_facts, None, False, "the output's")
        if problem is None:
            return None
        problems.append(problem)
    return problems[0] if problems else "the backend declares no DTypeConfig for it"
