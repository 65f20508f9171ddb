"""Deterministic training and evaluation of the embedded digits model.

Training fixes every source of randomness (seeded initialisation and shuffling, one thread,
deterministic algorithms), so what re-training reproduces is:

* on the build that trained the checkpoint (the PyTorch release, CPU instruction set and CPU
  model recorded in ``data/digits_cnn.json``, see :func:`~qviz.data.checkpoint.build_fingerprint`):
  the same bits, and the same sha256 when saved;
* on any other supported PyTorch and CPU: an equivalent model. Kernels that round one float
  differently make 30 epochs end with parameters a few per cent apart (7 % in norm, logits
  25 dB apart, between two CPUs), while the float test accuracy stays within one test image,
  predictions differ on at most 3 of the 360 test images, and the int8 accuracy
  (:func:`~qviz.data.int8.int8_accuracy`) stays within one image of the recorded one.
  ``tests/data/test_digits.py`` checks both.

Example:
    >>> from qviz.data import digits_model, digits_loaders
    >>> acc = evaluate(digits_model(), digits_loaders().test)
    >>> acc > 0.95
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from qviz.data.digits import digits_loaders
from qviz.data.model import DigitsNet
from qviz.engine.graph.inputs import call_model, labelled_batches
from qviz.engine.graph.stage import Stage, check_stage


class TrainConfig:
    """The recipe of the committed checkpoint (plain values, recorded in its metadata)."""

    seed = 0
    epochs = 30
    batch_size = 64
    lr = 3e-3
    weight_decay = 1e-4

    @classmethod
    def as_dict(cls) -> dict:
        return {k: getattr(cls, k) for k in ("seed", "epochs", "batch_size", "lr", "weight_decay")}


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)


@torch.no_grad()
def evaluate(model: nn.Module, loader: Any) -> float:
    """Top-1 accuracy of ``model`` over ``(images, labels)`` batches, in eval mode.

    The model's train/eval mode is restored afterwards. Graphs from ``torch.export`` (exported,
    converted or loaded back) keep the mode they were captured in and refuse ``.eval()``; they
    are evaluated as they are.

    Args:
        model: a float, converted or quant_nn model. Never a prepared one (checked first): its
            observers would take in the test data; convert it first.
        loader: a DataLoader or any batches with labels, as for :func:`qviz.calibrate`
            (``(inputs, labels)`` tuples, dicts with ``labels``).

    Raises:
        ConfigError: a prepared model; a batch without labels or that does not fit the
            exported graph (dtype, shape), named.
    """
    stages = (Stage.FLOAT, Stage.CONVERTED, Stage.QUANT_NN)
    check_stage(model, stages, where="evaluate")
    was_training = model.training
    switched = _set_mode(model, training=False)
    correct = total = 0
    try:
        for where, bound in labelled_batches(model, loader, "evaluate: batch {index}"):
            labels = bound.target
            correct += int((call_model(model, bound, where).argmax(1) == labels).sum())
            total += labels.numel()
    finally:
        if switched:
            model.train(was_training)
    return correct / total


def _set_mode(model: nn.Module, *, training: bool) -> bool:
    try:
        model.train(training)
    except NotImplementedError:  # torch.export's modules: the mode is fixed at capture
        return False
    return True


def train_digits_model(*, progress: bool = False) -> tuple[DigitsNet, float]:
    """Train DigitsNet with :class:`TrainConfig`; return it (eval mode) and its test accuracy.

    Takes about 10 seconds on one CPU thread and gives the same weights every time on one
    build; see the module docstring for what holds across builds.
    """
    from tqdm.auto import tqdm

    cfg = TrainConfig
    with _deterministic():
        torch.manual_seed(cfg.seed)
        model = DigitsNet()
        loaders = digits_loaders(cfg.batch_size, seed=cfg.seed)
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
        loss_fn = nn.CrossEntropyLoss()
        for _ in tqdm(range(cfg.epochs), desc="training DigitsNet", disable=not progress):
            model.train()
            for images, labels in loaders.train:
                opt.zero_grad()
                loss_fn(model(images), labels).backward()
                opt.step()
            sched.step()
        model.eval()
        return model, evaluate(model, loaders.test)
