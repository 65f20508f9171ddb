"""The numeric suite on real Hugging Face models, as a practitioner's would be: a DistilBERT
encoder and a Llama decoder built from tiny configs (random weights, 32 tokens), exported with
``qviz.export`` and quantized for XNNPACK. Their outputs are ``ModelOutput`` objects (a dict and
a dataclass of tensors); every public entry point must measure them leaf by leaf and report only
numbers, and what decides on a figure (ranking, the precision search, repair) must refuse one
that is not a number.

Measured (torch 2.14, transformers 5.x, CPU): compare's output SQNR was NaN on both before the
fix (the output's tensors were never found, so nothing was compared), and the precision search
then read an infinite SQNR ("target met at inf dB" with every layer at w4a8).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.graph.fingerprint import fingerprint
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import MeasurementError, QvizError
from qviz.numeric import (
    RepairSession,
    compare,
    compare_lowered,
    diagnose,
    search_precision,
    sensitivity,
)
from qviz.numeric.measure.batches import flat_tensors, output_leaves
from tests.helpers.quantize import quantize

transformers = pytest.importorskip("transformers")

TOKENS, VOCAB = 32, 64


def _distilbert() -> nn.Module:
    config = transformers.DistilBertConfig(
        n_layers=1, dim=32, hidden_dim=64, n_heads=2, vocab_size=VOCAB,
        max_position_embeddings=TOKENS,
    )  # fmt: skip
    return transformers.DistilBertModel(config)


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=VOCAB, use_cache=False,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


#: family -> (builder, its output leaf, the feed-forward block the small searches stay in)
MODELS = {
    "distilbert": (_distilbert, "output.last_hidden_state", "transformer.layer.0.ffn"),
    "llama": (_llama, "output.logits", "model.layers.0.mlp"),
}


class HF:
    """One model through the flow, shared by this module's tests."""

    def __init__(self, family: str) -> None:
        build, self.leaf, self.block = MODELS[family]
        torch.manual_seed(0)
        self.model = build().eval()
        self.data = [torch.randint(0, VOCAB, (2, TOKENS)) for _ in range(2)]
        self.quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        self.gm, self.prepared, self.converted = quantize(self.model, self.data, self.quantizer)
        self.report = compare(self.gm, self.converted, self.data, progress=False)

    def block_quantizer(self) -> XNNPACKQuantizer:
        """The feed-forward block alone quantized: a few operators to rank or search over."""
        config = get_symmetric_quantization_config()
        return XNNPACKQuantizer().set_module_name(self.block, config)


@pytest.fixture(scope="module", params=sorted(MODELS))
def hf(request) -> HF:
    return HF(request.param)


def _finite(*values: float) -> bool:
    return all(isinstance(v, float | int) and math.isfinite(v) for v in values)


def _sqnr(reference: torch.Tensor, test: torch.Tensor) -> float:
    ref, err = reference.detach().double(), (test - reference).detach().double()
    return 10 * math.log10(float((ref * ref).sum()) / float((err * err).sum()))


def test_the_output_is_a_model_output_whose_leaves_are_found_in_export_order(hf):
    out = hf.gm(hf.data[0])
    assert isinstance(out, transformers.utils.ModelOutput)
    assert [path for path, _ in output_leaves(out)] == [hf.leaf]
    # the order torch.export flattens it in: a lowered program returns its outputs so
    assert [t is leaf for t, leaf in zip(torch.utils._pytree.tree_leaves(out), flat_tensors(out),
                                         strict=True)] == [True]  # fmt: skip


def test_compare_measures_the_output_leaf_by_leaf(hf):
    report = hf.report
    assert report.output_problem is None
    assert _finite(report.output_sqnr) and report.output_sqnr > 10
    assert list(report.output_leaves) == [hf.leaf]
    # the figure is the output's SQNR over both batches, computed independently
    refs = [getattr(hf.gm(x), hf.leaf.split(".")[1]) for x in hf.data]
    tests = [getattr(hf.converted(x), hf.leaf.split(".")[1]) for x in hf.data]
    expected = _sqnr(torch.cat(refs), torch.cat(tests))
    assert report.output_sqnr == pytest.approx(expected, abs=1e-3)
    assert report.df["local_sqnr"].map(math.isfinite).all()
    assert report.df["cumulative_sqnr"].map(math.isfinite).all()
    assert "output SQNR" in report.summary() and "nan" not in report.summary()


def test_diagnose_reports_finite_figures(hf):
    diagnosis = diagnose(hf.report, hf.prepared, data=hf.data)
    assert all(_finite(f.sqnr, f.severity) for f in diagnosis.findings)


def test_sensitivity_ranks_on_finite_output_figures(hf):
    df = sensitivity(hf.gm, hf.block_quantizer(), hf.data[:1], progress=False)
    assert len(df) >= 2
    assert df["output_sqnr"].map(math.isfinite).all() and df["delta_sqnr"].map(math.isfinite).all()
    assert _finite(df.attrs["quantized_output_sqnr"])


def test_search_precision_measures_and_reproduces_its_choice(hf):
    """A target just below the block at w8a8: the first guess (all w4a8) misses it, so the
    units are screened and the front confirmed, on figures that are all numbers."""
    prepared = qviz.prepare_pt2e(hf.gm, hf.block_quantizer())
    w8a8 = qviz.convert_pt2e(qviz.calibrate(prepared, hf.data, progress=False))
    target = compare(hf.gm, w8a8, hf.data, progress=False).output_sqnr - 1.0
    result = search_precision(hf.gm, hf.block_quantizer(), hf.data, min_sqnr=target,
                              candidates=["w4a8", "w8a8"], screening_data=hf.data[:1],
                              max_evaluations=3, progress=False)  # fmt: skip
    assert result.screened and result.met, result.summary()
    figures = [e.output_sqnr for e in result.evaluations] + [s.output_sqnr for s in
                                                              result.screened]  # fmt: skip
    assert _finite(*figures, *(p.estimate for p in result.front)), result.summary()
    assert "inf" not in result.summary() and "nan" not in result.summary()
    # the model rebuilt from the choice measures what the search measured
    prepared = qviz.prepare_pt2e(hf.gm, result.quantizer())
    rebuilt = qviz.convert_pt2e(qviz.calibrate(prepared, hf.data, progress=False))
    again = compare(hf.gm, rebuilt, hf.data, progress=False).output_sqnr
    chosen = [e for e in result.full_evaluations if e.point == result.chosen][-1]
    assert again == pytest.approx(chosen.output_sqnr, abs=1e-6) and again >= target


def test_repair_session_reports_finite_figures(hf):
    session = RepairSession(hf.gm, hf.quantizer, hf.data, hf.data, progress=False)
    assert session.baseline.output_sqnr == pytest.approx(hf.report.output_sqnr, abs=1e-9)
    worst = str(session.baseline.worst(1)["node"].iloc[0])
    step = session.apply("fallback", nodes=[worst])
    assert _finite(step.output_sqnr_before, step.output_sqnr_after, step.delta)
    assert "nan" not in repr(session)


class _Program:
    """What ``qviz.lower`` returns, in what compare_lowered reads (its backend, artifact and
    fingerprint), running the reference itself: the lowered program's flat outputs (one
    tensor, or a tuple), as ExecuTorch and Inductor return them."""

    def __init__(self, converted, shift: float = 0.0) -> None:
        self.converted, self.shift = converted, shift
        self.backend, self.artifact = "xnnpack", b"stand-in"
        self.fingerprint = fingerprint(converted)

    def __call__(self, *args):
        outputs = [t + self.shift for t in flat_tensors(self.converted(*args))]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def test_compare_lowered_pairs_the_outputs_leaf_by_leaf(hf):
    result = compare_lowered(hf.converted, _Program(hf.converted), hf.data, float_model=hf.gm)
    rows = result.df
    assert rows["tensor"].tolist() == [hf.leaf] and rows["op"].tolist() == ["output"]
    assert rows["max_steps"].tolist() == [0] and result.first_departure is None
    assert rows["cumulative_sqnr"].tolist() == pytest.approx([hf.report.output_sqnr], abs=1e-9)


@pytest.mark.slow
def test_compare_lowered_on_xnnpack(hf):
    """The real program (ExecuTorch's XNNPACK delegate, ~35-65 s to lower on two busy cores)."""
    pytest.importorskip("executorch")
    lowered = qviz.lower(hf.converted, (hf.data[0],), backend="xnnpack")
    result = compare_lowered(hf.converted, lowered, hf.data, float_model=hf.gm)
    rows = result.df
    assert rows["tensor"].tolist() == [hf.leaf]
    assert rows["elements"].tolist() == [sum(t.numel() for t in flat_tensors(
        [hf.converted(x) for x in hf.data]))]  # fmt: skip
    assert result.first_departure is None, result  # one step is an integer kernel's rounding
    assert _finite(*rows["cumulative_sqnr"], *rows["share"])


# -- what is not a number is refused -------------------------------------------------------------


class _Classes(nn.Module):
    """A classifier that returns the predicted class only: no floating-point output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x).argmax(-1)


class _Masked(nn.Module):
    """Logits and an additive attention mask with ``-inf`` where a position is masked."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        mask = torch.where(x[:, :4] > 0, 0.0, float("-inf"))
        return {"logits": self.fc(x), "mask": mask, "ids": x.argmax(-1)}


@pytest.fixture(scope="module")
def classes():
    torch.manual_seed(0)
    data = [torch.randn(16, 8) for _ in range(2)]
    gm = qviz.export(_Classes().eval(), (data[0],))
    return gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config()), data


def test_an_output_without_a_floating_point_tensor_is_not_measured(classes):
    gm, quantizer, data = classes
    prepared = qviz.calibrate(qviz.prepare_pt2e(gm, quantizer), data, progress=False)
    report = compare(gm, qviz.convert_pt2e(prepared), data, progress=False)
    assert math.isnan(report.output_sqnr)
    assert "no floating-point tensor" in report.output_problem
    assert "output SQNR not measured" in report.summary()


def test_search_precision_refuses_a_figure_that_is_not_a_number(classes):
    gm, quantizer, data = classes
    with pytest.raises(MeasurementError, match=r"search_precision: the first guess .*output "
                       r"SQNR is nan dB.*no floating-point tensor.*int64"):  # fmt: skip
        search_precision(gm, quantizer, data, min_sqnr=20.0, candidates=["w4a8", "w8a8"],
                         progress=False)  # fmt: skip


def test_repair_session_refuses_a_figure_that_is_not_a_number(classes):
    gm, quantizer, data = classes
    with pytest.raises(MeasurementError, match=r"RepairSession: the baseline .*nan dB.*return "
                       r"the float outputs"):  # fmt: skip
        RepairSession(gm, quantizer, data, data, progress=False)


def test_sensitivity_refuses_a_figure_that_is_not_a_number(classes):
    gm, quantizer, data = classes
    with pytest.raises(MeasurementError, match="sensitivity: the fully quantized model"):
        sensitivity(gm, quantizer, data, progress=False)


def test_sensitivity_refuses_a_metric_that_is_not_a_number():
    torch.manual_seed(0)
    data = [torch.randn(16, 8) for _ in range(2)]
    gm = qviz.export(nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval(), (data[0],))
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    # refused per batch where the batch is read, or as the averaged figure: never ranked
    with pytest.raises(QvizError, match=r"the metric .*nan.*finite number"):
        sensitivity(gm, quantizer, data, metric=lambda f, q, t: math.nan, progress=False)


def test_an_infinite_mask_in_both_outputs_is_equal_not_noise():
    torch.manual_seed(0)
    data = [torch.randn(16, 8) for _ in range(2)]
    gm = qviz.export(_Masked().eval(), (data[0],))
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = qviz.calibrate(qviz.prepare_pt2e(gm, quantizer), data, progress=False)
    converted = qviz.convert_pt2e(prepared)
    report = compare(gm, converted, data, progress=False)
    assert report.output_problem is None and list(report.output_leaves) == [
        "output.logits", "output.mask"]  # fmt: skip
    # the mask is equal (its infinities included); the figure is the logits' noise over the
    # signal of the logits and the mask's finite elements
    logits = _sqnr(torch.cat([gm(x)["logits"] for x in data]),
                   torch.cat([converted(x)["logits"] for x in data]))  # fmt: skip
    assert report.output_leaves["output.logits"] == pytest.approx(logits, abs=1e-3)
    assert report.output_leaves["output.mask"] == math.inf
    assert report.output_sqnr == pytest.approx(logits, abs=1e-3)  # the mask adds no signal
