"""Which arguments prepare observes: tensor keyword inputs yes, ``out=`` destinations never.

The reference refuses both with a bare AssertionError (its prepare maps positional arguments
only). qviz observes a tensor passed by keyword like any input, keeps an ``out=`` argument the
tensor the operator writes into (so an in-place model still updates it), and rejects a spec
keyed by an ``out=`` destination alone with an error that says to quantize the result.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.fx import GraphModule, symbolic_trace

import qviz
from qviz.engine.observers import MinMaxObserver
from qviz.engine.specs import QuantizationAnnotation, QuantizationSpec
from qviz.errors import AnnotationError

SPEC = QuantizationSpec(
    torch.int8, MinMaxObserver.with_args(dtype=torch.qint8), -128, 127,
    torch.per_tensor_symmetric,
)  # fmt: skip


class EveryInput:
    """Annotates every call with a spec for each tensor it reads, and for its output."""

    def annotate(self, gm: GraphModule) -> GraphModule:
        for n in gm.graph.nodes:
            if n.op == "call_function":
                n.meta["quantization_annotation"] = QuantizationAnnotation(
                    dict.fromkeys(n.all_input_nodes, SPEC), SPEC
                )
        return gm

    def validate(self, gm: GraphModule) -> None:
        pass


class Clamp(nn.Module):
    def __init__(self, max_value, use_out: bool = False) -> None:
        super().__init__()
        self.max_value, self.use_out = max_value, use_out

    def forward(self, t):
        if self.use_out:
            torch.clamp(t, max=self.max_value, out=t)
            return t
        return torch.clamp(t, max=self.max_value)


def _fq(x: torch.Tensor, qparams) -> torch.Tensor:
    return torch.fake_quantize_per_tensor_affine(x, qparams.scale, qparams.zero_point, -128, 127)


def test_a_tensor_passed_by_keyword_is_observed_like_any_input():
    x = torch.randn(1, 2, 3, 3)
    max_value = torch.randn(1, 2, 3, 3) - 0.2
    gm = symbolic_trace(Clamp(max_value))  # keeps ``max=`` a keyword argument
    prepared = qviz.prepare_pt2e(gm, EveryInput())
    qviz.calibrate(prepared, [x], progress=False)
    converted = qviz.convert_pt2e(prepared)
    plan = converted.plan
    expected = torch.clamp(
        _fq(x, plan.group_of("t", "clamp").qparams),
        max=_fq(max_value, plan.group_of("max_value", "clamp").qparams),
    )
    assert torch.equal(converted(x), _fq(expected, plan.group_of("clamp").qparams))


def test_an_out_argument_stays_the_tensor_written_into():
    x = torch.randn(1, 2, 3, 3)
    gm = torch.export.export(Clamp(0.5, use_out=True), (x.clone(),)).module()
    prepared = qviz.prepare_pt2e(gm, EveryInput())
    clamp = next(n for n in prepared.graph.nodes if n.target == torch.ops.aten.clamp.out)
    assert clamp.kwargs["out"].op == "placeholder"  # not the observer's output
    assert clamp.args[0].op == "call_module"  # the input is observed
    qviz.calibrate(prepared, [x.clone()], progress=False)
    converted = qviz.convert_pt2e(prepared)
    t = x.clone()
    result = converted(t)
    input_qparams = converted.plan.group_of("t", "clamp").qparams
    assert torch.equal(t, torch.clamp(_fq(x, input_qparams), max=0.5))  # still updated in place
    assert torch.equal(result, _fq(t, converted.plan.group_of("clamp").qparams))


def test_a_spec_for_an_out_destination_alone_says_to_quantize_the_result():
    class WriteInto(nn.Module):
        def forward(self, t, buf):
            torch.clamp(t, max=0.5, out=buf)
            return buf

    example = (torch.randn(4), torch.empty(4))
    gm = torch.export.export(WriteInto(), example).module()

    class OutOnly(EveryInput):
        def annotate(self, gm):
            for n in gm.graph.nodes:
                if n.target == torch.ops.aten.clamp.out:
                    n.meta["quantization_annotation"] = QuantizationAnnotation(
                        {n.kwargs["out"]: SPEC}
                    )
            return gm

    with pytest.raises(
        AnnotationError, match=r"only writes its result into \(out=\).*output_qspec"
    ):
        qviz.prepare_pt2e(gm, OutOnly())
