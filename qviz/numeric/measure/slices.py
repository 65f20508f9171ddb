"""Slice-aware error figures: the worst token and the worst channel of a compared tensor.

A tensor-wide SQNR is dominated by the slices that carry most of the signal: a layer whose one
token (a ViT's CLS token) or a few channels are broken can look fine as a whole. For every
operator, :func:`qviz.numeric.compare` therefore also sums the error per slice of its local
comparison:

* a 3-D ``[batch, tokens, features]`` tensor has tokens (dim 1) and channels (features, dim 2);
* a 2-D ``[batch, features]`` tensor has channels (dim 1);
* a 4-D or larger ``[batch, channels, ...]`` tensor (and a conv's output of any rank) has
  channels (dim 1).

Each slice's SQNR is ``10 log10(sum(ref^2) / sum((ref - test)^2))`` over the slice in every batch;
a slice with almost no signal is skipped: under ``MIN_SIGNAL_SHARE`` (1 %) of the median
signal energy of the slices that have any, as a channel a ReLU leaves nearly dead (the median,
not the mean: where one token sets the range and the others starve, the others are the ones to
show; of the live slices: in a random-weight MobileNet over half a ReLU6's channels are dead).
Such a slice cannot carry a tensor's error to the layers after it (its few small values round
to zero on a grid sized for the other slices, so its own SQNR is near 0 dB whatever the grid),
and ranking it worst would hide the slices that matter. The per-slice sums are exact
(:class:`ExactVector`), so shards merge into one process's figures bit for bit, as the report's
other sums do.

Example:
    >>> import torch
    >>> ref = torch.ones(2, 3, 4)
    >>> test = ref.clone(); test[:, 1] += 0.1  # token 1 is off by 10 %
    >>> s = SliceStats()
    >>> s.update(ref, test)
    >>> s.worst_token(), round(s.worst_token_sqnr(), 1)
    (1, 20.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from qviz.numeric.measure.streaming import BLOCK, blocks

#: A slice is ranked when its signal energy is at least this share of the median slice's.
MIN_SIGNAL_SHARE = 0.01


class ExactVector:
    """Exact float64 sums, one per lane: each lane keeps a non-overlapping expansion (Shewchuk's
    grow-expansion with TwoSum, vectorized over lanes) and is read correctly rounded, so the
    value does not depend on the order of the terms.

    Example:
        >>> a, b = ExactVector(), ExactVector()
        >>> for x in (1e16, 1.0, -1e16):
        ...     a.add(torch.tensor([x, 2 * x], dtype=torch.float64))
        >>> b.add(torch.tensor([1.0, 0.0], dtype=torch.float64))
        >>> a.merge(b); a.values()
        [2.0, 2.0]
        >>> import pickle
        >>> pickle.loads(pickle.dumps(ExactVector())).values()
        []
    """

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: torch.Tensor | None = None  # [components, lanes], smallest first

    def add(self, x: torch.Tensor) -> None:
        """Add one value per lane (a 1-D float64 tensor as long as the lanes)."""
        x = x.detach().to(torch.float64).reshape(-1)
        if self.parts is None:
            self.parts = x.clone()[None]
            return
        rows = []
        for y in self.parts:  # TwoSum: hi + lo == x + y exactly, whatever their magnitudes
            hi = x + y
            b = hi - x
            rows.append((x - (hi - b)) + (y - b))
            x = hi
        rows.append(x)
        parts = torch.stack(rows)
        order = torch.argsort((parts == 0).to(torch.int8), dim=0, stable=True)
        parts = parts.gather(0, order)  # zeros last in each lane, the rest in order
        used = int((parts != 0).any(dim=1).sum())
        self.parts = parts[: max(used, 1)]

    def merge(self, other: ExactVector) -> None:
        """Add another vector's sums (lane by lane)."""
        if other.parts is not None:
            for row in other.parts:
                self.add(row)

    def values(self) -> list[float]:
        """The sums, correctly rounded."""
        if self.parts is None:
            return []
        return [math.fsum(lane) for lane in self.parts.T.tolist()]

    def __getstate__(self) -> tuple[torch.Tensor | None]:
        return (self.parts,)  # never falsy: pickle calls __setstate__ only for a true state

    def __setstate__(self, state: tuple[torch.Tensor | None]) -> None:
        (self.parts,) = state


def _sums(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over every dim but ``dim``, in float64."""
    other = tuple(d for d in range(x.dim()) if d != dim)
    return x.sum(other) if other else x


@dataclass(kw_only=True)
class SliceStats:
    """Per-token and per-channel sums of one comparison (see the module docstring).

    ``channels_first``: the tensor is a conv's output (channels at dim 1 whatever its rank).
    ``token_dim`` / ``channel_dim`` are set by the first batch (None where the tensor has no
    such axis); ``valid`` turns False when a later batch has another number of tokens or
    channels (the figures are then NaN).
    """

    channels_first: bool = False
    token_dim: int | None = None
    channel_dim: int | None = None
    tokens: ExactVector = field(default_factory=ExactVector)  # [ref_sq, err_sq] per token
    channels: ExactVector = field(default_factory=ExactVector)  # [ref_sq, err_sq, err_sum]
    count: int = 0
    sizes: tuple[int, int] = (0, 0)
    valid: bool = True

    def _axes(self, ndim: int) -> tuple[int | None, int | None]:
        if ndim < 2:
            return None, None
        if self.channels_first or ndim >= 4:
            return None, 1
        return (1, 2) if ndim == 3 else (None, 1)

    def update(self, reference: torch.Tensor, test: torch.Tensor) -> None:
        """Add one batch (the float tensor and its quantized counterpart)."""
        if not self.valid or reference.dim() < 2 or reference.shape != test.shape:
            self.valid = self.valid and reference.dim() >= 2 and reference.shape == test.shape
            return
        if not self.count:
            self.token_dim, self.channel_dim = self._axes(reference.dim())
        shape = reference.shape
        sizes = tuple(0 if d is None else shape[d] for d in (self.token_dim, self.channel_dim))
        if self.count and sizes != self.sizes:
            self.valid = False
            return
        self.sizes = sizes  # type: ignore[assignment]
        self.count += reference.numel()
        # a block of whole rows of dim 0 (never a token or channel axis) at a time, so that the
        # float64 temporaries stay small (qviz.numeric.measure.streaming.BLOCK); the batch's
        # float64 sums are then added exactly
        rows = max(1, BLOCK // max(1, reference[0].numel()))
        tokens = channels = None
        for start in blocks(shape[0], rows):
            ref = reference[start : start + rows].detach().double()
            err = test[start : start + rows].detach().to(ref.device).double() - ref
            sq, err_sq = ref.square(), err.square()
            if self.token_dim is not None:
                d = self.token_dim
                part = torch.cat([_sums(sq, d), _sums(err_sq, d)])
                tokens = part if tokens is None else tokens.add_(part)
            if self.channel_dim is not None:
                d = self.channel_dim
                part = torch.cat([_sums(sq, d), _sums(err_sq, d), _sums(err, d)])
                channels = part if channels is None else channels.add_(part)
        if tokens is not None:
            self.tokens.add(tokens.cpu())
        if channels is not None:
            self.channels.add(channels.cpu())

    def merge(self, other: SliceStats) -> None:
        """Add another shard's sums of the same tensor."""
        if not other.count:
            self.valid = self.valid and other.valid
            return
        if self.count and other.sizes != self.sizes:
            self.valid = False
        self.token_dim, self.channel_dim = other.token_dim, other.channel_dim
        self.valid = self.valid and other.valid
        self.sizes = other.sizes
        self.count += other.count
        self.tokens.merge(other.tokens)
        self.channels.merge(other.channels)

    def _worst(self, sums: ExactVector, n: int) -> tuple[float, int]:
        values = sums.values()
        if not self.valid or not values or not n:
            return math.nan, -1
        worst, index = math.inf, -1
        live = sorted(v for v in values[:n] if v > 0.0)  # dead slices do not set the median
        floor = MIN_SIGNAL_SHARE * live[(len(live) - 1) // 2] if live else 0.0
        for i, (signal, noise) in enumerate(zip(values[:n], values[n : 2 * n], strict=True)):
            if signal <= 0.0 or signal < floor:
                continue
            db = math.inf if noise == 0.0 else 10.0 * math.log10(signal / noise)
            if db < worst or index < 0:
                worst, index = db, i
        return (worst, index) if index >= 0 else (math.nan, -1)

    def worst_token_sqnr(self) -> float:
        """dB: the lowest SQNR of a token with signal (see the module docstring; NaN without
        tokens)."""
        return self._worst(self.tokens, self.sizes[0])[0]

    def worst_token(self) -> int:
        """The index of that token (-1 without tokens)."""
        return self._worst(self.tokens, self.sizes[0])[1]

    def worst_channel_sqnr(self) -> float:
        """dB: the lowest SQNR of a channel with signal (see the module docstring; NaN without
        channels)."""
        return self._worst(self.channels, self.sizes[1])[0]

    def worst_channel(self) -> int:
        """The index of that channel (-1 without channels)."""
        return self._worst(self.channels, self.sizes[1])[1]

    def worst_channel_bias_share(self) -> float:
        """The share of the worst channel's own error energy that is its mean error (a constant
        offset: bias correction removes it; NaN without channels)."""
        n, index = self.sizes[1], self.worst_channel()
        values = self.channels.values()
        if index < 0 or not self.count or not values:
            return math.nan
        noise, total = values[n + index], values[2 * n + index]
        return (total * total / (self.count / n)) / noise if noise > 0 else math.nan

    def bias_share(self) -> float:
        """Share of the error energy that is each channel's mean error (a constant offset per
        channel, what bias correction removes): ``sum_c n_c mean_c^2 / sum(err^2)``."""
        values, n = self.channels.values(), self.sizes[1]
        if not self.valid or not values or not n or not self.count:
            return math.nan
        per_channel = self.count / n
        noise = math.fsum(values[n : 2 * n])
        bias = math.fsum(s * s / per_channel for s in values[2 * n : 3 * n])
        return bias / noise if noise > 0 else math.nan
