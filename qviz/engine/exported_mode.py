"""``train()`` and ``eval()`` refused on exported, prepared and converted graph modules.

``torch.export`` records dropout and batch norm in the mode the model was in when it was
captured (``batch_norm(..., training=False)``); ``nn.Module.eval()`` on the graph module only
flips a flag nothing reads. torch.export's own modules refuse both calls; prepare and convert
return copies, so each puts the same refusal on its result, with the reason and the fix.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> try:
    ...     prepared.eval()
    ... except NotImplementedError as e:
    ...     print(type(e).__name__)
    ExportedModeError
"""

from __future__ import annotations

import types

from torch.fx import GraphModule

from qviz.errors import ExportedModeError

__all__ = ["disallow_train_eval"]

_WHY = (
    "train() and eval() do not change an exported graph: its dropout and batch-norm ops were "
    "recorded in the mode the model had when it was exported. Export the model in the mode "
    "you want (model.eval() before qviz.export) and prepare that"
)


def _refuse(self: GraphModule, mode: bool = True) -> GraphModule:
    raise ExportedModeError(f"{type(self).__name__}.train({mode}) / .eval(): {_WHY}")


def disallow_train_eval(gm: GraphModule) -> GraphModule:
    """Make ``gm.train()`` and ``gm.eval()`` raise :class:`~qviz.errors.ExportedModeError`."""
    gm.train = types.MethodType(_refuse, gm)  # type: ignore[method-assign]
    gm.eval = types.MethodType(lambda self: _refuse(self, False), gm)  # type: ignore[method-assign]
    return gm
