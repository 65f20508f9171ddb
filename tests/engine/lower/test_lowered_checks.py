"""What a LoweredModel and qviz.lower refuse, by name, before a runtime sees it; batch-1
examples; the max_batch bound; the comparison with the same backend's float program."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.lower.speed import SpeedComparison, float_twin
from qviz.errors import ConfigError, LoweringError, QvizError
from tests.helpers.quantize import quantize

BACKENDS = ("xnnpack", "onnxruntime")


@pytest.fixture(scope="module")
def digits():
    batches = [x for x, _ in digits_loaders(batch_size=36).calibration][:3]
    return quantize(digits_model(), batches, dynamic_batch=True).converted, batches


@pytest.fixture(scope="module", params=BACKENDS)
def lowered_from_one_row(request, digits):
    """Lowered from a batch-1 example (traced as a batch of 2 behind the scenes)."""
    converted, batches = digits
    return qviz.lower(converted, (batches[0][:1],), backend=request.param)


def test_a_batch_of_one_is_a_valid_example_and_any_batch_runs(lowered_from_one_row, digits):
    converted, batches = digits
    lowered = lowered_from_one_row
    step = float(converted.plan.group_of("linear").qparams.scale)
    for x in (batches[1][:1], batches[1][:5], batches[1]):
        assert float((lowered(x) - converted(x)).abs().max()) <= step * 1.0001, lowered.machine
    assert lowered.latency(1, repeats=2, warmup=1) > 0


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (lambda x: (x.numpy(),), r"input 0: .*takes torch tensors, got numpy\.ndarray.*from_numpy"),
        (lambda x: (x, x), r"takes 1 input\(s\).*got 2"),
        (lambda x: (x.double(),), r"input 0 is torch\.float64.*takes torch\.float32"),
        (lambda x: (x[:, :, :4],), r"input 0 has shape \(36, 1, 4, 8\).*takes \(N, 1, 8, 8\)"),
        (lambda x: (x[0],), r"input 0 has shape \(1, 8, 8\)"),
        (lambda x: (x.to("meta"),), r"input 0 is on meta.*x\.cpu\(\)"),
        (lambda x: (torch.cat([x] * 30),), r"batches up to \d+ .*got 1080"),
    ],
)
def test_a_wrong_input_is_named_before_the_runtime_sees_it(
    lowered_from_one_row, digits, bad, match
):
    _, batches = digits
    if "batches up to" in match and lowered_from_one_row.max_batch is None:
        pytest.skip("onnxruntime plans no bound: any batch runs")
    with pytest.raises(ConfigError, match=match):
        lowered_from_one_row(*bad(batches[0]))


def test_a_fixed_batch_program_refuses_another_batch(digits):
    _, batches = digits
    fixed = quantize(digits_model(), batches).converted
    lowered = qviz.lower(fixed, (batches[0],), backend="onnxruntime")
    with pytest.raises(ConfigError, match=r"batch 5; .*lowered for batch 36 only"):
        lowered(batches[0][:5])


@pytest.mark.parametrize("bad", [0, 1, True, 2.5, "8", 2**40, -3])
def test_max_batch_is_a_bound_the_runtime_can_plan(digits, bad):
    converted, batches = digits
    with pytest.raises(ConfigError, match=rf"max_batch={bad!r}\): give an int from 2 to"):
        qviz.lower(converted, (batches[0],), backend="xnnpack", max_batch=bad)


def test_the_program_plans_for_max_batch_from_a_small_example(digits):
    """ExecuTorch plans 15 rows from an example of fewer than 16: the example is repeated to
    16 behind the scenes, so the bound asked for is the bound planned."""
    converted, batches = digits
    lowered = qviz.lower(converted, (batches[0][:2],), backend="xnnpack", max_batch=40)
    assert lowered.max_batch == 40
    x = torch.cat([batches[0], batches[1][:4]])
    assert float((lowered(x) - converted(x)).abs().max()) < 0.2


@pytest.fixture(scope="module")
def files(digits, tmp_path_factory):
    """The converted model's .onnx, the float model's, another model's, a corrupt one."""
    onnx = pytest.importorskip("onnx")
    converted, batches = digits
    folder = tmp_path_factory.mktemp("artifacts")
    qviz.lower(converted, (batches[0],), backend="onnxruntime", path=folder / "digits.onnx")
    x = batches[0]
    float_program = torch.onnx.export(digits_model().eval(), (x,), dynamo=True, verbose=False)
    onnx.save(float_program.model_proto, str(folder / "float.onnx"))
    linear = nn.Sequential(nn.Flatten(), nn.Linear(64, 5))
    other = quantize(linear, batches, dynamic_batch=True).converted
    qviz.lower(other, (x,), backend="onnxruntime", path=folder / "other.onnx")
    (folder / "corrupt.onnx").write_bytes((folder / "digits.onnx").read_bytes()[:300])
    (folder / "notes.txt").write_text("not a model")
    return folder


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("corrupt.onnx", r"is not an ONNX model"),
        ("notes.txt", r"is not an ONNX model"),
        (".", r"is a folder: give the \.onnx file"),
        ("float.onnx", r"is a float model: it has no QuantizeLinear"),
        (
            "other.onnx",
            r"another model's \.onnx: its outputs are float32\[N, 5\].*float32\[N, 10\]",
        ),
    ],
)
def test_a_given_artifact_is_checked_against_the_converted_model(digits, files, name, match):
    converted, batches = digits
    code, state = converted.code, {k: v.clone() for k, v in converted.state_dict().items()}
    with pytest.raises(ConfigError, match=match):
        qviz.lower(converted, (batches[0],), backend="onnxruntime", artifact=files / name)
    assert converted.code == code
    assert all(torch.equal(v, state[k]) for k, v in converted.state_dict().items())
    ok = qviz.lower(converted, (batches[0],), backend="onnxruntime", artifact=files / "digits.onnx")
    assert ok.int_format is not None and ok.machine.isa in ok.summary()


def test_a_lowering_failure_is_a_lowering_error_not_a_config_error():
    assert issubclass(LoweringError, QvizError) and not issubclass(LoweringError, ConfigError)
    assert qviz.LoweringError is LoweringError


def test_the_float_twin_computes_the_converted_model_in_float(digits):
    converted, batches = digits
    twin = float_twin(converted)
    assert not any("quantize" in str(n.target) for n in twin.graph.nodes)
    assert any("quantize" in str(n.target) for n in converted.graph.nodes)  # not changed
    x = batches[1]
    logits = digits_model().eval()(x)
    # the twin is the float model with its weights rounded to the int8 grid
    assert torch.equal(twin(x).argmax(1), logits.argmax(1)) or float(
        (twin(x) - logits).abs().max()
    ) < 0.05 * float(logits.abs().max())


@pytest.mark.parametrize("backend", BACKENDS)
def test_speed_is_int8_against_the_same_backends_float_program(digits, backend):
    converted, batches = digits
    lowered = qviz.lower(converted, (batches[0],), backend=backend)
    speed = lowered.compare_speed(converted, (1, 8), repeats=2)
    assert isinstance(speed, SpeedComparison) and lowered.speed is speed
    assert [r.batch for r in speed.rows] == [1, 8]
    assert all(r.int8_seconds > 0 and r.float_seconds > 0 for r in speed.rows)
    assert speed.machine == lowered.machine.describe()
    summary = lowered.summary()
    assert speed.float_program in summary and "batch 8: int8" in summary
    with pytest.raises(
        ConfigError, match="the lowered program was made from another model than this one"
    ):
        linear = nn.Sequential(nn.Flatten(), nn.Linear(64, 5))
        other = quantize(linear, batches[:1], dynamic_batch=True).converted
        lowered.compare_speed(other, repeats=1)


class _Decoder(nn.Module):
    """A Hugging Face causal LM called on token ids, returning its logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).logits


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_real_decoders_lower_to_xnnpack(family):
    """GPT-2 (its attention's reshape after a transpose) and a Llama-shaped decoder (rotary
    embeddings, grouped-query attention), from small configs: every linear on XNNPACK's int8
    kernels, the outputs the reference's."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                         n_positions=32, use_cache=False)  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32,
                                          intermediate_size=64, num_attention_heads=2,
                                          num_key_value_heads=1, vocab_size=64,
                                          use_cache=False)  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (2, 16))
    converted = quantize(_Decoder(model.eval()), [ids]).converted
    lowered = qviz.lower(converted, (ids,), backend="xnnpack")
    reference = converted(ids)
    assert float((lowered(ids) - reference).abs().max()) <= 0.05 * float(reference.abs().max())
    linears = [r for r in lowered.kernels if r.kernel == "integer" and ("mm" in r.op or "linear"
               in r.op)]  # fmt: skip
    assert linears, lowered.summary()
    with pytest.raises(ConfigError, match="takes torch tensors"):
        lowered(np.zeros((2, 16), np.int64))
