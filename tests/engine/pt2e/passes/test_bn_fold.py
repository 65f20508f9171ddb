"""BatchNorm folded into the linear before it, as the reference does (torchao 0.18), and left
alone (with a warning and a plan record) where folding would compute something else."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.pt2e.plan import FloatReason

ref_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ref_xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")

BN_TARGETS = (
    torch.ops.aten.batch_norm.default,
    torch.ops.aten._native_batch_norm_legit_no_training.default,
)


def _linear_bn(n_in: int, n_out: int, bias: bool) -> nn.Module:
    model = nn.Sequential(nn.Linear(n_in, n_out, bias=bias), nn.BatchNorm1d(n_out)).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.5, 0.5)
    return model


def _quantizer():
    return ref_xnnpack.XNNPACKQuantizer().set_global(
        ref_xnnpack.get_symmetric_quantization_config(is_per_channel=True)
    )


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(("n_in", "n_out"), [(8, 16), (5, 5)])
def test_linear_batch_norm_is_folded_bitwise_as_in_the_reference(n_in, n_out, bias):
    model = _linear_bn(n_in, n_out, bias)
    x = torch.randn(4, n_in)
    gm = torch.export.export(model, (x,), strict=True).module()
    ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), _quantizer())
    ours = qviz.prepare_pt2e(gm, _quantizer())
    assert not any(n.target in BN_TARGETS for n in ours.graph.nodes)
    assert not ours.plan.float_nodes
    torch.testing.assert_close(ours(x), model(x))
    assert torch.equal(ours(x), ref(x))  # the same folded weights, observed the same way
    assert torch.equal(qviz.convert_pt2e(ours)(x), ref_pt2e.convert_pt2e(ref)(x))
    assert any(n.target in BN_TARGETS for n in gm.graph.nodes)  # the caller's graph is unchanged


def test_linear_on_a_3d_input_keeps_its_batch_norm_and_says_why():
    """Linear acts on the last dimension, BatchNorm1d on dimension 1: folding is wrong."""
    model = _linear_bn(3, 5, True)
    x = torch.randn(2, 5, 3)
    gm = torch.export.export(model, (x,), strict=True).module()
    with pytest.warns(UserWarning, match="Not fusing linear\\+bn for node 'linear'"):
        prepared = qviz.prepare_pt2e(gm, _quantizer())
    torch.testing.assert_close(prepared(x), model(x), atol=1e-5, rtol=1e-5)
    (record,) = [f for f in prepared.plan.float_nodes if "batch_norm" in f.op]
    assert record.reason is FloatReason.BATCH_NORM_NOT_FOLDED
    assert "3-D" in record.detail
