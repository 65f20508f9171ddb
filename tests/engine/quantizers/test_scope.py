"""Scopes: module names and types from nn_module_stack, operators from torch functions."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qviz.engine.quantizers.scope import (
    Scope,
    in_module_name,
    in_module_type,
    module_names,
    operator_matches,
    resolve_operator,
)
from qviz.errors import ConfigError

aten = torch.ops.aten


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc(x)


@pytest.fixture(scope="module")
def nodes() -> dict[str, torch.fx.Node]:
    model = nn.Sequential(Inner(), nn.ReLU()).eval()
    gm = torch.export.export(model, (torch.randn(1, 2),)).module()
    return {n.name: n for n in gm.graph.nodes}


def test_module_names_and_types(nodes) -> None:
    linear, relu, weight = nodes["linear"], nodes["relu"], nodes["_0_fc_weight"]
    assert module_names(linear) == ["", "0", "0.fc"]
    assert in_module_name(linear, "0") and not in_module_name(relu, "0")
    assert in_module_type(linear, Inner) and in_module_type(linear, nn.Linear)
    assert not in_module_type(relu, nn.Linear)
    assert module_names(weight) == []  # get_attr nodes carry no module stack


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (F.linear, (aten.linear,)),
        (F.conv2d, (aten.conv2d,)),
        (torch.add, (aten.add,)),
        (operator.add, (aten.add,)),
        (torch.Tensor.view, (aten.view,)),
        (F.max_pool2d, (aten.max_pool2d,)),
        (F.relu6, (aten.hardtanh, aten.hardtanh_)),
        (aten.add.Tensor, (aten.add.Tensor,)),
    ],
)
def test_resolve_operator(op, expected) -> None:
    assert resolve_operator(op) == expected


def test_operator_matches_overload_exactly_and_packet_by_any_overload(nodes) -> None:
    linear = nodes["linear"]
    assert operator_matches(linear, [aten.linear]) and operator_matches(
        linear, [aten.linear.default]
    )
    assert not operator_matches(linear, [aten.add]) and not operator_matches(
        nodes["input_1"], [aten.linear]
    )


def test_resolve_operator_errors() -> None:
    with pytest.raises(ConfigError, match="set_module_type"):
        resolve_operator(nn.Linear)
    with pytest.raises(ConfigError, match="no ATen operator is named after 'helper'"):
        resolve_operator(type("X", (), {"__call__": None, "__name__": "helper"})())


def test_scope_checks_operator_nodes_and_the_anchor(nodes) -> None:
    linear, relu, weight = nodes["linear"], nodes["relu"], nodes["_0_fc_weight"]
    inside = Scope(region=lambda n: in_module_name(n, "0"))
    assert inside.accepts(linear, [linear, weight])  # the weight is not checked
    assert not inside.accepts(linear, [relu, linear])
    assert not Scope(anchor=lambda n: n is relu).accepts(linear, [linear])


class Features(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        self.classifier = nn.Linear(4, 2)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


def test_a_module_name_typo_is_an_error_with_the_closest_names():
    """set_module_name('featurez', None) used to quantize everything without a word."""
    import qviz
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    gm = qviz.export(Features().eval(), (torch.randn(1, 3, 8, 8),))
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    quantizer.set_module_name("featurez", None)
    before = gm.graph.python_code("self").src
    typo = r"set_module_name\('featurez', ...\).*closest: \['features',"
    with pytest.raises(ConfigError, match=typo):
        qviz.prepare_pt2e(gm, quantizer)
    assert gm.graph.python_code("self").src == before  # the user's graph is untouched
    assert quantizer.module_name_config == {"featurez": None}  # and so are their settings
    quantizer.module_name_config.clear()
    plan = qviz.prepare_pt2e(gm, quantizer.set_module_name("features.0", None)).plan
    assert any(r.reason == "filtered by module name" for r in plan.float_nodes)
