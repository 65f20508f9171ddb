"""Checkpoints of prepared models saved by earlier qviz releases still load (house rule 15).

qviz now names and saves a prepared model's state as torchao does (one
``activation_post_process_<n>`` per observer call, in insertion order; a folded conv's new bias
``<conv>.weight_bias``; no folded BatchNorm state; uniform observers at state_dict version 3).
Earlier releases named one observer per sharing group in plan order, kept the folded bias as
``<conv>.bias`` and saved the folded BatchNorm's state. A prepared model records how those old
keys map to its own (:class:`LegacyNames`, in ``gm.meta``) and a ``load_state_dict`` pre-hook
renames an old checkpoint's keys before torch loads them; a current or torchao checkpoint is
left as it is.

An old checkpoint is recognised by its observers' state_dict version (1; current and torchao's
observers save 3) or, failing that, by keys of this model that only the old names supply.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.MaxPool2d(2))
    >>> gm = qviz.export(model.eval(), (torch.randn(2, 1, 6, 6),))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> names = qviz.prepare_pt2e(gm, q).meta[LEGACY_KEY]
    >>> names.old_key("activation_post_process_3.min_val")  # max pool's output: relu's group
    'activation_post_process_2.min_val'
    >>> names.old_key("0.weight_bias"), names.dropped[0]   # the folded bias; BatchNorm's state
    ('0.bias', '1.bias')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.fx import GraphModule

from qviz.engine.observers.uniform import UniformQuantizationObserverBase
from qviz.engine.pt2e.plan import QuantPlan

#: ``GraphModule.meta`` key of a prepared model's :class:`LegacyNames`.
LEGACY_KEY = "qviz_legacy_names"
_PREFIX = "activation_post_process_"


@dataclass(frozen=True)
class LegacyNames:
    """How a prepared model's state_dict keys were spelled before torchao's naming.

    ``observers`` maps each current observer module name (aliases included) to the group's
    old name; ``dropped`` lists the keys the old format saved that this model no longer has
    (the folded BatchNorm's state, fixed and derived observers' view-only range).
    """

    observers: tuple[tuple[str, str], ...]
    dropped: tuple[str, ...]

    def old_key(self, key: str) -> str | None:
        """The old spelling of the current key ``key``, or None when it did not change."""
        head, _, rest = key.partition(".")
        old = dict(self.observers).get(head)
        if old is not None and rest:
            return f"{old}.{rest}"
        if key.endswith(".weight_bias") or key == "weight_bias":
            return key[: -len("weight_bias")] + "bias"
        return None


def record_legacy_names(gm: GraphModule, plan: QuantPlan, dropped: list[str]) -> None:
    """Record ``gm``'s :class:`LegacyNames` and hook its ``load_state_dict`` to read them."""
    first_seen = list(dict.fromkeys(rec.group for rec in plan.tensors))
    old = {g: f"{_PREFIX}{i}" for i, g in enumerate(first_seen)}
    observers = tuple((name, old[g.group]) for g in plan.groups for name in g.calls)
    quiet = [
        f"{owner}.{name}"
        for owner, module in gm.named_modules()
        for name in getattr(module, "_non_persistent_buffers_set", ())
        if owner.startswith(_PREFIX)
    ]
    gm.meta[LEGACY_KEY] = LegacyNames(observers, tuple(dropped) + tuple(quiet))
    gm._register_load_state_dict_pre_hook(_upgrade, with_module=True)


def _is_legacy(module: GraphModule, state: Any, prefix: str, names: LegacyNames) -> bool:
    metadata = getattr(state, "_metadata", None) or {}
    versions = []
    for key, entry in metadata.items():
        path = key[len(prefix) :]
        if not (key.startswith(prefix + _PREFIX) and path):
            continue
        current = module.get_submodule(path) if _has_submodule(module, path) else None
        if isinstance(current, UniformQuantizationObserverBase):
            versions.append(entry.get("version"))
    if versions and all(v is not None and v < 3 for v in versions):
        return True  # qviz's observers before they saved torchao's version 3
    own = module.state_dict().keys()
    missing = [k for k in own if prefix + k not in state]
    return bool(missing) and all(
        (old := names.old_key(k)) is not None and prefix + old in state for k in missing
    )


def _has_submodule(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _upgrade(module: nn.Module, state: Any, prefix: str, *_: Any) -> None:
    """``load_state_dict`` pre-hook: rename an old checkpoint's keys to this model's."""
    names = module.meta.get(LEGACY_KEY) if isinstance(module, GraphModule) else None
    if names is None or not _is_legacy(module, state, prefix, names):
        return
    original = dict(state)
    own = {prefix + k for k in module.state_dict()}
    renamed = {}
    stale = {k for k in original if k.startswith(prefix + _PREFIX)}  # every old observer key
    stale |= {prefix + k for k in names.dropped}
    for key in own:
        old = names.old_key(key[len(prefix) :])
        if old is not None and prefix + old in original:
            renamed[key] = original[prefix + old]
            stale.add(prefix + old)
    for key in stale - own:
        state.pop(key, None)
    state.update(renamed)
