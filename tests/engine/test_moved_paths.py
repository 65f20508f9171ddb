"""The engine's modules moved into subpackages; what users wrote against the old paths still works.

* Seed 004's public paths (``qviz.engine.tensor_quant``, ``quant_nn``, ``quant_modules``,
  ``calib``) name the same module objects as their new homes, so classes are defined once.
* Objects saved with ``torch.save`` by the tree before the move (``tests/fixtures``, written by
  ``make_premove_models.py`` at that commit) load and compute what they computed then: a
  calibrated quant_nn model pickled whole, a prepared model's observer and a QAT fake quantizer;
  the prepared and QAT-prepared models' state_dicts load into freshly prepared models.
"""

from __future__ import annotations

import importlib
import pathlib

import pytest
import torch

import qviz
from qviz.engine.pt2e.legacy_state import LEGACY_KEY
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from tests.fixtures.make_premove_models import float_model

FIXTURE = pathlib.Path(__file__).parents[1] / "fixtures" / "premove_models.pt"


@pytest.fixture(scope="module")
def saved():
    return torch.load(FIXTURE, weights_only=False)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("qviz.engine.tensor_quant", "qviz.engine.tensor.tensor_quant"),
        ("qviz.engine.quant_nn", "qviz.engine.tensor.quant_nn"),
        ("qviz.engine.quant_nn.conv", "qviz.engine.tensor.quant_nn.conv"),
        ("qviz.engine.quant_modules", "qviz.engine.tensor.quant_modules"),
        ("qviz.engine.calib", "qviz.engine.tensor.calib"),
        ("qviz.engine.calib.max_calibrator", "qviz.engine.tensor.calib.max_calibrator"),
        ("qviz.engine.tensor_quantizer", "qviz.engine.tensor.tensor_quantizer"),
        ("qviz.engine.fake_quantize", "qviz.engine.observers.fake_quantize"),
        ("qviz.engine.fine_tune", "qviz.engine.tensor.fine_tune"),
    ],
)
def test_an_old_path_is_the_same_module_as_its_new_home(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_the_seed_tutorials_imports_work():
    from qviz.engine import calib, quant_modules, quant_nn
    from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
    from qviz.engine.tensor_quant import QuantDescriptor, fake_tensor_quant, tensor_quant

    assert quant_nn.TensorQuantizer is TensorQuantizer
    assert callable(quant_modules.initialize) and callable(quant_modules.deactivate)
    assert calib.MaxCalibrator.__module__ == "qviz.engine.tensor.calib.max_calibrator"
    q, _ = tensor_quant(torch.tensor([0.5, -1.0]), torch.tensor(1.0))
    assert q.tolist() == [64.0, -127.0]
    assert fake_tensor_quant(torch.tensor([1.0]), 1.0).item() == 1.0
    assert QuantDescriptor(num_bits=4).num_bits == 4


def test_fine_tune_imports_from_its_old_path():
    from qviz.engine.fine_tune import FineTuneHistory, fine_tune

    from qviz.engine.tensor import fine_tune as new

    assert fine_tune is new.fine_tune and FineTuneHistory is new.FineTuneHistory


def test_a_quant_nn_model_saved_before_the_move_loads_and_computes_the_same(saved):
    from qviz.engine.tensor import quant_nn

    model = saved["quant_nn_model"]
    assert isinstance(model[0], quant_nn.QuantConv2d)
    assert isinstance(model[3], quant_nn.QuantLinear)
    assert torch.equal(model(saved["x"]), saved["quant_nn_out"])


def test_an_observer_and_a_fake_quantizer_saved_before_the_move_load(saved):
    from qviz.engine.observers.fake_quantize import FusedMovingAvgObsFakeQuantize

    scale, zero_point = saved["observer"].calculate_qparams()
    assert torch.equal(scale, saved["observer_qparams"][0])
    assert torch.equal(zero_point, saved["observer_qparams"][1])
    fake_quant = saved["fake_quant"]
    assert isinstance(fake_quant, FusedMovingAvgObsFakeQuantize)
    fake_quant.disable_observer()
    assert torch.equal(fake_quant(saved["x"]), saved["fake_quant_out"])


def test_prepared_and_qat_state_dicts_saved_before_the_move_load(saved):
    x = saved["x"]
    prepared = qviz.prepare_pt2e(
        qviz.export(float_model().eval(), (x,)),
        XNNPACKQuantizer().set_global(get_symmetric_quantization_config()),
    )
    prepared.load_state_dict(saved["prepared_state"])
    names = prepared.meta.get(LEGACY_KEY)
    for key, value in prepared.state_dict().items():
        old = names.old_key(key) if names is not None else None
        assert torch.equal(value, saved["prepared_state"][old or key]), key
    # the observers pass their inputs through: the float forward, whose last bits depend on the
    # CPU's kernels (the fixture was written on another machine), so equal within float rounding
    torch.testing.assert_close(prepared(x), saved["prepared_out"])
    assert qviz.convert_pt2e(prepared)(x).shape == saved["prepared_out"].shape

    qat = qviz.prepare_qat_pt2e(
        qviz.export(float_model().train(), (x,)),
        XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_qat=True)),
    )
    qat.load_state_dict(saved["qat_state"])  # strict, through the old names
    names = qat.meta[LEGACY_KEY]  # each key of the model has the value saved under its old name
    for key, value in qat.state_dict().items():
        assert torch.equal(value, saved["qat_state"][names.old_key(key) or key]), key
    converted = qviz.convert_pt2e(qviz.move_exported_model_to_eval(qat))
    assert converted(x).shape == saved["qat_out"].shape


def test_a_current_checkpoint_loads_as_it_is(saved):
    """The old-name pre-hook leaves today's keys alone: a calibrated model's own state_dict
    loads into a fresh prepared model, which then computes the same."""
    x = saved["x"]
    gm = qviz.export(float_model().eval(), (x,))
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = qviz.prepare_pt2e(gm, quantizer)
    qviz.calibrate(prepared, x * 3, progress=False)
    fresh = qviz.prepare_pt2e(gm, quantizer)
    fresh.load_state_dict(prepared.state_dict())
    assert torch.equal(qviz.convert_pt2e(fresh)(x), qviz.convert_pt2e(prepared)(x))
