"""find_chains: fx SubgraphMatcher over hand-built ATen patterns."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qviz.engine.quantizers.patterns import (
    ADD_OPS,
    BN_OPS,
    CONV_ACT_OPS,
    CONV_BN_OPS,
    RELU_OPS,
    find_chains,
    nodes_calling,
)


class Net(nn.Module):
    def __init__(self, body, **modules) -> None:
        super().__init__()
        self.body = body
        for name, module in modules.items():
            self.add_module(name, module)

    def forward(self, x):
        return self.body(self, x)


def _graph(body, **modules) -> torch.fx.Graph:
    inputs = (torch.randn(1, 3, 6, 6),)
    return torch.export.export(Net(body, **modules).eval(), inputs).module().graph


def test_conv_relu_roles_with_and_without_bias() -> None:
    for bias in (True, False):
        g = _graph(lambda s, x: F.relu(s.conv(x)), conv=nn.Conv2d(3, 4, 3, bias=bias))
        [match] = find_chains(g, CONV_ACT_OPS, [RELU_OPS])
        roles = {k: (v.name if v is not None else None) for k, v in match.roles.items()}
        assert roles == {
            "input": "x",
            "weight": "conv_weight",
            "bias": "conv_bias" if bias else None,
            "op": "conv2d",
            "output": "relu",
        }


def test_a_conv_with_another_user_does_not_fuse() -> None:
    g = _graph(lambda s, x: (F.relu(y := s.conv(x)), y + 1), conv=nn.Conv2d(3, 4, 3))
    assert find_chains(g, CONV_ACT_OPS, [RELU_OPS]) == []


def test_conv_bn_relu_and_literals_are_ignored() -> None:
    g = _graph(
        lambda s, x: F.relu(s.bn(s.conv(x))),
        conv=nn.Conv2d(3, 4, 3, stride=2, padding=1),
        bn=nn.BatchNorm2d(4, eps=1e-3),
    )
    [match] = find_chains(g, CONV_BN_OPS, [BN_OPS, RELU_OPS])
    assert (match.roles["bn"].name, match.roles["output"].name) == ("batch_norm", "relu")
    # a pattern's last node may feed others: conv-bn matches too, so conv-bn-relu must run first
    [shorter] = find_chains(g, CONV_BN_OPS, [BN_OPS])
    assert shorter.roles["output"] is match.roles["bn"]


def test_add_of_one_node_twice_matches_the_self_pattern() -> None:
    g = _graph(lambda s, x: F.relu(x + x))
    assert find_chains(g, ADD_OPS, [RELU_OPS], [("input", "other")]) == []
    [match] = find_chains(g, ADD_OPS, [RELU_OPS], [("input", "other"), ("input", "input")])
    assert match.roles["input"].name == "x" and "other" not in match.roles


def test_matches_come_in_graph_order() -> None:
    g = _graph(lambda s, x: F.relu(s.b(F.relu(s.a(x)))), a=nn.Conv2d(3, 3, 1), b=nn.Conv2d(3, 3, 1))
    assert [m.roles["output"].name for m in find_chains(g, CONV_ACT_OPS, [RELU_OPS])] == [
        "relu",
        "relu_1",
    ]
    assert [n.name for n in nodes_calling(g, RELU_OPS)] == ["relu", "relu_1"]
