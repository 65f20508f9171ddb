"""The embedded default: a small CNN trained on scikit-learn's handwritten digits.

Everything loads offline in one call: the data ships with scikit-learn, the trained weights with
qviz.

Example:
    >>> from qviz.data import digits_model, digits_loaders
    >>> model = digits_model()                      # trained, in eval mode
    >>> loaders = digits_loaders(batch_size=64)     # train / calibration / test DataLoaders
    >>> images, labels = next(iter(loaders.calibration))
    >>> model(images).shape
    torch.Size([64, 10])
"""

from qviz.data.checkpoint import digits_metadata, digits_model, save_digits_checkpoint
from qviz.data.digits import DigitsLoaders, digits_loaders, digits_tensors
from qviz.data.model import DigitsNet
from qviz.data.train import evaluate, train_digits_model

__all__ = [
    "DigitsLoaders",
    "DigitsNet",
    "digits_loaders",
    "digits_metadata",
    "digits_model",
    "digits_tensors",
    "evaluate",
    "save_digits_checkpoint",
    "train_digits_model",
]
