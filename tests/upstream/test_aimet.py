"""AIMET (the reference of qviz's equalization and AdaRound), watched for what it lacks.

AIMET 2.x dropped aimet_torch's ``bias_correction`` (its v1 API), so
:func:`qviz.engine.repair.bias_correction` has no side-by-side with AIMET
(tests/engine/repair/test_bias_correction.py checks it against known answers and the float
model instead). When the module comes back, the test below fails: then write that side-by-side.
"""

import importlib

import pytest


def test_aimet_2_42_has_no_bias_correction():
    """The side-by-side the issue asked for cannot run: AIMET 2.x dropped aimet_torch's
    bias_correction (v1 API); when it comes back, this test says so."""
    pytest.importorskip("aimet_torch")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("aimet_torch.bias_correction")
