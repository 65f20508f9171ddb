"""The reference representation against the q/dq model it was rewritten from.

Layer by layer: each rewritten call gets exactly the integer input the q/dq graph computed (the
graph is run "teacher forced": after every rewritten call the q/dq value is put back), so its
int8 output can be compared with the original ``quantize_per_tensor`` output on the same input.
Model outputs are compared free-running. The integer kernel alone is checked against a float64
quantize(dequantize(x) @ dequantize(w).T + bias) with hypothesis.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.fx import GraphModule, Interpreter, Node

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.pt2e.passes import reference_ops
from qviz.engine.pt2e.passes.reference_representation import (
    REPLACES,
    quantized_conv1d,
    quantized_conv2d,
    quantized_linear,
    to_reference_representation,
)
from qviz.errors import ConfigError, QuantizationError
from tests.helpers.quantize import quantize

ref_xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")

aten = torch.ops.aten
FLOAT_OPS = {aten.linear.default, aten.conv1d.default, aten.conv2d.default}
LAYER_KERNELS = {quantized_linear, quantized_conv1d, quantized_conv2d}
#: the written-out q/dq functions: the same bits as the ops they replace
QDQ_FUNCTIONS = {
    reference_ops.reference_quantize_per_tensor,
    reference_ops.reference_dequantize_per_tensor,
    reference_ops.reference_quantize_per_channel,
    reference_ops.reference_dequantize_per_channel,
}


def _quantizer(**config: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's XNNPACKQuantizer warns that it is deprecated
        return ref_xnnpack.XNNPACKQuantizer().set_global(
            ref_xnnpack.get_symmetric_quantization_config(**config)
        )


def _float_ops(gm: GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in FLOAT_OPS]


class _Recorder(Interpreter):
    """Runs a graph and keeps every node's output by node name."""

    def __init__(self, gm: GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[str, Any] = {}

    def run_node(self, n: Node) -> Any:
        self.values[n.name] = out = super().run_node(n)
        return out


class _TeacherForced(Interpreter):
    """Runs the rewritten graph; each rewritten call's output is compared with the q/dq graph's
    value, then replaced by it, so every layer sees exactly the input it saw in the q/dq graph.

    ``diffs`` maps each rewritten call to (largest level difference, fraction of elements that
    differ at all); the fraction catches a systematic off-by-one (floor instead of round), which
    stays within one level.
    """

    def __init__(self, gm: GraphModule, original: dict[str, Any]) -> None:
        super().__init__(gm)
        self.original = original
        self.diffs: dict[str, tuple[int, float]] = {}

    def run_node(self, n: Node) -> Any:
        out = super().run_node(n)
        if REPLACES not in n.meta:
            return out
        expected = self.original[n.meta[REPLACES]]
        assert out.dtype == expected.dtype and out.shape == expected.shape
        if n.target in QDQ_FUNCTIONS:
            assert torch.equal(out, expected), n.name  # written-out q/dq: bit for bit
            return expected
        levels = (out.int() - expected.int()).abs()
        self.diffs[n.name] = (int(levels.max()), float((levels > 0).double().mean()))
        return expected


def _layer_diffs(qdq: GraphModule, reference: GraphModule, x: torch.Tensor) -> dict:
    """Per rewritten call: (largest int8 difference, fraction differing), on q/dq's inputs."""
    recorder = _Recorder(qdq)
    expected_out = recorder.run(x)
    forced = _TeacherForced(reference, recorder.values)
    out = forced.run(x)
    assert torch.equal(out[0], expected_out[0])  # forced, everything else is the same graph
    return forced.diffs


def _assert_within_one_level(diffs: dict, n_layers: int) -> None:
    assert len(diffs) == n_layers
    assert max(level for level, _ in diffs.values()) <= 1, diffs
    assert max(fraction for _, fraction in diffs.values()) <= 0.01, diffs


def _output_scale(gm: GraphModule) -> float:
    """The scale of the dequantize that produces the model's output."""
    (final,) = gm.graph.output_node().args[0]
    return final.args[1]


def _rewritten(qdq: GraphModule) -> GraphModule:
    n_ops = len(_float_ops(qdq))
    reference = to_reference_representation(copy.deepcopy(qdq))
    assert not _float_ops(reference)
    assert len(_layer_calls(reference)) == n_ops
    assert not [n for n in reference.graph.nodes if "quantized_decomposed" in str(n.target)]
    return reference


def _layer_calls(gm: GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if n.target in LAYER_KERNELS]


# --- the embedded digits model ------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> tuple[GraphModule, GraphModule, list[torch.Tensor]]:
    torch.manual_seed(0)
    calibration = [images for images, _ in digits_loaders(batch_size=36).calibration]
    qdq = quantize(digits_model(), calibration, _quantizer(is_per_channel=True)).converted
    return qdq, _rewritten(qdq), calibration


def test_digits_every_layer_within_one_level(digits) -> None:
    qdq, reference, batches = digits
    for x in batches:
        # 5 convolutions (4 with a fused ReLU), an add, a max pool and the linear head.
        # Measured: every layer at most 1 level off, on 0.01 % to 0.07 % of its elements
        # (the linear: 0 or 1 of 360); the max pool (shared qparams): equal
        diffs = _layer_diffs(qdq, reference, x)
        _assert_within_one_level(diffs, n_layers=8)
        assert diffs["quantized_max_pool2d"] == (0, 0.0)


def test_digits_model_output_within_two_levels(digits) -> None:
    qdq, reference, batches = digits
    out_scale = _output_scale(qdq)
    for x in batches:
        expected, got = qdq(x), reference(x)
        # free running, one-level differences could add up; measured: at most 1 output level
        # (0.0617) on calibration and test images, and the same predicted class on every image
        assert (got - expected).abs().max() <= 2 * out_scale + 1e-6
        assert (got.argmax(1) == expected.argmax(1)).float().mean() >= 0.97


def test_digits_graph_runs_prints_and_lints(digits) -> None:
    _, reference, batches = digits
    reference.graph.lint()
    assert "quantized_conv2d" in reference.code and "quantized_linear" in reference.code
    assert "quantized_conv2d" in str(reference)
    assert reference(batches[0]).shape == (36, 10)


# --- small linear-only and conv-only models -------------------------------------------------


def _linear(bias: bool) -> tuple[nn.Module, list[torch.Tensor]]:
    model = nn.Sequential(nn.Linear(16, 12, bias=bias), nn.Linear(12, 5, bias=bias))
    return model, [torch.randn(8, 16) for _ in range(4)]


def _conv1d(bias: bool) -> tuple[nn.Module, list[torch.Tensor]]:
    model = nn.Sequential(
        nn.Conv1d(3, 6, 3, padding=1, bias=bias),
        nn.Conv1d(6, 4, 3, stride=2, dilation=2, groups=2, bias=bias),
    )
    return model, [torch.randn(8, 3, 20) for _ in range(4)]


def _conv2d(bias: bool) -> tuple[nn.Module, list[torch.Tensor]]:
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1, bias=bias),
        nn.Conv2d(6, 4, 3, stride=2, groups=2, bias=bias),
    )
    return model, [torch.randn(8, 3, 9, 9) for _ in range(4)]


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("build", [_linear, _conv1d, _conv2d])
def test_small_models_within_one_level(build, bias: bool, per_channel: bool) -> None:
    model, batches = build(bias)
    qdq = quantize(model, batches, _quantizer(is_per_channel=per_channel)).converted
    reference = _rewritten(qdq)
    out_scale = _output_scale(qdq)
    for x in [*batches, 3 * torch.randn_like(batches[0])]:  # calibration data and outliers
        # measured: at most 1 level, on at most 0.25 % of the elements (fewer without a bias)
        _assert_within_one_level(_layer_diffs(qdq, reference, x), n_layers=2)
        assert (reference(x) - qdq(x)).abs().max() <= 2 * out_scale + 1e-6


def test_reexport_with_torch_export_gives_the_same_integers() -> None:
    model, batches = _conv2d(bias=True)
    reference = _rewritten(quantize(model, batches, _quantizer(is_per_channel=True)).converted)
    exported = torch.export.export(reference, (batches[0],)).module()
    assert torch.equal(exported(batches[1]), reference(batches[1]))


# --- patterns that must stay as they are ----------------------------------------------------


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
def test_dynamic_quantization_becomes_dynamic_quantized_linear(per_channel: bool) -> None:
    model, batches = _linear(bias=True)
    quantizer = _quantizer(is_per_channel=per_channel, is_dynamic=True)
    qdq = quantize(model, batches, quantizer).converted
    reference = to_reference_representation(copy.deepcopy(qdq))
    calls = [n for n in reference.graph.nodes if REPLACES in n.meta]
    assert [n.target for n in calls].count(reference_ops.dynamic_quantized_linear) == 2
    assert not _float_ops(reference)
    for x in [*batches, 3 * torch.randn_like(batches[0])]:
        # the q/dq model sums float32 products; the kernel sums exact integers and scales once
        # in float64: float32 rounding apart
        expected, got = qdq(x), reference(x)
        assert torch.allclose(got, expected, rtol=0, atol=1e-5 * float(expected.abs().max()))


def test_linear_without_output_quantize_is_left_unchanged() -> None:
    model, batches = _linear(bias=True)
    qdq = quantize(model, batches, _quantizer()).converted
    last = _float_ops(qdq)[-1]
    (quantize_node,) = last.users
    (dequantize,) = quantize_node.users
    dequantize.replace_all_uses_with(last)  # the last linear now feeds the output in float
    qdq.graph.erase_node(dequantize)
    qdq.graph.erase_node(quantize_node)
    qdq.recompile()
    reference = to_reference_representation(copy.deepcopy(qdq))
    assert [n.name for n in _float_ops(reference)] == [last.name]
    assert len(_layer_calls(reference)) == 1  # the first linear
    assert torch.allclose(reference(batches[0]), qdq(batches[0]), atol=0.05)


def test_float_weight_is_left_unchanged() -> None:
    model, batches = _conv2d(bias=False)
    qdq = quantize(model, batches, _quantizer(is_per_channel=True)).converted
    first = _float_ops(qdq)[0]
    weight_dq = first.args[1]
    qdq.register_buffer("float_weight", model[0].weight.detach().clone())
    with qdq.graph.inserting_before(first):
        float_weight = qdq.graph.get_attr("float_weight")
    first.replace_input_with(weight_dq, float_weight)
    qdq.graph.eliminate_dead_code()
    qdq.recompile()
    reference = to_reference_representation(copy.deepcopy(qdq))
    assert [n.name for n in _float_ops(reference)] == [first.name]
    _assert_within_one_level(_layer_diffs(qdq, reference, batches[0]), n_layers=1)


def test_possible_int32_overflow_is_left_in_float_with_a_warning() -> None:
    model = nn.Linear(140_000, 1)
    nn.init.constant_(model.weight, 1.0)  # every int8 weight is 127: 140,000 * 127 * 128 > 2**31
    batches = [torch.randn(2, 140_000)]
    qdq = quantize(model, batches, _quantizer()).converted
    with pytest.warns(UserWarning, match="int32 accumulator could reach"):
        reference = to_reference_representation(qdq)
    assert len(_float_ops(reference)) == 1


def test_rejects_what_is_not_a_graph_module() -> None:
    with pytest.raises(ConfigError, match="GraphModule"):
        to_reference_representation(nn.Linear(2, 2))


def test_kernel_rejects_float_inputs() -> None:
    with pytest.raises(QuantizationError, match="x_q"):
        quantized_linear(torch.ones(1, 2), 1.0, 0, torch.ones(1, 2, dtype=torch.int8), 1.0, 0,
                         None, 1.0, 0)  # fmt: skip


# --- the integer kernels alone --------------------------------------------------------------


def _fake_quantized(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    return (q.double() - zero_point.double()) * scale.double()


def _quantize64(y: torch.Tensor, scale: float, zero_point: int, relu: bool) -> torch.Tensor:
    y = y.clamp_min(0) if relu else y
    return (torch.round(y / scale) + zero_point).clamp(-128, 127)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.tuples(st.integers(1, 4), st.integers(1, 64), st.integers(1, 8)),
    per_channel=st.booleans(),
    x_zero_point=st.integers(-128, 127),
    x_scale=st.floats(1e-4, 1.0),
    multiplier=st.floats(1e-4, 1.0),
    out_zero_point=st.integers(-128, 127),
    use_bias=st.booleans(),
    relu=st.booleans(),
)
def test_quantized_linear_matches_float64_within_one_level(
    seed, shape, per_channel, x_zero_point, x_scale, multiplier, out_zero_point, use_bias, relu
) -> None:
    batch, in_features, out_features = shape
    g = torch.Generator().manual_seed(seed)
    channels = out_features if per_channel else 1
    x_q = torch.randint(-128, 128, (batch, in_features), generator=g, dtype=torch.int8)
    w_q = torch.randint(-128, 128, (out_features, in_features), generator=g, dtype=torch.int8)
    w_zero_point = torch.randint(-128, 128, (channels,), generator=g)
    w_scale = torch.rand(channels, generator=g, dtype=torch.float64) * 0.1 + 1e-4
    # the largest per-channel multiplier x_scale * w_scale / out_scale is `multiplier` (<= 1)
    out_scale = x_scale * float(w_scale.max()) / multiplier
    bias = torch.randn(out_features, generator=g, dtype=torch.float64) * 10 * out_scale
    bias = bias if use_bias else None
    w_args = (w_scale, w_zero_point) if per_channel else (float(w_scale), int(w_zero_point))

    got = quantized_linear(
        x_q, x_scale, x_zero_point, w_q, *w_args, bias, out_scale, out_zero_point, relu=relu
    )

    x = _fake_quantized(x_q, torch.tensor(x_scale), torch.tensor(x_zero_point))
    w = _fake_quantized(w_q, w_scale[:, None], w_zero_point[:, None])
    y = x @ w.T + (bias if bias is not None else 0)
    expected = _quantize64(y, out_scale, out_zero_point, relu)
    assert got.dtype == torch.int8
    assert (got.double() - expected).abs().max() <= 1


@pytest.mark.parametrize("seed", range(5))
def test_quantized_conv2d_matches_float64_within_one_level(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x_q = torch.randint(-128, 128, (2, 4, 7, 7), generator=g, dtype=torch.int8)
    w_q = torch.randint(-127, 128, (6, 2, 3, 3), generator=g, dtype=torch.int8)
    w_scale = torch.rand(6, generator=g, dtype=torch.float64) * 0.01 + 1e-4
    bias = torch.randn(6, generator=g, dtype=torch.float64)
    x_scale, x_zero_point, out_scale, out_zero_point = 0.05, -7, 0.2, 11
    geometry = {"stride": [2, 1], "padding": [1, 2], "dilation": [1, 2], "groups": 2}

    got = quantized_conv2d(
        x_q, x_scale, x_zero_point, w_q, w_scale, torch.zeros(6, dtype=torch.int64), bias,
        out_scale, out_zero_point, **geometry,
    )  # fmt: skip

    x = (x_q.double() - x_zero_point) * x_scale
    w = w_q.double() * w_scale[:, None, None, None]
    y = torch.nn.functional.conv2d(x, w, bias, **geometry)
    assert (got.double() - _quantize64(y, out_scale, out_zero_point, False)).abs().max() <= 1


def test_int32_accumulation_is_exact_near_the_int32_limit() -> None:
    """With multiplier 1 and an int32 output, the kernel returns its accumulator itself."""
    in_features = 33_000  # 33,000 * 255 * 255 = 2,145,825,000 < 2**31 - 1
    x_q = torch.full((2, in_features), 127, dtype=torch.int8)
    x_q[1, ::2] = -128
    w_q = torch.full((3, in_features), -128, dtype=torch.int8)
    w_q[1] = 127
    w_q[2, 1::3] = 5
    got = quantized_linear(
        x_q, 1.0, -128, w_q, 1.0, 127, None, 1.0, 0,
        quant_min=-(2**31), quant_max=2**31 - 1, out_dtype=torch.int32,
    )  # fmt: skip
    x, w = x_q.long() + 128, w_q.long() - 127
    expected = (x[:, None, :] * w[None, :, :]).sum(-1)  # int64, exact by construction
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), expected)


def test_convert_pt2e_flag_gives_the_reference_representation():
    """The public switch: no float linear/conv left, outputs within one output step."""
    batches = [x for x, _ in digits_loaders(batch_size=36).calibration]
    _, prepared, qdq = quantize(digits_model(), batches, per_channel=True)
    integer = qviz.convert_pt2e(prepared, use_reference_representation=True)
    float_ops = {torch.ops.aten.linear.default, torch.ops.aten.conv2d.default}
    assert not [n for n in integer.graph.nodes if n.target in float_ops]
    out_step = qdq.plan.group_of("linear").qparams.scale
    for x in batches:
        assert float((integer(x) - qdq(x)).abs().max()) <= out_step * 1.0001
