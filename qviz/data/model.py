"""DigitsNet: the small CNN of the embedded default (about 75k parameters).

conv-bn-relu stem, one residual block (two conv-bn, an add, a ReLU), max pooling, two more
conv-bn-relu blocks, global average pooling and a linear head: every pattern a quantizer has to
handle, in a model that trains in seconds.

Example:
    >>> import torch
    >>> model = DigitsNet()
    >>> model(torch.zeros(2, 1, 8, 8)).shape
    torch.Size([2, 10])
    >>> sum(p.numel() for p in model.parameters())
    75114
"""

from __future__ import annotations

import torch
from torch import nn


class ConvBNReLU(nn.Sequential):
    """3x3 convolution (no bias), BatchNorm, ReLU."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        )


class ResidualBlock(nn.Module):
    """conv-bn-relu, conv-bn, add the input, ReLU."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + x)


class DigitsNet(nn.Module):
    """The embedded default model: 8x8 grey digits in, 10 logits out."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = ConvBNReLU(1, 32)
        self.block = ResidualBlock(32)
        self.pool = nn.MaxPool2d(2)
        self.conv1 = ConvBNReLU(32, 64)
        self.conv2 = ConvBNReLU(64, 64)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.block(self.stem(x)))
        x = self.conv2(self.conv1(x))
        return self.fc(self.flatten(self.avgpool(x)))
