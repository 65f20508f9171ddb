"""Operators inside loops (scan, while_loop) are quantized like the rest of the graph, and the
result is bitwise the reference's (torchao 0.18)."""

from __future__ import annotations

import copy

import pytest
import torch

import qviz
from qviz.engine.graph.control_flow import loop_bodies
from qviz.engine.graph.qdq_ops import is_qdq
from tests.helpers.control_flow import ScanModel, WhileLoopModel
from tests.helpers.control_flow import reference_xnnpack_quantizer as _quantizer

ref_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ref_xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")


CASES = {
    "scan": (ScanModel, lambda g: (torch.randn(3, 5, generator=g), torch.zeros(5))),
    "while_loop": (WhileLoopModel, lambda g: (torch.randn(5, generator=g),)),
}


@pytest.mark.parametrize("name", CASES)
def test_loop_bodies_are_observed_calibrated_and_converted_bitwise(name):
    model_cls, draw = CASES[name]
    g = torch.Generator().manual_seed(0)
    batches = [draw(g) for _ in range(3)]
    gm = torch.export.export(model_cls().eval(), batches[0]).module()
    ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), _quantizer())
    ours = qviz.prepare_pt2e(gm, _quantizer())
    ((_, path),) = loop_bodies(ours)
    body = ours.get_submodule(path)
    assert body.plan.groups  # the body has observers of its own, and a plan saying so
    assert any(n.op == "call_module" for n in body.graph.nodes)
    assert not any(n.op == "call_module" for n in gm.get_submodule(path).graph.nodes)
    with torch.no_grad():
        for b in batches:
            ref(*b)
    qviz.calibrate(ours, batches, progress=False)
    ref, ours = ref_pt2e.convert_pt2e(ref), qviz.convert_pt2e(ours)
    converted_body = ours.get_submodule(path)
    assert any(is_qdq(n) for n in converted_body.graph.nodes)
    assert all(g.qparams is not None for g in converted_body.plan.groups)
    with torch.no_grad():
        for b in batches:
            assert torch.equal(ours(*b), ref(*b))


def test_the_plan_points_at_each_loop_body_plan():
    gm = torch.export.export(ScanModel().eval(), (torch.randn(3, 5), torch.zeros(5))).module()
    prepared = qviz.prepare_pt2e(gm, _quantizer())
    (path,) = prepared.plan.loop_bodies
    assert f"loop body {path}" in str(prepared.plan)
    assert prepared.get_submodule(path).plan.groups
