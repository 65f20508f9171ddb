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
from qviz.errors import AnnotationError, ConfigError

SPEC = QuantizationSpec(
    dtype=torch.int8,
    observer_or_fake_quant_ctr=MinMaxObserver.with_args(dtype=torch.qint8),
    quant_min=-128,
    quant_max=127,
    qscheme=torch.per_tensor_symmetric,
)


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


def _xnnpack(is_qat: bool = False):
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_qat=is_qat))


def test_a_converted_model_given_to_prepare_or_annotate_is_named_as_converted():
    x = torch.randn(8, 4)
    prepared = qviz.prepare_pt2e(qviz.export(nn.Linear(4, 3).eval(), (x,)), _xnnpack())
    qviz.calibrate(prepared, x, progress=False)
    converted = qviz.convert_pt2e(prepared)
    for step in (qviz.prepare_pt2e, qviz.prepare_qat_pt2e, qviz.annotate_pt2e):
        with pytest.raises(ConfigError, match=r"already converted .* pass the float graph module"):
            step(converted, _xnnpack())


def test_qat_with_a_post_training_quantizer_is_refused_naming_each_observer():
    """Observers where QAT needs fake quantizers: the forward would stay float and "QAT"
    would train without ever seeing quantization."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    gm = qviz.export(model, (torch.randn(4, 3, 8, 8),))
    with pytest.raises(ConfigError) as info:
        qviz.prepare_qat_pt2e(gm, _xnnpack(is_qat=False))
    text = str(info.value)
    assert "build 3 observer(s), not fake quantizers" in text
    assert "HistogramObserver observing" in text and "MinMaxObserver observing" in text
    assert "get_symmetric_quantization_config(is_qat=True)" in text
    qviz.prepare_qat_pt2e(gm, _xnnpack(is_qat=True))  # the QAT config is accepted


class _ActivationPerChannel:
    """Annotates linear's input per channel along ``axis``."""

    def __init__(self, axis: int) -> None:
        self.axis = axis

    def annotate(self, gm):
        from qviz.engine.observers import PerChannelMinMaxObserver

        spec = QuantizationSpec(
            dtype=torch.int8,
            observer_or_fake_quant_ctr=PerChannelMinMaxObserver,
            quant_min=-128,
            quant_max=127,
            qscheme=torch.per_channel_symmetric,
            ch_axis=self.axis,
        )
        for n in gm.graph.nodes:
            if n.target == torch.ops.aten.linear.default:
                n.meta["quantization_annotation"] = QuantizationAnnotation({n.args[0]: spec})
        return gm

    def validate(self, gm) -> None:
        pass


def test_a_per_channel_spec_on_an_activations_batch_axis_is_refused():
    """Before, it converted with one scale per sample of the calibration batch and failed on
    any other batch size."""
    x = torch.randn(8, 4)
    gm = qviz.export(nn.Linear(4, 3).eval(), (x,), dynamic_batch=True)
    with pytest.raises(
        AnnotationError,
        match=r"input_1 -> linear: a per-channel spec .*ch_axis=0.* "
        r"batch axis .*quantize activations per tensor",
    ):
        qviz.prepare_pt2e(gm, _ActivationPerChannel(0))
    prepared = qviz.prepare_pt2e(gm, _ActivationPerChannel(1))  # the feature axis is fine
    qviz.calibrate(prepared, x, progress=False)
    converted = qviz.convert_pt2e(prepared)
    assert converted(torch.randn(3, 4)).shape == (3, 3)
