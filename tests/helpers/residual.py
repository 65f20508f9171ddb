"""A residual block written with or without in-place ops, as torchvision's ResNet writes it."""

from __future__ import annotations

from torch import nn


class Residual(nn.Module):
    """conv -> relu -> conv, plus the input: ``out += x`` and ``relu_`` write into the convs'
    outputs (as torchvision's ResNet blocks do) when ``inplace``."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.inplace = inplace
        self.conv1, self.conv2 = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.relu = nn.ReLU(inplace=inplace)

    def forward(self, x):
        out = self.conv2(self.relu(self.conv1(x)))
        if self.inplace:
            out += x
        else:
            out = out + x
        return self.relu(out)
