"""Time BackendConfig quantization on qviz's PT2E engine against torch.ao's FX mode.

Run from the repository root (about a minute)::

    .venv/bin/python benchmarks/backend_config.py [resnet18 mobilenet_v2]

For each torchvision model (random weights, fixed seed), torch.ao's x86 BackendConfig and its
default QConfigMapping, 2 threads: the time of ``qviz.prepare_pt2e`` with a
BackendConfigQuantizer (on the exported graph; export timed apart) and of ``prepare_fx``, the
median of ``REPEATS`` alternating runs (``QVIZ_BENCH_REPEATS``, default 3), and the ratio.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
import warnings
from functools import partial
from statistics import median

import torch
import torchvision
from _machine import set_threads, timed
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import prepare_fx

import qviz
from qviz.engine.backend_config import BackendConfigQuantizer

importlib.import_module("torch.ao.quantization.backend_config.utils")  # torch.ao needs it
x86 = importlib.import_module("torch.ao.quantization.backend_config.x86")

REPEATS = int(os.environ.get("QVIZ_BENCH_REPEATS", "3"))


def bench(name: str) -> None:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    example = (torch.randn(8, 3, 224, 224),)
    mapping, backend = get_default_qconfig_mapping("x86"), x86.get_x86_backend_config()
    export_s = timed(lambda: qviz.export(model, example))[1]
    exported = qviz.export(model, example)
    quantizer = BackendConfigQuantizer(backend, mapping)
    ours, theirs = [], []
    for _ in range(REPEATS):
        ours.append(timed(lambda: qviz.prepare_pt2e(exported, quantizer))[1])
        fresh = copy.deepcopy(model)  # prepare_fx may change the module it gets: not timed
        run_fx = partial(prepare_fx, fresh, mapping, example, backend_config=backend)
        theirs.append(timed(run_fx)[1])
    print(
        f"{name:13s} export {export_s:6.2f}s   prepare: qviz {median(ours):6.2f}s   "
        f"prepare_fx {median(theirs):6.2f}s   ratio {median(ours) / median(theirs):5.2f}x"
    )


if __name__ == "__main__":
    set_threads(2)
    warnings.simplefilter("ignore")
    for model_name in sys.argv[1:] or ["resnet18", "mobilenet_v2"]:
        bench(model_name)
