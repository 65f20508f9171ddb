"""The variant pipeline: a variant edits the quantized model and is scored on cached float outputs.

:mod:`~qviz.numeric.variants.variants` builds and scores the variants;
:mod:`~qviz.numeric.variants.sensitivity` runs :func:`sensitivity` (what quantizing each operator
costs), :func:`fallback` (keep the culprits in float) and :func:`compare_configs` on it.

Example:
    >>> from qviz.numeric.variants import compare_configs, fallback, sensitivity
    >>> all(callable(f) for f in (compare_configs, fallback, sensitivity))
    True
"""

from qviz.numeric.variants.sensitivity import compare_configs, fallback, sensitivity

__all__ = ["compare_configs", "fallback", "sensitivity"]
