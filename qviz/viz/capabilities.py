"""A quantizer's capabilities as a table: which patterns, which dtypes, how observed.

Example:
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> table = capabilities(XNNPACKQuantizer().set_global(get_symmetric_quantization_config()))
    >>> list(table.columns)[:3], table.loc[table.pattern == "conv", "weight"].item()
    (['quantizer', 'setting', 'pattern'], 'int8 [-127, 127] per_tensor_symmetric')
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from qviz.errors import ConfigError, MissingDependencyError

_COLUMNS = [
    "quantizer", "setting", "pattern", "observation", "input", "output", "weight", "bias",
    "dynamic",
]  # fmt: skip


def capabilities(quantizer: Any) -> Any:
    """``quantizer.quantization_capabilities()`` as a pandas DataFrame (renders in a notebook).

    Args:
        quantizer: an XNNPACKQuantizer, a BackendConfigQuantizer, a ComposableQuantizer of them,
            or any quantizer with ``quantization_capabilities()``.

    Raises:
        ConfigError: the quantizer does not declare its capabilities.
        MissingDependencyError: pandas is not installed.
    """
    declare = getattr(quantizer, "quantization_capabilities", None)
    if not callable(declare):
        raise ConfigError(
            f"{type(quantizer).__name__} does not declare quantization_capabilities(); "
            f"XNNPACKQuantizer, BackendConfigQuantizer and ComposableQuantizer do"
        )
    try:
        import pandas as pd
    except ImportError as error:
        raise MissingDependencyError("capabilities() needs pandas: pip install pandas") from error
    return pd.DataFrame([asdict(row) for row in declare()], columns=_COLUMNS)
