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
    >>> pending = [Pending("fq", rows, torch.tensor([1.0]), torch.tensor([0]), -4, 4)]
    >>> tallies = {"fq": Tally()}
    >>> tally_all(pending, tallies)
    >>> tallies["fq"].shares()  # 9.0 lies outside [-4, 4]; mean |x| / scale = 10 / 3
    (0.3333333333333333, 3.3333333333333335)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

__all__ = ["Pending", "Tally", "sample_rows", "tally_all"]

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


@dataclass
class Pending:
    """One module's sample waiting to be tallied, with the qparams it was quantized with."""

    name: str
    rows: torch.Tensor  # (R, L) float32: R = 1 per tensor, the channels per channel
    scale: torch.Tensor  # R scales (or one)
    zero_point: torch.Tensor
    quant_min: int
    quant_max: int


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


def _tally_group(group: list[Pending], tallies: dict[str, Tally]) -> None:
    """One padded matrix, one mask kernel, one read from the device for ``group``."""
    rows = [row for p in group for row in p.rows.unbind(0)]
    padded = pad_sequence(rows, batch_first=True)
    scales = torch.cat([p.scale.reshape(-1).expand(p.rows.shape[0]) for p in group]).float()
    zeros = torch.cat([p.zero_point.reshape(-1).expand(p.rows.shape[0]) for p in group])
    _, mask = _aten.fake_quantize_per_channel_affine_cachemask.default(
        padded, scales, zeros.to(torch.int32), 0, group[0].quant_min, group[0].quant_max
    )
    per_row = torch.stack([(~mask).sum(1, dtype=torch.float32), padded.abs().sum(1) / scales])
    owner = torch.repeat_interleave(
        torch.arange(len(group), device=padded.device),
        torch.tensor([p.rows.shape[0] for p in group], device=padded.device),
    )
    per_module = torch.zeros(2, len(group), device=padded.device).index_add_(1, owner, per_row)
    for p, (clipped, over) in zip(group, per_module.T.tolist(), strict=True):
        tally = tallies[p.name]
        tally.clipped += clipped
        tally.abs_over_scale += over
        tally.total += p.rows.numel()


def tally_all(pending: list[Pending], tallies: dict[str, Tally]) -> None:
    """Add every pending sample to its module's tally, one kernel per (device, grid)."""
    groups: dict[tuple, list[Pending]] = defaultdict(list)
    for p in pending:
        groups[(p.rows.device, p.quant_min, p.quant_max)].append(p)
    for group in groups.values():
        _tally_group(group, tallies)
