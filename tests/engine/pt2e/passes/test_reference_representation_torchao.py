"""qviz's reference representation against torchao's (``reference_representation_rewrite``).

Two levels:

* models: the same exported graph, quantizer and batches through torchao's flow and qviz's, each
  rewritten by its own pass; every pattern must be rewritten (qviz: into its function; torchao:
  no ``quantized_decomposed`` op left) and the outputs must agree within what the two arithmetics
  allow;
* functions: qviz's integer function and torchao's replacement function on the same integers.
  Where torchao computes what the q/dq form computes (dequantize, per-channel quantize, max
  pooling with shared qparams) the result is bitwise equal. Where it does not, the difference is
  bounded and explained: torchao's ``out_dtype(mul|div, int32, ...)`` casts truncate toward zero
  (linear's bias and requantization, add + ReLU), its add rounds each input separately, and its
  quantize divides by the scale where ``quantize_per_tensor`` multiplies by the reciprocal. qviz's
  functions round once, half to even, so they equal float64 ``dequantize -> op -> quantize``
  (checked with hypothesis away from exact ties, and within one level everywhere).

torchao's conv2d and max_pool2d patterns are written with ``aten.convolution`` and
``aten.max_pool2d_with_indices``, which ``torch.export`` no longer produces (it gives
``aten.conv2d`` / ``aten.max_pool2d``): on these graphs torchao leaves both in float between its
written-out q/dq, and the model-level comparison checks qviz's integer versions against that.
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
from torch.fx import GraphModule

import qviz
from qviz.engine.pt2e.passes import reference_ops as ops
from qviz.engine.pt2e.passes.reference_representation import REPLACES, quantized_linear
from tests.helpers.quantize import quantize

ref_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ref_rewrite = pytest.importorskip("torchao.quantization.pt2e.reference_representation_rewrite")
ref_xnnpack = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")


def _quantizer(**config: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's XNNPACKQuantizer warns that it is deprecated
        return ref_xnnpack.XNNPACKQuantizer().set_global(
            ref_xnnpack.get_symmetric_quantization_config(**config)
        )


class Patterns(nn.Module):
    """conv, add + ReLU, add, max_pool2d, linear: every static pattern torchao rewrites."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)
        self.pool, self.fc = nn.MaxPool2d(2), nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        z = torch.relu(y + self.conv2(y))
        z = self.pool(z + y)
        return self.fc(z.flatten(1))


def _both(model: nn.Module, batches: list, **config: Any) -> tuple[GraphModule, ...]:
    """(torchao's rewritten model, qviz's q/dq model, qviz's rewritten model)."""
    gm = qviz.export(model.eval(), (batches[0],))
    ref = ref_pt2e.prepare_pt2e(copy.deepcopy(gm), _quantizer(**config))
    for b in batches:
        ref(b)
    ref = ref_rewrite.reference_representation_rewrite(ref_pt2e.convert_pt2e(ref))
    _, ours, qdq = quantize(gm, batches, _quantizer(**config))
    return ref, qdq, qviz.convert_pt2e(ours, use_reference_representation=True)


def _targets(gm: GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _no_qdq_ops(gm: GraphModule) -> bool:
    """No quantize / dequantize op left (``choose_qparams`` stays in both rewrites)."""
    names = [str(t) for t in _targets(gm) if "quantized_decomposed" in str(t)]
    return not [n for n in names if "quantize_per" in n]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_every_static_pattern_rewritten_as_torchao_does(per_channel: bool) -> None:
    torch.manual_seed(0)
    batches = [torch.randn(4, 3, 8, 8) for _ in range(4)]
    ref, qdq, ours = _both(Patterns(), batches, is_per_channel=per_channel)
    targets = _targets(ours)
    for function in (quantized_linear, ops.quantized_add, ops.quantized_max_pool2d):
        assert function in targets, function.__name__
    adds = [n for n in ours.graph.nodes if n.target is ops.quantized_add]
    assert sorted(n.kwargs["relu"] for n in adds) == [False, True]  # add, and add + ReLU
    assert ops.reference_quantize_per_tensor in targets  # the model's input
    assert ops.reference_dequantize_per_tensor in targets  # and output
    assert _no_qdq_ops(ours) and _no_qdq_ops(ref)
    # torchao's add + ReLU (2 out_dtype calls) and, with a per-tensor weight, linear (3) are
    # out_dtype integer arithmetic; its add rounds in float instead (no out_dtype)
    out_dtype = [t for t in _targets(ref) if t is torch.ops.higher_order.out_dtype]
    assert len(out_dtype) == (2 if per_channel else 5)
    out_step = qdq.graph.output_node().args[0][0].args[1]
    for x in [*batches, 2 * torch.randn(4, 3, 8, 8)]:
        expected, got, theirs = qdq(x), ours(x), ref(x)
        # qviz: one rounding per layer as the q/dq model; torchao: truncations and double
        # rounding, each up to one level per layer, which add up over the 5 quantized layers.
        # Measured: qviz within 1 output step of q/dq, torchao within 2 of qviz
        assert (got - expected).abs().max() <= 2 * out_step + 1e-6
        assert (theirs - got).abs().max() <= 3 * out_step + 1e-6


def test_dynamic_linear_rewritten_as_torchao_does() -> None:
    """One linear: torchao's rewrite returns float64 (its run-time scale is float64), which a
    second dynamically quantized linear's ``choose_qparams`` refuses; qviz's returns float32."""
    torch.manual_seed(0)
    batches = [torch.randn(6, 16) for _ in range(3)]
    ref, qdq, ours = _both(nn.Linear(16, 8), batches, is_per_channel=False, is_dynamic=True)
    calls = [n for n in ours.graph.nodes if n.target is ops.dynamic_quantized_linear]
    assert len(calls) == 1 and REPLACES in calls[0].meta
    assert _no_qdq_ops(ours) and _no_qdq_ops(ref)
    assert not [t for t in _targets(ref) if t is torch.ops.aten.linear.default]
    for x in batches:
        expected, got, theirs = qdq(x), ours(x), ref(x)
        assert got.dtype == torch.float32 and theirs.dtype == torch.float64
        scale = float(expected.abs().max())
        # float32 summation in the q/dq model; torchao truncates the bias to whole units of
        # x_scale * w_scale (measured: qviz within 1e-7, torchao 2.2e-5 of the largest output)
        assert torch.allclose(got, expected, rtol=0, atol=1e-5 * scale)
        assert torch.allclose(got.double(), theirs, rtol=0, atol=1e-4 * scale)


# --------------------------------------------------------------------------------------------
# function level, against torchao's replacement functions
# --------------------------------------------------------------------------------------------


def _t(value: float | int, dtype: torch.dtype = torch.float) -> torch.Tensor:
    return torch.tensor([value], dtype=dtype)


def _ti(value: int) -> torch.Tensor:
    return _t(value, torch.int)


def _int8(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


def _away_from_ties(value: torch.Tensor) -> torch.Tensor:
    """Elements whose float64 value is not within 1e-6 of a rounding tie (x.5)."""
    return ((value - value.floor()) - 0.5).abs() > 1e-6


def _quantize64(value: torch.Tensor, zero_point: int, low: int = -128) -> torch.Tensor:
    return (torch.round(value) + zero_point).clamp(low, 127)


_scales = st.floats(1e-3, 1.0)
_zero_points = st.integers(-128, 127)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    x_qparams=st.tuples(_scales, _zero_points),
    y_qparams=st.tuples(_scales, _zero_points),
    out_qparams=st.tuples(_scales, _zero_points),
    relu=st.booleans(),
)
def test_quantized_add_against_float64_and_torchao(seed, x_qparams, y_qparams, out_qparams, relu):
    x_q, y_q = _int8(seed, (3, 4, 5)), _int8(seed + 1, (4, 5))  # y broadcasts
    (xs, xz), (ys, yz), (os_, oz) = x_qparams, y_qparams, out_qparams
    got = ops.quantized_add(x_q, xs, xz, y_q, ys, yz, os_, oz, relu=relu)
    # the property: one rounding of float64 dequantize -> add [-> relu] -> quantize
    value = ((x_q.double() - xz) * xs + (y_q.double() - yz) * ys) / os_
    expected = _quantize64(value, oz, low=max(-128, oz) if relu else -128)
    near = ~_away_from_ties(value)
    assert torch.equal(got.double()[~near], expected[~near])
    assert (got.double() - expected).abs().max() <= 1
    reference = (
        ref_rewrite._reference_quantized_add_relu if relu else ref_rewrite._reference_quantized_add
    )
    theirs = reference(
        x_q, _t(xs), _ti(xz), y_q, _t(ys), _ti(yz), _t(os_), _ti(oz), _ti(-128), _ti(127)
    )
    # torchao rounds (add) or truncates (add + ReLU) each rescaled input on its own
    assert (theirs.int() - got.int()).abs().max() <= (2 if relu else 1)


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    x_qparams=st.tuples(_scales, _zero_points),
    out_qparams=st.tuples(_scales, _zero_points),
    geometry=st.sampled_from([(2, 2, 0), (3, 1, 1), (3, 2, 1)]),
)
def test_quantized_max_pool2d_against_float64_and_torchao(seed, x_qparams, out_qparams, geometry):
    kernel, stride, padding = geometry
    x_q = _int8(seed, (2, 3, 7, 7))
    (xs, xz), (os_, oz) = x_qparams, out_qparams
    got = ops.quantized_max_pool2d(x_q, xs, xz, os_, oz, kernel_size=kernel, stride=stride,
                                   padding=padding)  # fmt: skip
    pooled = torch.nn.functional.max_pool2d((x_q.double() - xz) * xs, kernel, stride, padding)
    value = pooled / os_
    keep = _away_from_ties(value)
    assert torch.equal(got.double()[keep], _quantize64(value, oz)[keep])
    # shared qparams (XNNPACK's): the pooled integers themselves, as torchao's rewrite gives
    shared = ops.quantized_max_pool2d(x_q, xs, xz, xs, xz, kernel_size=kernel, stride=stride,
                                      padding=padding)  # fmt: skip
    assert torch.equal(shared, torch.nn.functional.max_pool2d(x_q.float(), kernel, stride,
                                                              padding).to(torch.int8))  # fmt: skip
    theirs = ref_rewrite._reference_quantized_max_pool2d(
        x_q, _t(xs), _ti(xz), _ti(-128), _ti(127), _t(xs), _ti(xz), _ti(-128), _ti(127)
    )  # its pattern's geometry: kernel 1, stride 1
    assert torch.equal(theirs, ops.quantized_max_pool2d(x_q, xs, xz, xs, xz, kernel_size=1))


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.tuples(st.integers(1, 4), st.integers(1, 48), st.integers(1, 8)),
    x_qparams=st.tuples(_scales, _zero_points),
    w_scale=_scales,
    multiplier=st.floats(1e-3, 0.49),
    out_zero_point=_zero_points,
    use_bias=st.booleans(),
)
def test_quantized_linear_against_torchao(
    seed, shape, x_qparams, w_scale, multiplier, out_zero_point, use_bias
):
    batch, in_features, out_features = shape
    x_q = _int8(seed, (batch, in_features))
    w_q = _int8(seed + 1, (out_features, in_features)).clamp(-127, 127)
    xs, xz = x_qparams
    out_scale = xs * w_scale / multiplier
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn(out_features, generator=g) * 20 * out_scale if use_bias else None
    got = quantized_linear(x_q, xs, xz, w_q, w_scale, 0, bias, out_scale, out_zero_point)
    theirs = ref_rewrite._reference_quantized_linear(
        x_q, _t(xs), _ti(xz), _ti(-128), _ti(127), w_q, _t(w_scale), _ti(0), _ti(-127), _ti(127),
        bias if bias is not None else torch.zeros(out_features), _t(out_scale),
        _ti(out_zero_point), _ti(-128), _ti(127),
    )  # fmt: skip
    # torchao truncates the bias (< 1 accumulator unit, i.e. < `multiplier` < 0.5 output levels)
    # and the requantized value (< 1 level) where qviz rounds (<= 0.5): less than 2 levels apart
    assert (theirs.int() - got.int()).abs().max() <= 1


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), x_range=st.floats(0.01, 100.0), w_scale=_scales)
def test_dynamic_quantized_linear_against_float64_and_torchao(seed, x_range, w_scale):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(3, 24, generator=g) * x_range - x_range / 3
    w_q = _int8(seed + 1, (5, 24)).clamp(-127, 127)
    bias = torch.randn(5, generator=g)
    eps = torch.finfo(torch.float32).eps
    theirs = ref_rewrite._reference_dynamic_quantized_linear(
        x, -128, 127, eps, w_q, _t(w_scale), _ti(0), _ti(-127), _ti(127), bias
    )
    # the integers torchao's pattern computes from x (it divides by the run-time scale)
    xs, xz = torch.ops.quantized_decomposed.choose_qparams(x, -128, 127, eps, torch.int8)
    x_q = (torch.round(x / xs).to(torch.int32) + xz).clamp(-128, 127).to(torch.int8)
    got = ops.dynamic_quantized_linear(x_q, xs, xz, w_q, w_scale, 0, bias)
    x_dq = (x_q.double() - xz.double()) * xs.double()
    expected = x_dq @ (w_q.double() * w_scale).T + bias.double()
    # the property: float64 dequantize -> linear, rounded once to float32
    assert torch.allclose(got.double(), expected, rtol=1e-6, atol=1e-6)
    # torchao truncates the bias to whole units of x_scale * w_scale (< 1 unit), and both
    # results are float32: each is also rounded to a float32 step of the largest output
    unit = float(xs) * w_scale
    float32_steps = 8 * torch.finfo(torch.float32).eps * float(expected.abs().max())
    assert (theirs.double() - got.double()).abs().max() <= unit * (1 + 1e-5) + float32_steps


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(1e-4, 10.0),
    zero_point=_zero_points,
)
def test_quantize_dequantize_per_tensor_against_the_op_and_torchao(seed, scale, zero_point):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(200, generator=g) * 100 * scale
    qd = torch.ops.quantized_decomposed
    got = ops.reference_quantize_per_tensor(x, scale, zero_point, -128, 127, torch.int8)
    assert torch.equal(got, qd.quantize_per_tensor(x, scale, zero_point, -128, 127, torch.int8))
    theirs = ref_rewrite._reference_quantize_per_tensor_int8(
        x, _t(scale), _ti(zero_point), _ti(-128), _ti(127)
    )
    # torchao divides by the scale; the op multiplies by its float32 reciprocal: equal wherever
    # the two quotients round alike
    alike = torch.round(x / scale) == torch.round(x * (1.0 / scale))
    assert torch.equal(theirs[alike], got[alike])
    q = _int8(seed, (200,))
    dq = ops.reference_dequantize_per_tensor(q, scale, zero_point, -128, 127, torch.int8)
    assert torch.equal(dq, qd.dequantize_per_tensor(q, scale, zero_point, -128, 127, torch.int8))
    theirs = ref_rewrite._reference_dequantize_per_tensor_int8(
        q, _t(scale), _ti(zero_point), _ti(-128), _ti(127)
    )
    assert torch.equal(dq, theirs)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), axis=st.integers(0, 2))
def test_quantize_dequantize_per_channel_against_the_op_and_torchao(seed, axis):
    g = torch.Generator().manual_seed(seed)
    shape = (3, 4, 5)
    scales = torch.rand(shape[axis], generator=g) * 0.1 + 1e-3
    zero_points = torch.randint(-10, 10, (shape[axis],), generator=g, dtype=torch.int32)
    x = torch.randn(shape, generator=g) * 5
    qd = torch.ops.quantized_decomposed
    args = (scales, zero_points, axis, -128, 127)
    got = ops.reference_quantize_per_channel(x, *args, torch.int8)
    assert torch.equal(got, qd.quantize_per_channel(x, *args, torch.int8))
    along = [-1 if d == axis else 1 for d in range(3)]
    alike = torch.round(x / scales.reshape(along)) == torch.round(x * (1.0 / scales).reshape(along))
    theirs = ref_rewrite._reference_quantize_per_channel_int8(x, *args)
    assert torch.equal(theirs[alike], got[alike])
    q = _int8(seed, shape)
    dq = ops.reference_dequantize_per_channel(q, *args, torch.int8)
    assert torch.equal(dq, qd.dequantize_per_channel(q, *args, torch.int8))
    assert torch.equal(dq, ref_rewrite._reference_dequantize_per_channel_int8(q, *args))
