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
