"""Where the trained digits checkpoint lives, and loading and saving it.

The checkpoint is ``data/digits_cnn.pt`` in the source tree (installed wheels carry it as
``qviz/_data``); ``data/digits_cnn.json`` records the float test accuracy and the recipe.
``QVIZ_DATA_DIR`` points elsewhere.

Example:
    >>> digits_metadata()["float_test_accuracy"] > 0.95
    True
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from qviz.data.model import DigitsNet
from qviz.errors import QvizError

CHECKPOINT_NAME = "digits_cnn"


def data_dir() -> Path:
    """The folder holding the checkpoint: $QVIZ_DATA_DIR, the wheel's copy, or the source tree's."""
    if os.environ.get("QVIZ_DATA_DIR"):
        return Path(os.environ["QVIZ_DATA_DIR"])
    packaged = Path(__file__).resolve().parents[1] / "_data"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "data"


def build_fingerprint() -> dict[str, str]:
    """What bitwise-identical training needs to match: the PyTorch release and the CPU.

    The same recipe on another PyTorch release, another CPU instruction set or another CPU
    model (whose vectorized and oneDNN kernels round differently) trains an equivalent model,
    not the same bits; the checkpoint's metadata records all three so a reproduction can tell
    which promise applies.

    Example:
        >>> sorted(build_fingerprint())
        ['cpu', 'cpu_capability', 'torch_version']
    """
    return {
        "torch_version": torch.__version__.split("+")[0],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": _cpu_model(),
    }


def _cpu_model() -> str:
    """The processor's model name (Linux's /proc/cpuinfo; elsewhere what ``platform`` knows)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _paths(folder: Path | None) -> tuple[Path, Path]:
    folder = Path(folder) if folder is not None else data_dir()
    return folder / f"{CHECKPOINT_NAME}.pt", folder / f"{CHECKPOINT_NAME}.json"


def digits_metadata(folder: Path | None = None) -> dict:
    """The recorded metadata: float test accuracy, training recipe, PyTorch version, sha256."""
    _, meta = _paths(folder)
    if not meta.is_file():
        raise QvizError(
            f"no digits checkpoint metadata at {meta}: run `qviz train-digits` to create it"
        )
    return json.loads(meta.read_text())


def digits_model(folder: Path | None = None) -> DigitsNet:
    """The trained DigitsNet, in eval mode. A fresh copy on every call.

    Example:
        >>> model = digits_model()
        >>> model.training
        False
    """
    weights, _ = _paths(folder)
    if not weights.is_file():
        raise QvizError(f"no digits checkpoint at {weights}: run `qviz train-digits` to create it")
    expected = digits_metadata(folder).get("sha256")
    blob = weights.read_bytes()
    if expected and hashlib.sha256(blob).hexdigest() != expected:
        raise QvizError(
            f"{weights} does not match the sha256 recorded in {CHECKPOINT_NAME}.json: the file is "
            f"damaged or was replaced; run `qviz train-digits` to re-create both"
        )
    model = DigitsNet()
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.eval()


def save_digits_checkpoint(model: DigitsNet, metadata: dict, folder: Path | None = None) -> Path:
    """Write the weights and metadata (with the weights' sha256); return the weights' path."""
    weights, meta = _paths(folder)
    weights.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    torch.save(state, weights)
    record = dict(metadata, sha256=hashlib.sha256(weights.read_bytes()).hexdigest())
    meta.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return weights
