"""Drawing primitives every view shares: the figure factory, narrow HTML tables, colour bands.

:mod:`~qviz.display.figure` makes the matplotlib Figure every qviz view returns (rendering itself
without pyplot), :mod:`~qviz.display.html_table` writes the narrow notebook tables and
:mod:`~qviz.display.bands` says which fixed colour an SQNR or a clipped share gets. The numeric
suite, :mod:`qviz.viz` and :mod:`qviz.widgets` all draw with them; this package imports only
:mod:`qviz.errors` (and matplotlib inside the function that needs it).

Example:
    >>> from qviz.display import SQNR, RED
    >>> SQNR.colour(5.0) == RED
    True
"""

from qviz.display.bands import (
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
from qviz.display.figure import new_figure
from qviz.display.html_table import Cell, Column, sig3, table

__all__ = [
    "CLIPPED",
    "GREEN",
    "LIGHT_GREEN",
    "ORANGE",
    "RED",
    "SQNR",
    "YELLOW",
    "Bands",
    "Cell",
    "Column",
    "bands_for",
    "new_figure",
    "sig3",
    "table",
]
