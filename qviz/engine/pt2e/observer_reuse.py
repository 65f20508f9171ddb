"""Calibrate once, reuse the statistics: fill another prepared model's observers from a
calibrated one, where each observes exactly what a calibrated one observed.

In post-training quantization the observers see the float model's activations: keeping one
layer in float (a :func:`qviz.numeric.fallback` variant) changes no other observer's input. An
observer of a variant is *the same observation* as one of the calibrated model when it is built
from the same spec (its :class:`~qviz.engine.pt2e.plan.SpecSummary`, its class and every plain
attribute it starts with) and is called on the same float tensors, in the same order (the graph
nodes its calls read, through any observer before them). Such an observer's calibrated state is
what calibrating the variant would give it, bit for bit, so a copy of it is taken instead of a
calibration pass. Where any observer of the variant is not such a copy (a sharing group whose
membership changed: a max-pool that shared its input's observer now observes alone), nothing is
filled and the variant is calibrated as usual.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> from qviz.numeric import fallback
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).eval()
    >>> data = [torch.randn(8, 4) for _ in range(2)]
    >>> gm = qviz.export(model, (data[0],))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> full = qviz.prepare_pt2e(gm, q)
    >>> reuse = ObserverReuse(full)  # before calibrating: the observers' starting state
    >>> _ = qviz.calibrate(full, data, progress=False)
    >>> variant = qviz.prepare_pt2e(gm, fallback(q, "linear_1"))
    >>> reuse.fill(variant)  # linear_1 in float: every other observer sees what it saw
    True
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.fx import GraphModule

from qviz.engine.pt2e.plan import require_plan

_Key = tuple[Any, ...]
#: Attributes that name the observer, not what it observes (its label carries its module name).
_NAMING = ("qviz_label",)


def _starting_state(observer: torch.nn.Module) -> tuple[tuple[str, str], ...]:
    """The plain attributes an observer is built with (bins, eps, ranges ...), as text."""
    return tuple(
        (k, repr(v))
        for k, v in sorted(vars(observer).items())
        if not k.startswith("_") and not isinstance(v, torch.Tensor) and k not in _NAMING
    )


def _observation_keys(prepared: GraphModule) -> dict[_Key, Any]:
    """Each calibrated group's key (what makes two observers the same observation) -> group."""
    plan = require_plan(prepared, "ObserverReuse")
    names = plan.observer_names()
    reads: dict[str, list[str]] = {}
    for n in prepared.graph.nodes:
        if n.op == "call_module" and n.target in names:
            src = n.args[0]
            while getattr(src, "op", None) == "call_module" and src.target in names:
                src = src.args[0]
            reads.setdefault(str(n.target), []).append(getattr(src, "name", repr(src)))
    keys: dict[_Key, Any] = {}
    for g in plan.groups:
        observer = getattr(prepared, g.observer, None)
        if g.spec.kind != "observed" or not isinstance(observer, torch.nn.Module):
            continue
        seen = tuple(name for call in g.calls for name in reads.get(call, ()))
        key = (g.spec, type(observer).__qualname__, _starting_state(observer), seen)
        keys[key] = g
    return keys


class ObserverReuse:
    """The observers of a prepared model, to be calibrated, and copies of their calibrated state
    for the variants that observe the same (see the module docstring).

    Args:
        prepared: the model from :func:`qviz.prepare_pt2e`, *before* calibration (its
            observers' starting state is part of what must match); calibrate it afterwards.
            None: none yet (:meth:`add` them).

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer
        >>> from qviz.engine.quantizers import get_symmetric_quantization_config as config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
        >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config()))
        >>> len(ObserverReuse(p))  # its input, weight and output observers
        3
    """

    def __init__(self, prepared: GraphModule | None = None) -> None:
        self._keys: dict[_Key, tuple[GraphModule, Any]] = {}
        if prepared is not None:
            self.add(prepared)

    def add(self, prepared: GraphModule) -> None:
        """Another prepared model (not yet calibrated; calibrate it afterwards) whose observers
        the variants may take copies of: a variant is filled from any mix of the models added
        (each observer from the first model that has its observation)."""
        for key, group in _observation_keys(prepared).items():
            self._keys.setdefault(key, (prepared, group))

    def __len__(self) -> int:
        return len(self._keys)

    def fill(self, variant: GraphModule) -> bool:
        """Give every observer of ``variant`` (prepared, not yet calibrated) a copy of the
        calibrated state of the same observation; True when done. False, with ``variant``
        unchanged, when one of its observers has no such twin: calibrate it then."""
        wanted = _observation_keys(variant)
        if any(key not in self._keys for key in wanted):
            return False
        for key, group in wanted.items():
            source, calibrated = self._keys[key]
            twin = copy.deepcopy(getattr(source, calibrated.observer))
            own = getattr(variant, group.observer)
            for attr in _NAMING:  # the variant's own names for it
                if hasattr(own, attr):
                    setattr(twin, attr, getattr(own, attr))
            for name in group.calls:  # one module under each name the graph calls it by
                setattr(variant, name, twin)
        return True
