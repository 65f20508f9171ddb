"""Models several benchmarks measure, built one way (benchmarks import this as ``_models``).

Example:
    >>> model, batches = encoder(n_batches=2)
    >>> [tuple(b.shape) for b in batches], sum(p.numel() for p in model.parameters())
    ([(8, 16, 64), (8, 16, 64)], 66944)
"""

from __future__ import annotations

import torch


def encoder(n_batches: int = 4, batch_size: int = 8, seed: int = 1) -> tuple[torch.nn.Module, list]:
    """A 2-layer transformer encoder (d_model 64, 4 heads, MLP 128, no dropout; weights from
    ``torch.manual_seed(0)``) and ``n_batches`` batches of ``batch_size`` x 16 tokens x 64
    (from a generator seeded with ``seed``)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    g = torch.Generator().manual_seed(seed)
    return model, [torch.randn(batch_size, 16, 64, generator=g) for _ in range(n_batches)]
