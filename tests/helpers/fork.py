"""Two convs read one ReLU (one mixed-precision unit), then a linear head; and its data."""

from __future__ import annotations

import torch
from torch import nn


class Fork(nn.Module):
    """stem -> relu -> (a, b) -> add -> relu -> mean -> head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.a, self.b = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        z = torch.relu(self.a(y) + self.b(y))
        return self.head(z.mean((2, 3)))


def fork_data() -> tuple[nn.Module, list[torch.Tensor]]:
    """The model (seed 0) and three batches of 8 (seed 1)."""
    torch.manual_seed(0)
    model = Fork().eval()
    g = torch.Generator().manual_seed(1)
    return model, [torch.randn(8, 3, 8, 8, generator=g) for _ in range(3)]
