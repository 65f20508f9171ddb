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


def test_max_batches_takes_only_that_many_from_a_stream() -> None:
    """A generator is not read past ``max_batches``: the loop used to take one batch more and
    break, which also left a notebook's progress bar short of its total, drawn red."""
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    x = torch.randn(4, 3)
    gm = qviz.export(nn.Linear(3, 2).eval(), (x,))
    prepared = qviz.prepare_pt2e(
        gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    )
    taken = []

    def stream():
        for i in range(5):
            taken.append(i)
            yield torch.randn(4, 3)

    qviz.calibrate(prepared, stream(), max_batches=2, progress=False)
    assert taken == [0, 1]
