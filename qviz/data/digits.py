"""scikit-learn's handwritten digits (1,797 8x8 images, bundled with the package, no download).

The split is fixed: a legacy NumPy ``RandomState(0)`` permutation (its stream is frozen by NumPy's
compatibility policy), then 1,257 training, 180 calibration and 360 test images. Pixels (0..16)
are scaled to [-1, 1].

Example:
    >>> splits = digits_tensors()
    >>> {name: tuple(x.shape) for name, (x, y) in splits.items()}
    {'train': (1257, 1, 8, 8), 'calibration': (180, 1, 8, 8), 'test': (360, 1, 8, 8)}
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

SPLIT_SIZES = {"train": 1257, "calibration": 180, "test": 360}
SPLIT_SEED = 0


def digits_tensors() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The three fixed splits as ``{name: (images (N, 1, 8, 8) float32, labels (N,) int64)}``."""
    from sklearn.datasets import load_digits  # bundled data: no network

    digits = load_digits()
    images = torch.from_numpy(digits.images.astype(np.float32) / 8.0 - 1.0).unsqueeze(1)
    labels = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.from_numpy(np.random.RandomState(SPLIT_SEED).permutation(len(labels)))
    out, start = {}, 0
    for name, size in SPLIT_SIZES.items():
        idx = order[start : start + size]
        out[name] = (images[idx].contiguous(), labels[idx].contiguous())
        start += size
    return out


class DigitsLoaders(NamedTuple):
    """DataLoaders of the three splits; ``train`` shuffles with a seeded generator."""

    train: DataLoader
    calibration: DataLoader
    test: DataLoader


def digits_loaders(batch_size: int = 64, *, seed: int = 0) -> DigitsLoaders:
    """DataLoaders over the fixed splits, yielding ``(images, labels)`` batches.

    Example:
        >>> loaders = digits_loaders(batch_size=32)
        >>> images, labels = next(iter(loaders.calibration))
        >>> tuple(images.shape), labels.dtype
        ((32, 1, 8, 8), torch.int64)
    """
    splits = digits_tensors()
    gen = torch.Generator().manual_seed(seed)

    def loader(name: str, shuffle: bool) -> DataLoader:
        return DataLoader(
            TensorDataset(*splits[name]),
            batch_size=batch_size,
            shuffle=shuffle,
            generator=gen if shuffle else None,
        )

    return DigitsLoaders(loader("train", True), loader("calibration", False), loader("test", False))
