"""qviz.lower: the converted digits model on ExecuTorch XNNPACK and onnxruntime kernels.

Measured here (torch 2.14.1, executorch 1.5.1, onnxruntime CPU, the calibration split): both
lowered models agree with the reference model to one step of the output's grid (integer kernels
requantize with their own rounding); every conv and linear runs on an integer kernel; the
lowered artifacts are about 4x smaller than the float weights.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.graph.fingerprint import fingerprint
from qviz.engine.lower import LoweredModel
from qviz.errors import ConfigError, MissingDependencyError
from tests.helpers.quantize import quantize

#: The backends that take XNNPACKQuantizer's int8 activations (inductor's oneDNN kernels take
#: uint8: tests/engine/lower/test_lower_inductor.py).
BACKENDS = ("xnnpack", "onnxruntime")


@pytest.fixture(scope="module")
def digits():
    batches = [x for x, _ in digits_loaders(batch_size=36).calibration]
    return quantize(digits_model(), batches, dynamic_batch=True).converted, batches


@pytest.fixture(scope="module", params=BACKENDS)
def lowered(request, digits):
    converted, batches = digits
    return qviz.lower(converted, (batches[0],), backend=request.param)


def test_the_lowered_model_agrees_with_the_reference_to_one_output_step(lowered, digits):
    converted, batches = digits
    step = float(converted.plan.group_of("linear").qparams.scale)
    for x in batches:
        reference = converted(x)
        got = lowered(x)
        assert got.shape == reference.shape and got.dtype == reference.dtype
        assert float((got - reference).abs().max()) <= step * 1.0001


def test_which_operators_run_on_integer_kernels_is_recorded(lowered, digits):
    """XNNPACK takes the whole graph: every conv, the add, the relus, the mean and the linear
    run as int8 kernels. So does onnxruntime: the five convolutions (QLinearConv), the residual
    add (QLinearAdd, which takes the tensor the residual connection reads twice), the mean
    (QLinearGlobalAveragePool) and the linear (QGemm). Every compute operator names the
    converted model's node it computes."""
    integer = [r for r in lowered.kernels if r.kernel == "integer"]
    float_ops = [r for r in lowered.kernels if r.kernel == "float"]
    assert all(r.reason for r in float_ops)  # a float operator says why
    assert lowered.backend in lowered.summary() and "integer" in lowered._repr_html_()
    if lowered.backend == "xnnpack":
        assert not float_ops
        assert sum("convolution" in r.op for r in integer) == 5
        assert sum("linear" in r.op for r in integer) == 1
    else:
        ops = [r.op for r in integer]
        assert (ops.count("QLinearConv"), ops.count("QLinearAdd"), ops.count("QGemm")) == (5, 1, 1)
        assert ops.count("QLinearGlobalAveragePool") == 1 and not float_ops
    converted_ops = {n.name for n in digits[0].graph.nodes if n.op == "call_function"}
    computed = {r.source for r in integer}
    assert computed <= converted_ops
    assert {"conv2d", "conv2d_4", "add", "adaptive_avg_pool2d", "linear"} <= computed


def test_the_artifact_is_smaller_than_the_float_weights(lowered):
    """int8 weights: the .pte is 3.4x smaller than the float weights, the .onnx 2.3x (it also
    holds each weight's scales and the int32 biases as separate initialisers)."""
    float_bytes = sum(t.numel() * t.element_size() for t in digits_model().state_dict().values())
    assert lowered.size_bytes < float_bytes / (3 if lowered.backend == "xnnpack" else 2)


def test_latency_at_any_batch_and_the_fixed_batch_refusal(lowered, digits):
    assert 0 < lowered.latency(1, repeats=3, warmup=1) < 5
    assert 0 < lowered.latency(8, repeats=3, warmup=1) < 5
    assert lowered(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    _, batches = digits
    converted = quantize(digits_model(), batches[:1]).converted
    fixed = qviz.lower(converted, (batches[0],), backend=lowered.backend)
    with pytest.raises(ConfigError, match="lowered for batch 36 only"):
        fixed.latency(8)
    with pytest.raises(ConfigError, match="repeats=0"):
        fixed.latency(repeats=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_converted_model_is_not_changed_and_the_artifact_is_written(backend, digits, tmp_path):
    converted, batches = digits
    state = {k: v.clone() for k, v in converted.state_dict().items()}
    code = converted.code
    path = tmp_path / ("model.pte" if backend == "xnnpack" else "model.onnx")
    lowered = qviz.lower(converted, batches[0], backend=backend, path=path)
    assert isinstance(lowered, LoweredModel) and lowered.path == path
    assert path.stat().st_size == lowered.size_bytes
    assert converted.code == code
    assert all(torch.equal(v, state[k]) for k, v in converted.state_dict().items())
    assert lowered.fingerprint == fingerprint(converted)


class _LinearSin(nn.Module):
    """A linear the XNNPACK quantizer quantizes, then a sine it leaves in float."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        return torch.sin(self.fc(x))


def test_an_operator_left_in_float_is_recorded_as_float_with_its_reason():
    batches = [torch.randn(4, 6) for _ in range(3)]
    converted = quantize(_LinearSin(), batches, per_channel=False, dynamic_batch=True).converted
    for backend in BACKENDS:
        lowered = qviz.lower(converted, (batches[0],), backend=backend)
        sine = [r for r in lowered.kernels if "sin" in r.op.lower()]
        assert len(sine) == 1 and sine[0].kernel == "float" and sine[0].reason, lowered.summary()
        assert sine[0] in lowered.float_fallbacks()
        assert torch.allclose(lowered(batches[1]), converted(batches[1]), atol=0.02)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c, x: qviz.lower(c, (x,), backend="tensorrt"), r"backend='tensorrt'.*'xnnpack'"),
        (lambda c, x: qviz.lower(digits_model(), (x,)), r"got DigitsNet: prepare, calibrate"),
        (lambda c, x: qviz.lower(c, [x]), r"example_inputs must be a tuple"),
        (lambda c, x: qviz.lower(c, (x[:, :, :4],)), r"lower: example_inputs"),
    ],
)
def test_bad_arguments_are_named(call, match, digits):
    converted, batches = digits
    with pytest.raises(ConfigError, match=match):
        call(converted, batches[0])


def test_a_missing_backend_package_names_what_to_install(digits, monkeypatch):
    converted, batches = digits
    real_import = importlib.import_module

    def no_executorch(name, *args, **kwargs):
        if name.startswith("executorch"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_executorch)
    with pytest.raises(MissingDependencyError, match=r"pip install 'qviz\[lower\]'"):
        qviz.lower(converted, (batches[0],), backend="xnnpack")


class _Refused(nn.Module):
    """A quantized conv, then a mean over channels and an amax XNNPACK does not take."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y.amax(dim=(2, 3)) + y.mean(dim=1).flatten(1)[:, :4]


def test_xnnpacks_own_reason_for_each_operator_it_refused():
    import logging

    x = torch.randn(2, 3, 8, 8)
    converted = quantize(_Refused(), [x]).converted
    logger = logging.getLogger("executorch.backends.xnnpack")
    before = (logger.level, logger.propagate, list(logger.handlers))
    lowered = qviz.lower(converted, (x,), backend="xnnpack")
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    refused = {r.source: r for r in lowered.float_fallbacks() if r.where.startswith("ExecuTorch")}
    # the partitioner's own words, and a plain "no kernel" where it has no config at all
    assert "mean.dim only supports" in refused["mean"].reason
    assert refused["amax"].reason.endswith("XNNPACK has no kernel for aten.amax.default")
    assert {"conv2d", "relu"} <= {r.source for r in lowered.kernels if r.kernel == "integer"}


def test_a_shipped_onnx_is_run_as_it_is_and_measured_against_the_reference(digits, tmp_path):
    """lower(artifact=...) runs a given .onnx (a scale altered after export, as a faulty
    toolchain might) instead of exporting: its outputs carry the defect, compare_lowered
    names the altered tensor, and a clean export of the same model agrees."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    from qviz.numeric import compare_lowered

    converted, batches = digits
    clean = qviz.lower(converted, (batches[0],), backend="onnxruntime", path=tmp_path / "m.onnx")
    model = onnx.load(str(tmp_path / "m.onnx"))
    node = [n for n in model.graph.node if n.op_type == "QuantizeLinear"][4]
    scale = next(i for i in model.graph.initializer if i.name == node.input[1])
    model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(scale) * 2, "s2"))
    node.input[1] = "s2"
    onnx.save(model, str(tmp_path / "shipped.onnx"))
    shipped = qviz.lower(converted, (batches[0],), backend="onnxruntime",
                         artifact=tmp_path / "shipped.onnx")  # fmt: skip
    assert shipped.artifact == (tmp_path / "shipped.onnx").read_bytes()
    x = batches[0]
    assert not torch.equal(shipped(x), clean(x))  # the defect is in what runs
    found = compare_lowered(converted, shipped, batches[:2], tolerance=3).first_departure
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    assert found["tensor"] == [n.name for n in converted.graph.nodes if n.target == quantize][4]
    with pytest.raises(ConfigError, match=r"runs a given \.onnx on onnxruntime"):
        qviz.lower(converted, (x,), backend="xnnpack", artifact=tmp_path / "shipped.onnx")
    with pytest.raises(ConfigError, match="no such file"):
        qviz.lower(converted, (x,), backend="onnxruntime", artifact=tmp_path / "none.onnx")


def test_a_dynamic_xnnpack_program_is_bounded_by_max_batch():
    """ExecuTorch plans the memory of operators outside a delegate for the largest batch: the
    program takes batches up to the bound its runtime planned (read back from the loaded
    program, at most max_batch) and refuses a larger one by name, instead of an unbounded plan
    that cannot be allocated (std::bad_alloc on a transformer encoder)."""
    from executorch.runtime import Runtime

    x = torch.randn(4, 3, 8, 8)
    converted = quantize(_Refused(), [x], dynamic_batch=True).converted
    lowered = qviz.lower(converted, (x,), backend="xnnpack", max_batch=12)
    method = Runtime.get().load_program(lowered.artifact).load_method("forward")
    planned = method.metadata.input_tensor_meta(0).sizes()[0]
    assert lowered.max_batch == min(planned, 12) >= 4
    most = torch.randn(lowered.max_batch, 3, 8, 8)
    assert lowered(most).shape == converted(most).shape  # the bound itself runs
    with pytest.raises(ConfigError, match=rf"batches up to {lowered.max_batch} .*got "):
        lowered(torch.randn(lowered.max_batch + 1, 3, 8, 8))
    with pytest.raises(ConfigError, match="max_batch"):
        qviz.lower(converted, (x,), backend="xnnpack", max_batch=1)
    assert qviz.lower(converted, (x,), backend="onnxruntime").max_batch is None
