"""Results kept by the exact content they were computed from, so that computing again after
changing something else computes only what changed.

:class:`ContentDigest` digests values (a tensor by its dtype, shape and bytes, anything else by
its ``repr``); :class:`ContentMemo` keeps results by such a digest, the most recently used
first. AdaRound keeps each layer's learned rounding so (``RECENT_ROUNDINGS`` of
``qviz.engine.repair.adaround``: a ``RepairSession`` that rebuilds after a quantizer change
learns again only the layers whose inputs, weights or grid changed), a simulation its
dequantized weights (the ``constants`` of ``qviz.engine.pt2e.simulation.simulated``), and
diagnose its remedy estimates (``qviz.numeric.diagnose.memo``).

Example:
    >>> import torch
    >>> key = ContentDigest().add(torch.ones(2)).add("settings").hexdigest()
    >>> memo = ContentMemo(size=1)
    >>> memo[key] = "a result"
    >>> memo.get(key), memo.get(ContentDigest().add(torch.zeros(2)).hexdigest())
    ('a result', None)
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import torch

from qviz.engine.graph.fingerprint import tensor_bytes


class ContentDigest:
    """A SHA-1 over values added one by one: a tensor by its dtype, shape and bytes (wherever it
    lives), anything else by its ``repr``; each value is closed by a separator, so ``("ab",)``
    and ``("a", "b")`` differ.

    Example:
        >>> a = ContentDigest().add(torch.tensor([1.0, 2.0])).hexdigest()
        >>> b = ContentDigest().add(torch.tensor([1.0, 2.0], dtype=torch.float64)).hexdigest()
        >>> a == ContentDigest().add(torch.tensor([1.0, 2.0])).hexdigest() != b
        True
    """

    def __init__(self) -> None:
        self._sha = hashlib.sha1(usedforsecurity=False)

    def add(self, value: Any) -> ContentDigest:
        """Add ``value``; returns the digest (to chain)."""
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            self._sha.update(f"{t.dtype} {tuple(t.shape)} ".encode())
            self._sha.update(tensor_bytes(t))
        else:
            self._sha.update(repr(value).encode())
        self._sha.update(b"|")
        return self

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class ContentMemo:
    """Results by a content digest, the most recently used ``size`` kept.

    Example:
        >>> memo = ContentMemo(size=2)
        >>> memo["a"], memo["b"], memo["c"] = 1, 2, 3
        >>> memo.get("a"), memo.get("c"), len(memo)
        (None, 3, 2)
    """

    def __init__(self, size: int = 2048) -> None:
        self.size, self._kept = size, OrderedDict()

    def get(self, key: Any) -> Any:
        """The result kept under ``key`` (now the most recently used), or None."""
        if key not in self._kept:
            return None
        self._kept.move_to_end(key)
        return self._kept[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._kept[key] = value
        self._kept.move_to_end(key)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)

    def clear(self) -> None:
        """Forget every result."""
        self._kept.clear()
