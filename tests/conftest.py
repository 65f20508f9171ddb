"""Shared test set-up: keep Jupyter, IPython and matplotlib out of $HOME; seed torch."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from torch import nn

_SCRATCH = tempfile.mkdtemp(prefix="qviz-tests-")
for var, sub in {
    "IPYTHONDIR": "ipython",
    "MPLCONFIGDIR": "matplotlib",
    "JUPYTER_CONFIG_DIR": "jupyter-config",
    "JUPYTER_DATA_DIR": "jupyter-data",
    "JUPYTER_RUNTIME_DIR": "jupyter-runtime",
}.items():
    os.environ.setdefault(var, os.path.join(_SCRATCH, sub))
os.environ.setdefault("MPLBACKEND", "Agg")


#: Test files that take minutes on one worker, longest first. ``make test`` spreads whole files
#: over two workers (``--dist loadfile --no-loadscope-reorder``) in collection order, so a long
#: file collected last (the JupyterLab notebook runs: 7 min on an AVX2 EPYC) ran alone at the
#: end; collected first, the short files fill the other worker meanwhile.
LONGEST_FIRST = (
    "tests/widgets/e2e/test_notebooks_e2e.py",
    "tests/test_notebooks.py",
    "tests/test_docs.py",
    "tests/engine/lower/test_lowered_checks.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collect :data:`LONGEST_FIRST`'s files first; every file's own order is kept."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def _oracle_patterns_traced_once():
    """torchao (the test oracle) traces each of its pattern graphs once per process
    (:mod:`tests.helpers.oracle_patterns`): its results are unchanged, its time is not."""
    from tests.helpers.oracle_patterns import install

    with pytest.MonkeyPatch.context() as patch:
        install(patch)
        yield


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


class ThreeConvs(nn.Module):
    """Three conv-relu layers and a linear head: the numeric suite's deliberately broken model."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = torch.relu(self.conv3(x))
        return self.fc(x.mean((2, 3)))


def _broken_model() -> nn.Module:
    torch.manual_seed(0)  # the caller draws its data next, from this seed's stream
    model = ThreeConvs().eval()
    with torch.no_grad():
        # channel 0 of conv1 is dead after its relu, so the outlier never changes a float output:
        # the float model is fine, only the quantized weight grid of conv2 is ruined
        model.conv1.bias[0] = -100.0
        model.conv2.weight[0, 0, 1, 1] = 200 * model.conv2.weight.abs().max()
    return model


@pytest.fixture(scope="session")
def make_broken_model():
    """``make_broken_model()``: a float model whose conv2 has one huge weight on a dead input
    channel, so per-tensor weight quantization ruins conv2 alone (seeds torch with 0)."""
    return _broken_model


def _calibrated_digits(switchable: bool = True):
    import qviz
    from qviz.data import digits_loaders, digits_model
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    calib = [x for x, _ in digits_loaders(batch_size=90).calibration]
    gm = qviz.export(digits_model(), (calib[0],), dynamic_batch=True)
    config = get_symmetric_quantization_config(is_per_channel=True, switchable=switchable)
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    return qviz.calibrate(prepared, calib, progress=False)


@pytest.fixture(scope="session")
def calibrated_digits():
    """``calibrated_digits(switchable=True)``: a fresh digits model, prepared for XNNPACK
    (per-channel weights) and calibrated on the calibration split."""
    return _calibrated_digits


def _calibrated_quant_nn_digits(disabled: str | None = None):
    import qviz
    from qviz.data import digits_loaders, digits_model
    from qviz.engine.tensor.quant_modules import quantize_model

    model = quantize_model(digits_model())
    data = digits_loaders(64).calibration
    qviz.calibrate_quantizers(model, data, "entropy", max_batches=4, progress=False)
    if disabled is not None:
        model.get_submodule(disabled).disable()
    return model


@pytest.fixture(scope="session")
def calibrated_quant_nn_digits():
    """``calibrated_quant_nn_digits(disabled=None)``: a fresh quant_nn twin of the digits model,
    inputs calibrated with entropy (4 batches), weights with max, the quantizer at module path
    ``disabled`` turned off."""
    return _calibrated_quant_nn_digits
