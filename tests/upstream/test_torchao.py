"""torchao's ComposableQuantizer, watched where qviz's does more.

torchao's ``ComposableQuantizer`` compares only the annotation objects before and after each
quantizer, so a later quantizer that edits an earlier one's annotation in place goes unnoticed.
qviz's :class:`qviz.engine.quantizers.base.ComposableQuantizer` also compares the specs and
raises (tests/engine/quantizers/test_quantizer.py), and its docstring says torchao's does not.
The test below fails once torchao notices in-place edits: then that sentence must change.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.fx import GraphModule

from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.quantizers.base import Quantizer

KEY = "quantization_annotation"
STATIC = get_symmetric_quantization_config()


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(36 * 4, 2)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))


class ClearsConvInputs(Quantizer):
    """A careless quantizer: edits an earlier quantizer's conv annotation in place."""

    def annotate(self, model: GraphModule) -> GraphModule:
        for node in model.graph.nodes:
            if node.target == torch.ops.aten.conv2d.default and KEY in node.meta:
                node.meta[KEY].input_qspec_map[node.args[0]] = None
        return model

    def validate(self, model: GraphModule) -> None:
        pass


def test_torchao_composable_misses_in_place_changes() -> None:
    """The reference only compares annotation objects; qviz also sees edited specs."""
    pt2e = pytest.importorskip("torchao.quantization.pt2e.quantizer")
    gm = torch.export.export(Model().eval(), (torch.randn(1, 3, 8, 8),)).module()
    first = XNNPACKQuantizer().set_global(STATIC)
    pt2e.ComposableQuantizer([first, ClearsConvInputs()]).annotate(gm)
    conv = next(n for n in gm.graph.nodes if n.name == "conv2d")
    assert conv.meta[KEY].output_qspec is None  # silently overwritten
