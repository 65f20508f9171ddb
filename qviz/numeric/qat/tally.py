"""What the fake-quantize modules saw during a training step: clipped share and mean |x|/scale.

:class:`QATMonitor` keeps, per module, an evenly strided sample of the tensor it fake-quantized
(a copy of at most ``sample`` elements, so no activation is kept alive) and tallies the samples
of all modules at once when the step ends: the samples become the rows of one padded matrix,
each row with its own scale and zero_point (a per-tensor module is one row, a per-channel one a
row per channel), and torch's ``fake_quantize_per_channel_affine_cachemask`` kernel gives the
straight-through mask of every element in one call per ``(device, quant_min, quant_max)``. The
mask is the one torch's backward uses, so "clipped" means exactly "zero gradient". Padding is
zeros, which quantize to the zero_point, inside the grid: it is never counted as clipped.

A module that runs twice before the step ends (gradient accumulation, an evaluation pass) has
its pending sample tallied alone just before its next forward, with the qparams it used.

Example:
    >>> import torch
    >>> rows = torch.tensor([[0.0, 1.0, 9.0]])
    >>> pending = [Pending(name="fq", rows=rows, scale=torch.tensor([1.0]),
    ...     zero_point=torch.tensor([0]), quant_min=-4, quant_max=4)]
    >>> tallies = {"fq": Tally()}
    >>> tally_all(pending, tallies)
    >>> tallies["fq"].shares()  # 9.0 lies outside [-4, 4]; mean |x| / scale = 10 / 3
    (0.3333333333333333, 3.3333333333333335)
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.nn import functional as F

_aten = torch.ops.aten


def sample_rows(x: torch.Tensor, channel_axis: int | None, sample: int | None) -> torch.Tensor:
    """A float32 copy of ``x`` as ``(channels, elements)`` (one row per tensor), every k-th
    element of each row kept so that at most about ``sample`` elements remain (None: all)."""
    x = x.detach()
    if channel_axis is None:
        rows = x.reshape(1, -1)
    else:
        rows = x.movedim(channel_axis, 0).reshape(x.shape[channel_axis], -1)
    if sample is not None and rows.numel() > sample:
        rows = rows[:, :: -(-rows.numel() // sample)]
    return rows.to(torch.float32, copy=True)


@dataclass(kw_only=True)
class Pending:
    """One module's sample waiting to be tallied, with the qparams it was quantized with."""

    name: str
    rows: torch.Tensor  # (R, L) float32: R = 1 per tensor, the channels per channel
    scale: torch.Tensor  # R scales (or one)
    zero_point: torch.Tensor
    quant_min: int
    quant_max: int
    frozen: bool = False  # scale / zero_point copied (the module ran again before the step)


class Tally:
    """Running sums for one module since the last step (Python numbers: no tensor kept)."""

    def __init__(self) -> None:
        self.clipped = 0.0
        self.total = 0
        self.abs_over_scale = 0.0

    def shares(self) -> tuple[float, float]:
        """(clipped share, mean |x| / scale); nan when nothing was tallied."""
        if not self.total:
            return float("nan"), float("nan")
        return self.clipped / self.total, self.abs_over_scale / self.total


def _pad(rows: torch.Tensor, width: int) -> torch.Tensor:
    """``rows`` with zero columns appended up to ``width``."""
    return rows if rows.shape[1] == width else F.pad(rows, (0, width - rows.shape[1]))


def _tally_group(group: list[Pending], tallies: dict[str, Tally]) -> None:
    """One padded matrix, one mask kernel, one read from the device for ``group``."""
    width = max(p.rows.shape[1] for p in group)
    padded = torch.cat([_pad(p.rows, width) for p in group])
    scales = torch.cat([p.scale.reshape(-1).expand(p.rows.shape[0]) for p in group]).float()
    zeros = torch.cat([p.zero_point.reshape(-1).expand(p.rows.shape[0]) for p in group])
    _, mask = _aten.fake_quantize_per_channel_affine_cachemask.default(
        padded, scales, zeros.to(torch.int32), 0, group[0].quant_min, group[0].quant_max
    )  # padding (zeros) lands on the zero_point, inside the grid: never counted as clipped
    kept, over = torch.stack([mask.sum(1, dtype=torch.float32), padded.abs().sum(1) / scales])
    kept, over = kept.tolist(), over.tolist()
    at = 0
    for p in group:
        count, length = p.rows.shape
        tally = tallies[p.name]
        tally.clipped += count * width - math.fsum(kept[at : at + count])  # padding is kept
        tally.abs_over_scale += math.fsum(over[at : at + count])
        tally.total += count * length
        at += count


def tally_all(pending: list[Pending], tallies: dict[str, Tally]) -> None:
    """Add every pending sample to its module's tally, one kernel per (device, grid)."""
    groups: dict[tuple, list[Pending]] = defaultdict(list)
    for p in pending:
        groups[(p.rows.device, p.quant_min, p.quant_max)].append(p)
    for group in groups.values():
        _tally_group(group, tallies)
