"""Figures the tests compute the same way in several files."""

from __future__ import annotations

import torch


def output_sqnr(reference, model, batches) -> float:
    """SQNR (dB) of ``model``'s outputs against ``reference``'s over ``(x, target)`` batches,
    summed over every batch before the ratio."""
    num = den = 0.0
    with torch.no_grad():
        for x, _ in batches:
            r = reference(x)
            num += float(r.pow(2).sum())
            den += float((r - model(x)).pow(2).sum())
    return 10 * torch.log10(torch.tensor(num / den)).item()
