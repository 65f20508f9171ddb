"""qviz.calibrate's refusals that need the plan to explain them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import Quantizer
from qviz.errors import ConfigError


class AnnotatesNothing(Quantizer):
    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        pass


def test_a_quantizer_that_annotated_nothing_is_named_not_a_model_never_prepared() -> None:
    """Issue 25: calibrate said the model "was never prepared"; it was, but the quantizer
    annotated nothing, so prepare inserted no observer; the plan's float reasons say why."""
    x = torch.randn(2, 1, 6, 6)
    gm = qviz.export(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()).eval(), (x,))
    prepared = qviz.prepare_pt2e(gm, AnnotatesNothing())
    assert prepared.plan.groups == () and prepared.plan.float_nodes
    with pytest.raises(ConfigError) as info:
        qviz.calibrate(prepared, [x])
    message = str(info.value)
    assert "never prepared" not in message
    assert "annotated nothing" in message and "no observer" in message
    assert "conv2d (conv2d.default): unannotated" in message
    assert "prepared.plan.float_nodes" in message
