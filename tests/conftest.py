"""Shared test set-up: keep Jupyter, IPython and matplotlib out of $HOME; seed torch."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch

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


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
