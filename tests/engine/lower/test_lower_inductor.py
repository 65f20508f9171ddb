"""qviz.lower(backend="inductor"): a converted model compiled by Inductor onto oneDNN int8 kernels.

The quantizer is qviz's X86InductorQuantizer (uint8 activations, int8 per-channel weights),
through qviz.prepare_pt2e / calibrate / convert_pt2e; the ``x86_quantizer`` fixture is the one
place that picks it. The lowering needs torchao's x86 fusion passes. Each compile takes
seconds on two cores, so the lowered models are module-scoped.
The reference is the converted model; the kernels are asserted from Inductor's generated code.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.graph.fingerprint import fingerprint
from qviz.engine.lower import inductor as inductor_lowering
from qviz.engine.lower.machine import Machine, machine
from qviz.engine.quantizers import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)
from qviz.errors import ConfigError, LoweringError, MissingDependencyError
from tests.helpers.quantize import quantize

pytest.importorskip("torchao")


#: Without VNNI, oneDNN's uint8 x int8 kernels add pairs of products in saturating 16-bit sums:
#: there the tests quantize with 7-bit activations (reduce_range), which qviz.lower takes, as
#: torch.ao's x86 default does on such CPUs.
REDUCE_RANGE = not machine().exact_u8s8


@pytest.fixture(scope="module")
def x86_quantizer():
    """A factory of the x86 quantizer: the one place the tests pick it (for this machine)."""

    def make():
        config = get_default_x86_inductor_quantization_config(reduce_range=REDUCE_RANGE)
        return X86InductorQuantizer().set_global(config)

    return make


def _snapshot(gm):
    return gm.code, {k: v.clone() for k, v in gm.state_dict().items()}


def _output_step(converted) -> float:
    """The grid step of the activation the last layer reads (its output stays float)."""
    out = next(n for n in converted.graph.nodes if n.op == "output").args[0]
    producer = out[0] if isinstance(out, (tuple, list)) else out
    dq = next(n for n in producer.all_input_nodes if "dequantize" in str(n.target))
    return float(dq.args[1])


@pytest.fixture(scope="module")
def digits(x86_quantizer):
    batches = [x for x, _ in digits_loaders(batch_size=36).calibration]
    converted = quantize(digits_model(), batches, x86_quantizer(), dynamic_batch=True).converted
    before = _snapshot(converted)
    lowered = qviz.lower(converted, (batches[0],), backend="inductor")
    return converted, batches, lowered, before


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def mlp(x86_quantizer, tmp_path_factory):
    torch.manual_seed(0)
    batches = [torch.randn(32, 16) for _ in range(4)]
    converted = quantize(_MLP(), batches, x86_quantizer()).converted
    path = tmp_path_factory.mktemp("inductor") / "mlp.py"
    lowered = qviz.lower(converted, batches[0], backend="inductor", path=path)
    return converted, batches, lowered, path


def _steps(lowered, converted, x) -> torch.Tensor:
    with torch.no_grad():
        return ((lowered(x) - converted(x)).abs() / _output_step(converted)).round()


def test_digits_outputs_stay_within_one_step_of_the_reference(digits):
    """oneDNN requantizes each conv's int32 accumulator with its own rounding; a one-step
    difference upstream moves the float output by less than one step of its input grid. Measured
    (AVX-512 VNNI, torch 2.14.1): 4 of the 1,800 outputs of the calibration split are one step
    away, none more; AVX2 (7-bit activations, clamped to their grid by the lowering): 8, none
    more. The bound leaves room for other CPUs' kernels."""
    converted, batches, lowered, _ = digits
    differing = total = 0
    for x in batches:
        steps = _steps(lowered, converted, x)
        assert lowered(x).shape == converted(x).shape and float(steps.max()) <= 1, machine()
        differing += int((steps > 0).sum())
        total += steps.numel()
    assert differing <= total // 100, (differing, total)


def test_digits_takes_any_batch(digits):
    converted, batches, lowered, _ = digits
    assert lowered.dynamic_batch
    x = batches[1][:5]
    assert lowered(x).shape == (5, 10) and float(_steps(lowered, converted, x).max()) <= 1


def test_every_conv_and_linear_runs_on_a_onednn_int8_kernel(digits):
    """Read from the generated code: five convolutions (the residual add and its relu fused
    into the second conv of the block as a binary post-op) and one linear are oneDNN int8
    calls; whatever stays float (the global average pool) says why."""
    _, _, lowered, _ = digits
    code = lowered.artifact.decode()
    assert code.count("torch.ops.onednn.qconv") == 5
    assert code.count("torch.ops.onednn.qlinear_pointwise") == 1
    by_op = {}
    for record in lowered.kernels:
        by_op.setdefault(record.op, []).append(record)
    assert [r.kernel for r in by_op["aten.conv2d"]] == ["integer"] * 5
    assert [r.kernel for r in by_op["aten.linear"]] == ["integer"]
    assert all("onednn.q" in r.where for r in by_op["aten.conv2d"] + by_op["aten.linear"])
    add = by_op["aten.add"][0]
    assert add.kernel == "integer" and "qconv2d_pointwise" in add.where
    assert all(r.reason for r in lowered.float_fallbacks())
    assert lowered.kernel_counts()["integer"] >= 11
    assert "inductor" in lowered.summary() and "onednn" in lowered._repr_html_()


def test_the_size_counts_the_code_and_the_packed_int8_weights(digits):
    _, _, lowered, _ = digits
    weights = sum(p.numel() for p in digits_model().parameters())
    assert len(lowered.artifact) < lowered.size_bytes
    assert weights < lowered.size_bytes - len(lowered.artifact) < 2 * weights  # int8, not fp32


def test_the_callers_model_is_not_changed(digits):
    converted, _, lowered, (code, state) = digits
    assert converted.code == code
    assert all(torch.equal(v, state[k]) for k, v in converted.state_dict().items())
    assert lowered.fingerprint == fingerprint(converted)
    assert not torch._inductor.config.freezing  # the configuration was patched, not set


def test_a_linear_model_runs_on_qlinear_and_writes_its_code(mlp):
    converted, batches, lowered, path = mlp
    assert path.read_bytes() == lowered.artifact and lowered.path == path
    linears = [r for r in lowered.kernels if r.op == "aten.linear"]
    assert [r.kernel for r in linears] == ["integer", "integer"]
    assert lowered.artifact.decode().count("torch.ops.onednn.qlinear_pointwise") == 2
    differing = 0
    for x in batches:
        steps = _steps(lowered, converted, x)
        assert float(steps.max()) <= 1
        differing += int((steps > 0).sum())
    assert differing <= 4 * 32 * 8 // 100, differing  # measured: none
    with pytest.raises(ConfigError, match="lowered for batch 32 only"):
        lowered.latency(4)
    assert lowered.latency(repeats=3, warmup=1) > 0


def test_a_dynamic_batch_compiles_once_for_every_batch_size(x86_quantizer):
    """Exported with dynamic_batch=True (3 input channels), the lowered program takes any batch
    of 2 or more without compiling again. (Digits' one-channel input is the exception: Inductor
    mislays a one-channel quantized conv's output with a symbolic batch, so that model compiles
    once per batch size.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(288, 4))
    batches = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    converted = quantize(model, batches, x86_quantizer(), dynamic_batch=True).converted
    lowered = qviz.lower(converted, (batches[0],), backend="inductor")
    assert [r.kernel for r in lowered.kernels if r.op in ("aten.conv2d", "aten.linear")] == [
        "integer",
        "integer",
    ]
    graphs = counters["stats"]["unique_graphs"]
    for n in (2, 5, 7):
        x = torch.randn(n, 3, 8, 8)
        assert lowered(x).shape == (n, 4) and float(_steps(lowered, converted, x).max()) <= 1
    assert counters["stats"]["unique_graphs"] == graphs


def test_compare_lowered_compares_the_model_outputs(digits):
    converted, batches, lowered, _ = digits
    result = qviz.numeric.compare_lowered(converted, lowered, batches[:2])
    assert result.granularity == "model outputs" and result.first_departure is None


@pytest.mark.parametrize("clamped", [True, False])
def test_values_beyond_a_7_bit_grid_are_clamped_where_the_reference_clamps_them(
    clamped, monkeypatch
):
    """reduce_range's activations use codes 0..127 of uint8; oneDNN's fused kernels saturate
    to 0..255, so without the lowering's clamp a value beyond the calibrated range departs from
    the reference by as many steps as it lies beyond (on every CPU); with it, none does."""
    from qviz.numeric import bisect_lowering

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(),
                          nn.Flatten(), nn.Linear(8 * 6 * 6, 4))  # fmt: skip
    calibration = [torch.randn(4, 3, 10, 10)]
    x = 4 * torch.randn(4, 3, 10, 10)  # far beyond the calibrated ranges
    config = get_default_x86_inductor_quantization_config(reduce_range=True)
    converted = quantize(model, calibration, X86InductorQuantizer().set_global(config)).converted
    if not clamped:
        monkeypatch.setattr(inductor_lowering, "clamp_to_grid", lambda gm: 0)
    lowered = qviz.lower(converted, (x,), backend="inductor")
    result = bisect_lowering(converted, lowered, x)
    assert result.agrees if clamped else result.first_departure["max_steps"] > 10


def test_int8_activations_name_the_failing_operator_and_the_quantizer():
    """XNNPACKQuantizer's symmetric int8 activations: oneDNN's int8 convolution takes uint8
    only, so Inductor fails; the error names the operator and the quantizer to use."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2)).eval()
    batches = [torch.randn(4, 3, 10, 10) for _ in range(2)]
    converted = quantize(model, batches, per_channel=True).converted
    with pytest.raises(LoweringError, match=r"Inductor failed at \w+::\w+.*X86InductorQuantizer"):
        qviz.lower(converted, (batches[0],), backend="inductor")


def test_missing_torchao_names_what_to_install(mlp, monkeypatch):
    converted, batches, _, _ = mlp
    real_import = importlib.import_module

    def no_torchao(name, *args, **kwargs):
        if name.startswith("torchao"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", no_torchao)
    with pytest.raises(MissingDependencyError, match=r"pip install 'qviz\[lower\]'"):
        qviz.lower(converted, (batches[0],), backend="inductor")


def test_bad_inputs_are_named(mlp):
    converted, batches, _, _ = mlp
    with pytest.raises(ConfigError, match="lower: example_inputs"):
        qviz.lower(converted, (batches[0][:, :4],), backend="inductor")
    with pytest.raises(ConfigError, match="got _MLP"):
        qviz.lower(_MLP(), (batches[0],), backend="inductor")


def test_a_transformer_encoder_with_a_dynamic_batch_lowers(x86_quantizer):
    """Inductor's dynamic-shape lowering fails on the x86 passes' 3-d linear patterns (a
    torch.Size built from a symbolic size); the lowering then compiles one static program per
    batch size, and each batch matches the reference to a step of its output's range."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    batches = [torch.randn(4, 8, 32) for _ in range(2)]
    converted = quantize(model, batches, x86_quantizer(), dynamic_batch=True).converted
    lowered = qviz.lower(converted, (batches[0],), backend="inductor")
    assert lowered.kernel_counts()["integer"] > 0
    for x in (batches[1], torch.randn(3, 8, 32)):
        reference = converted(x)
        step = float(reference.abs().max()) / 127
        assert float((lowered(x) - reference).abs().max()) <= 2 * step


def test_without_vnni_full_grid_activations_are_refused_and_7_bit_ones_lowered(monkeypatch):
    """On a CPU without VNNI (here: this machine seen as AVX2-only), a conv reading uint8
    activations on the full 0..255 grid could overflow oneDNN's 16-bit pair sums: refused,
    naming the node and the fix; with reduce_range (0..127) every pair fits and it lowers,
    recording the format and why."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(288, 4))
    batches = [torch.randn(4, 3, 8, 8) for _ in range(2)]
    full, seven = (
        quantize(model, batches, X86InductorQuantizer().set_global(
            get_default_x86_inductor_quantization_config(reduce_range=r))).converted
        for r in (False, True)
    )  # fmt: skip
    assert inductor_lowering.saturating_nodes(full) == ["conv2d", "linear"]
    assert inductor_lowering.saturating_nodes(seven) == []
    avx2 = Machine.from_flags("x86_64", {"avx2", "fma"}, "an AVX2 CPU", cores=2)
    monkeypatch.setattr(inductor_lowering, "machine", lambda: avx2)
    with pytest.raises(LoweringError, match=r"AVX2.*conv2d, linear.*reduce_range=True"):
        qviz.lower(full, (batches[0],), backend="inductor")
    lowered = qviz.lower(seven, (batches[0],), backend="inductor")
    assert lowered.int_format.name == "U8S8 (7-bit activations)"
    assert "reduce_range" in lowered.int_format.why
    assert float(_steps(lowered, seven, batches[1]).max()) <= 1


def test_a_batch_of_one_is_a_valid_example(digits):
    """torch specialises a traced batch of 1: the lowering traces the row twice and the
    program takes any batch."""
    converted, batches, _, _ = digits
    lowered = qviz.lower(converted, (batches[0][:1],), backend="inductor")
    for x in (batches[1][:1], batches[1][:3]):
        assert float(_steps(lowered, converted, x).max()) <= 1, machine()
