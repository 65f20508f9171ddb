"""Fixed colour bands of SQNR and clipped shares, as every view draws them.

The data lives in :mod:`qviz.numeric.bands` (the numeric suite's tables colour with it too, and
numeric may not import viz); this module keeps the views' import path.

Example:
    >>> from qviz.viz.bands import SQNR
    >>> SQNR.colour(5.0) == RED
    True
"""

from __future__ import annotations

from qviz.numeric.bands import (  # noqa: F401 (re-exported for the views)
    CLIPPED,
    GREEN,
    LIGHT_GREEN,
    ORANGE,
    RED,
    SQNR,
    YELLOW,
    Bands,
    bands_for,
)
