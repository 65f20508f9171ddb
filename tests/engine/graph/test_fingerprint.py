"""A model's fingerprint (house rule 14): stable over copies and stages of one model, different
for another model, and the one check every consumer of a report calls."""

from __future__ import annotations

import copy

import pytest
import torch

from qviz.engine.graph.fingerprint import Fingerprint, check_fingerprint, fingerprint
from qviz.errors import ConfigError
from tests.helpers.two_models import two_models

pytest.importorskip("pandas")


def test_one_model_has_one_graph_fingerprint_across_copies_stages_and_programs():
    small = two_models().small
    fp = fingerprint(small.quantized)
    assert fp == fingerprint(copy.deepcopy(small.quantized))  # every part, the tensors too
    same_graph = [small.prepared, torch.export.export(small.quantized, (small.x,)), small.float]
    assert {fingerprint(m).digest for m in same_graph} == {fp.digest}  # no BatchNorm folded
    assert fp.operators == 1


def test_the_stages_of_one_model_share_its_lineage():
    small = two_models().small
    float_fp, prepared_fp = fingerprint(small.float), fingerprint(small.prepared)
    quantized_fp = fingerprint(small.quantized)
    assert float_fp.origin == float_fp.tensors  # a float model is its own origin
    assert prepared_fp.origin == quantized_fp.origin == float_fp.tensors
    assert quantized_fp.calibrated == prepared_fp.tensors  # converted with these statistics
    assert len({float_fp.tensors, prepared_fp.tensors, quantized_fp.tensors}) == 3


def test_another_model_with_the_same_names_has_another_fingerprint():
    models = two_models()
    assert fingerprint(models.small.quantized) != fingerprint(models.large.quantized)
    assert fingerprint(models.large.quantized).operators == 2


def test_a_report_knows_the_models_it_measured():
    large = two_models().large
    assert large.report.fingerprint == fingerprint(large.quantized)
    assert large.report.float_fingerprint == fingerprint(large.float)
    kept = copy.deepcopy(large.report)
    check_fingerprint(kept, copy.deepcopy(large.quantized), "test")  # the same model: accepted


def test_a_report_of_another_model_is_refused_naming_both():
    models = two_models()
    with pytest.raises(ConfigError, match=r"test: the report measured another model than this "
                       r"one: other operators \(model \w{16} \(1 operator\) against model \w{16} "
                       r"\(2 operators\)\).*run qviz.numeric.compare on this model"):  # fmt: skip
        check_fingerprint(models.small.report, models.large.quantized, "test")


def test_a_table_without_a_fingerprint_is_left_to_the_callers_checks():
    check_fingerprint(object(), two_models().large.quantized, "test")
    assert isinstance(fingerprint(torch.nn.Linear(2, 2)), Fingerprint)
    with pytest.raises(ConfigError, match="needs a model"):
        fingerprint(3)


def test_a_quant_nn_report_knows_its_eager_models():
    import qviz
    import qviz.numeric
    from qviz.engine.tensor.quant_modules import quantize_model

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    data = [torch.randn(8, 4)]
    quantized = quantize_model(model)
    qviz.calibrate_quantizers(quantized, data, progress=False)
    report = qviz.numeric.compare(model, quantized, data, progress=False)
    assert report.fingerprint == fingerprint(copy.deepcopy(quantized))
    assert report.float_fingerprint == fingerprint(model) != report.fingerprint


def test_variants_prepared_inside_known_origin_digest_the_float_weights_once(monkeypatch):
    """sensitivity, compare_configs and search_precision prepare every variant inside
    known_origin: the float model's weights are hashed once, not once per variant, and the
    variants carry the same origin as when each digests them itself."""
    import qviz
    from qviz.engine.graph import fingerprint as module
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(4, 4)).eval(), (torch.randn(2, 4),))
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    alone = qviz.prepare_pt2e(gm, quantizer)
    digests = []
    real = module.tensors_digest
    monkeypatch.setattr(module, "tensors_digest", lambda m: digests.append(m) or real(m))
    with module.known_origin(gm) as digest:
        variants = [qviz.prepare_pt2e(gm, quantizer) for _ in range(3)]
    assert sum(m is gm for m in digests) == 1
    assert {fingerprint(v).origin for v in variants} == {fingerprint(alone).origin, digest}
    qviz.prepare_pt2e(gm, quantizer)  # outside the block: digested again
    assert sum(m is gm for m in digests) == 2
