"""Old import paths of modules that moved, kept so that code and pickles written before the move
still resolve.

Each alias module in this folder (and the public ones at the engine's root: ``tensor_quant``,
``quant_nn``, ``quant_modules``, ``calib``) makes its old name *the same module object* as the new
one, submodules included, so classes are never defined twice and ``isinstance`` holds across the
two names. ``qviz.engine`` lists this folder in its ``__path__``: ``torch.load`` of a model saved
before the move finds ``qviz.engine.tensor_quantizer.TensorQuantizer`` here.

Example:
    >>> import qviz.engine.tensor_quantizer as old, qviz.engine.tensor.tensor_quantizer as new
    >>> old is new
    True
"""

from __future__ import annotations

import importlib
import sys


def alias(old: str, new: str) -> None:
    """Make module ``old`` (and each of its submodules) the module ``new`` in ``sys.modules``.

    Called by an alias module with its own ``__name__``; the import system then hands out the
    new module under the old name.
    """
    shell = sys.modules.get(old)
    module = importlib.import_module(new)
    sys.modules[old] = module
    if shell is not None and shell is not module:
        # a loader that keeps its own module object (pytest's importlib mode) still sees the
        # new module's names, the same objects
        names = getattr(module, "__all__", None) or [n for n in vars(module) if n[0] != "_"]
        for name in names:
            setattr(shell, name, getattr(module, name))
    prefix = new + "."
    for name, sub in list(sys.modules.items()):
        if name.startswith(prefix):
            sys.modules[old + name[len(new) :]] = sub
