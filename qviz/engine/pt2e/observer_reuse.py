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

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
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
        # each observation's observer module (calibrated in place after it is added; kept when
        # its model is converted in place) and its group
        self._keys: dict[_Key, tuple[torch.nn.Module, Any]] = {}
        if prepared is not None:
            self.add(prepared)

    def add(self, prepared: GraphModule) -> None:
        """Another prepared model (not yet calibrated; calibrate it afterwards) whose observers
        the variants may take copies of: a variant is filled from any mix of the models added
        (each observer from the first model that has its observation). Its observer modules
        are held, not the model: it may be converted in place once calibrated."""
        for key, group in _observation_keys(prepared).items():
            self._keys.setdefault(key, (getattr(prepared, group.observer), group))

    def __len__(self) -> int:
        return len(self._keys)

    def fill(self, variant: GraphModule) -> bool:
        """Give every observer of ``variant`` (prepared, not yet calibrated) a copy of the
        calibrated state of the same observation; True when done. False, with ``variant``
        unchanged, when one of its observers has no such twin: calibrate it then (or use
        :meth:`fill_known` and calibrate only the rest)."""
        wanted = _observation_keys(variant)
        if any(key not in self._keys for key in wanted):
            return False
        self._filled(variant, wanted)
        return True

    def fill_known(self, variant: GraphModule) -> Filling:
        """Give each observer of ``variant`` that has a twin a copy of its calibrated state;
        what was copied and what is left to calibrate. Calibrate the rest with the copies
        held out (:func:`held_out`), so they see no data twice.

        Example:
            >>> import torch, qviz
            >>> from qviz.engine.quantizers import XNNPACKQuantizer
            >>> from qviz.engine.quantizers import get_symmetric_quantization_config as config
            >>> from qviz.numeric import fallback
            >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).eval()
            >>> data = [torch.randn(8, 4)]
            >>> gm, q = qviz.export(m, (data[0],)), XNNPACKQuantizer().set_global(config())
            >>> partly = qviz.prepare_pt2e(gm, fallback(q, "linear_1"))
            >>> reuse = ObserverReuse(partly)
            >>> _ = qviz.calibrate(partly, data, progress=False)
            >>> full = qviz.prepare_pt2e(gm, q)  # linear_1's weight and output: no twin
            >>> filling = reuse.fill_known(full)
            >>> len(filling.copied), len(filling.left)
            (3, 2)
            >>> with held_out(full, filling.copied):
            ...     _ = qviz.calibrate(full, data, progress=False)
        """
        wanted = _observation_keys(variant)
        known = {key: group for key, group in wanted.items() if key in self._keys}
        copied = self._filled(variant, known)
        left = tuple(group.observer for key, group in wanted.items() if key not in known)
        return Filling(copied=tuple(copied), left=left)

    def _filled(self, variant: GraphModule, groups: dict[_Key, Any]) -> list[str]:
        """Each of ``groups`` (key -> the variant's group) given its twin's copy; the names."""
        names = []
        for key, group in groups.items():
            twin = copy.deepcopy(self._keys[key][0])
            own = getattr(variant, group.observer)
            for attr in _NAMING:  # the variant's own names for it
                if hasattr(own, attr):
                    setattr(twin, attr, getattr(own, attr))
            for name in group.calls:  # one module under each name the graph calls it by
                setattr(variant, name, twin)
                names.append(name)
        return names


class _Passed(torch.nn.Module):
    """Stands in for an observer whose statistics are final: its input, unseen."""

    def forward(self, x: Any) -> Any:
        return x


@dataclass(frozen=True)
class Filling:
    """What :meth:`ObserverReuse.fill_known` did to a variant.

    Attributes:
        copied: the observer module names given a calibrated copy (every name each is called
            by).
        left: the observers (one name each) that have no twin: they still need data.
    """

    copied: tuple[str, ...]
    left: tuple[str, ...]


@contextlib.contextmanager
def held_out(prepared: GraphModule, observers: tuple[str, ...] | list[str]) -> Iterator[None]:
    """Within the block, the observer modules named ``observers`` (every name each is called
    by: :attr:`Filling.copied`) pass their input on unseen; they are put back as they were
    afterwards, also when the block raises.

    A post-training observer returns its input unchanged, so the observers that do see the
    data run through ``prepared`` see exactly what a full calibration pass shows them.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer
        >>> from qviz.engine.quantizers import get_symmetric_quantization_config as config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
        >>> p = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config()))
        >>> with held_out(p, ["activation_post_process_0"]):
        ...     _ = qviz.calibrate(p, [torch.randn(8, 4)], progress=False)
        >>> p.activation_post_process_0.num_batches, p.activation_post_process_2.num_batches
        (0, 1)
    """
    held = {name: getattr(prepared, name) for name in observers}
    for name in held:
        setattr(prepared, name, _Passed())
    try:
        yield
    finally:
        for name, module in held.items():
            setattr(prepared, name, module)
