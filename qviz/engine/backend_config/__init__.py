"""BackendConfig on the PT2E engine: a backend declared as data, and the user's QConfigs.

The vocabulary of PyTorch's BackendConfig tutorial, setter for setter:
:class:`BackendConfig`, :class:`BackendPatternConfig`, :class:`DTypeConfig`,
:class:`DTypeWithConstraints`, :class:`ObservationType`, :class:`QConfig`,
:class:`QConfigMapping`, :func:`get_default_qconfig_mapping`; and
:class:`BackendConfigQuantizer`, which applies them to an exported graph for ``prepare_pt2e``
and records a reason for every quantizable node it leaves in float. torch.ao's objects of these
types (and its shipped backend configs) are accepted as they are.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from qviz.engine.backend_config import (BackendConfig, BackendPatternConfig,
    ...     DTypeConfig, ObservationType)
    >>> conv_relu = (BackendPatternConfig((nn.Conv2d, nn.ReLU))
    ...     .set_observation_type(ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
    ...     .add_dtype_config(DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float)))
    >>> BackendConfig("my_backend").set_backend_pattern_config(conv_relu)
    BackendConfig('my_backend', 1 patterns)
"""

from qviz.engine.backend_config.config import BackendConfig, BackendPatternConfig, pattern_name
from qviz.engine.backend_config.dtypes import DTypeConfig, DTypeWithConstraints, ObservationType
from qviz.engine.backend_config.qconfig import QConfig, QConfigMapping, get_default_qconfig_mapping
from qviz.engine.backend_config.quantizer import BackendConfigQuantizer

__all__ = [
    "BackendConfig",
    "BackendConfigQuantizer",
    "BackendPatternConfig",
    "DTypeConfig",
    "DTypeWithConstraints",
    "ObservationType",
    "QConfig",
    "QConfigMapping",
    "get_default_qconfig_mapping",
    "pattern_name",
]
