"""qviz.export's errors say what to do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import qviz
from qviz.errors import ConfigError


def test_capture_with_a_dynamic_batch_of_one_asks_for_batch_two():
    model = nn.Sequential(nn.Linear(4, 3)).eval()
    with pytest.raises(ConfigError, match=r"torch specialises sizes 0 and 1.*batch >= 2") as info:
        qviz.export(model, (torch.randn(1, 4),), dynamic_batch=True)
    assert "export-friendly" not in str(info.value)


class _FixedBatch(nn.Module):
    def forward(self, x):
        return x.reshape(4, -1) * 2  # the batch written into the code


def test_code_that_fixes_the_batch_is_named_as_such():
    with pytest.raises(ConfigError, match=r"fixes the batch size.*x.shape\[0\].*without "
                       r"dynamic_batch") as info:  # fmt: skip
        qviz.export(_FixedBatch(), (torch.randn(4, 3),), dynamic_batch=True)
    assert "export-friendly" not in str(info.value)
    assert qviz.export(_FixedBatch(), (torch.randn(4, 3),)) is not None  # fixed: fine


class _CappedBatch(torch.nn.Module):
    """A kernel's batch limit as torch.export sees it: a guard with an upper bound only (CUDA's
    convolutions give ``batch <= 65535``)."""

    def forward(self, x):
        torch._check(x.shape[0] <= 1000)
        return x.relu()


def test_a_kernels_batch_limit_gives_a_dynamic_batch_up_to_that_limit():
    """Before, the digits model exported on CUDA with dynamic_batch=True was refused with
    "DigitsNet's code fixes the batch size", which it does not."""
    gm = qviz.export(_CappedBatch(), (torch.randn(8, 3),), dynamic_batch=True)
    assert gm(torch.randn(5, 3)).shape == (5, 3)
    assert gm(torch.randn(1000, 3)).shape == (1000, 3)
