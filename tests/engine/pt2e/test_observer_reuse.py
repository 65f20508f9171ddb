"""ObserverReuse: sensitivity calibrates once, and its figures are bit for bit those of
calibrating every variant (the copies are what calibration would give)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.pt2e.observer_reuse import Filling, ObserverReuse
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.numeric import fallback, sensitivity


def _accuracy(float_out, quant_out, target):
    return float((quant_out.argmax(1) == target).float().mean())


@pytest.fixture(scope="module")
def digits():
    loaders = digits_loaders(batch_size=64)
    calib, test = list(loaders.calibration), list(loaders.test)[:2]
    gm = qviz.export(digits_model().eval(), (calib[0][0],), dynamic_batch=True)
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)
    )
    return gm, quantizer, calib, test


@pytest.mark.parametrize("mode", ["fallback", "solo"])
def test_sensitivity_is_bitwise_what_calibrating_every_variant_gives(digits, mode, monkeypatch):
    """Copies where every observer has a twin, a pass seen only by the others where some have
    none: the same frame as a full calibration pass for every variant."""
    gm, quantizer, calib, test = digits
    fillings = []
    original = ObserverReuse.fill_known

    def counted(self, variant):
        fillings.append(original(self, variant))
        return fillings[-1]

    monkeypatch.setattr(ObserverReuse, "fill_known", counted)
    once = sensitivity(gm, quantizer, test, metric=_accuracy, mode=mode,
                       calibration_data=calib, progress=False)  # fmt: skip
    whole = sum(not f.left for f in fillings)
    assert whole >= len(fillings) // 2 > 0  # most variants took copies only
    if mode == "fallback":  # a pool that shared its input's observer observes alone: only it
        assert any(f.copied and f.left for f in fillings)  # and its kin see the data

    def nothing_known(self, variant):
        return Filling(copied=(), left=tuple(variant.plan.observer_names()))

    monkeypatch.setattr(ObserverReuse, "fill_known", nothing_known)
    every = sensitivity(gm, quantizer, test, metric=_accuracy, mode=mode,
                        calibration_data=calib, progress=False)  # fmt: skip
    pd.testing.assert_frame_equal(once, every, check_exact=True)
    assert once.attrs == every.attrs


def test_copies_are_the_calibrated_state_and_a_changed_group_is_refused(digits):
    gm, quantizer, calib, _ = digits
    full = qviz.prepare_pt2e(gm, quantizer)
    reuse = ObserverReuse(full)
    qviz.calibrate(full, calib, progress=False)
    variant = qviz.prepare_pt2e(gm, fallback(quantizer, "conv2d_1"))
    assert reuse.fill(variant)
    calibrated = qviz.calibrate(qviz.prepare_pt2e(gm, fallback(quantizer, "conv2d_1")), calib,
                                progress=False)  # fmt: skip
    a, b = qviz.convert_pt2e(variant).state_dict(), qviz.convert_pt2e(calibrated).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # relu_2 in float: the max-pool after it no longer shares its observer, so observes alone
    changed = qviz.prepare_pt2e(gm, fallback(quantizer, "relu_2"))
    before = {k: v.clone() for k, v in changed.state_dict().items()}
    assert not reuse.fill(changed)
    after = changed.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_an_observer_built_otherwise_is_not_a_copy():
    """Same tensors, another observer configuration (8 against 4-bit weights): no copy."""
    gm = qviz.export(nn.Sequential(nn.Linear(4, 4)).eval(), (torch.randn(8, 4),))
    eight = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    four = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(weight_qmin=-8, weight_qmax=7)
    )
    full = qviz.prepare_pt2e(gm, eight)
    reuse = ObserverReuse(full)
    qviz.calibrate(full, [torch.randn(8, 4)], progress=False)
    assert reuse.fill(qviz.prepare_pt2e(gm, eight))
    assert not reuse.fill(qviz.prepare_pt2e(gm, four))
