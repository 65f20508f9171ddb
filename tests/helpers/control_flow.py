"""Models with loops (scan, while_loop) and the reference quantizer their tests use."""

from __future__ import annotations

import torch
from torch import nn


class ScanModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 5)

    def forward(self, x, init):
        from torch._higher_order_ops.scan import scan

        def combine_fn(carry, x_slice):
            out = self.linear(x_slice)
            return carry + out, out

        return scan(combine_fn, init=init, xs=x, dim=0)[1]


class WhileLoopModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 5)

    def forward(self, x):
        from torch._higher_order_ops.while_loop import while_loop

        def cond_fn(i, x):
            return i < 3

        def body_fn(i, x):
            return i + 1, torch.relu(self.linear(x))

        return while_loop(cond_fn, body_fn, (torch.tensor(0), x))[1]


def reference_xnnpack_quantizer():
    """torchao's XNNPACK test quantizer, symmetric config: the reference's own annotations."""
    import torchao.testing.pt2e._xnnpack_quantizer as ref_xnnpack

    return ref_xnnpack.XNNPACKQuantizer().set_global(
        ref_xnnpack.get_symmetric_quantization_config()
    )
