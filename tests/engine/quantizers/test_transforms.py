"""scalars_to_tensors: scalar operands of float add/mul become tensor constants."""

from __future__ import annotations

import torch
from torch import nn

from qviz.engine.quantizers.transforms import scalars_to_tensors


class Arith(nn.Module):
    def forward(self, x, i):
        return (x + 1) * 0.5, i + 2


def test_float_scalars_become_constants_and_integer_arithmetic_is_left_alone() -> None:
    x, i = torch.randn(3), torch.arange(3)
    gm = torch.export.export(Arith(), (x, i)).module()
    expected = gm(x, i)
    gm = scalars_to_tensors(gm)
    constants = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert [n.name for n in constants] == ["_tensor_constant_0", "_tensor_constant_1"]
    assert all(
        n.meta["val"].dtype == torch.float32 and n.meta["val"].shape == () for n in constants
    )
    add_int = next(n for n in gm.graph.nodes if n.name == "add_1")
    assert add_int.args[1] == 2
    for got, want in zip(gm(x, i), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert got.dtype == want.dtype
