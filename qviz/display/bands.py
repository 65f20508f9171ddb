"""Fixed colour bands: the one place that says which colour an SQNR or a clipped share gets.

They live in :mod:`qviz.display` so that the numeric suite's own tables (the notebook view of
:class:`~qviz.numeric.NumericReport`) and every view of :mod:`qviz.viz` and :mod:`qviz.widgets`
colour with the same bands.

A colour that depends on the model's own worst and best layer means nothing across models: a
healthy 37 dB layer turns red when every other layer is at 45 dB. These bands are fixed, so a
colour means the same everywhere qviz draws it: the HTML report's graph and tables
(:func:`qviz.viz.report`), ``qviz.viz.graph(..., metric_bands=SQNR)``, and the Model Explorer
node data (:func:`qviz.viz.to_model_explorer`), and the numeric suite's notebook tables.

A value takes the colour of the first band whose upper bound it does not exceed (Model
Explorer's thresholds work the same way), so a value on a boundary belongs to the lower band:
10 dB is red, 10.1 dB orange. ``-inf`` takes the first band, ``inf`` the last.

Example:
    >>> SQNR.colour(36.9) == SQNR.colour(39.0) != SQNR.colour(-1.3) == SQNR.colour(10.0)
    True
    >>> [label for _, label in SQNR.legend()]
    ['≤ 10 dB', '10–20 dB', '20–30 dB', '30–40 dB', '> 40 dB']
    >>> bands_for("cumulative_sqnr") is SQNR, bands_for("clipped") is CLIPPED, bands_for("scale")
    (True, True, None)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from qviz.errors import ConfigError

#: ColorBrewer RdYlGn, light enough for black text; ``qviz.viz.graph.dot.HEAT``, the gradient, runs
#: from the same red through the same yellow to the same green.
RED, ORANGE, YELLOW, LIGHT_GREEN, GREEN = "#f46d43", "#fdae61", "#fee08b", "#d9ef8b", "#66bd63"


@dataclass(frozen=True)
class Bands:
    """Fixed colour bands of one quantity: ``edges`` are ``(upper bound, colour)`` pairs in
    ascending order; a value takes the colour of the first bound it does not exceed, and a value
    above the last bound the last colour.

    Attributes:
        name: what the bands colour, for legends (``"SQNR"``).
        edges: ``((upper, colour), ...)``, bounds strictly ascending; ``inf`` closes the top.
        unit: the unit the legend writes after the (scaled) bounds (``"dB"``, ``"%"``).
        scale: the legend shows ``bound * scale`` (100 for a share written in percent).

    Example:
        >>> steps = Bands("steps", ((0.0, GREEN), (math.inf, RED)))
        >>> steps.colour(0.0), steps.colour(3.0), steps.legend()[1]
        ('#66bd63', '#f46d43', ('#f46d43', '> 0'))
    """

    name: str
    edges: tuple[tuple[float, str], ...]
    unit: str = ""
    scale: float = 1.0

    def __post_init__(self) -> None:
        uppers = [float(u) for u, _ in self.edges]
        if not uppers or any(a >= b for a, b in pairwise(uppers)):
            raise ConfigError(
                f"Bands({self.name!r}): edges must be (upper, colour) pairs with strictly "
                f"ascending bounds, got {self.edges!r}"
            )

    def colour(self, value: float) -> str | None:
        """The fill colour of ``value``; None for NaN (no value, no colour)."""
        value = float(value)
        if math.isnan(value):
            return None
        return next((c for upper, c in self.edges if value <= upper), self.edges[-1][1])

    def legend(self) -> tuple[tuple[str, str], ...]:
        """``(colour, label)`` per band, low to high: ``≤ 10 dB``, ``10–20 dB``, ``> 40 dB``."""
        return tuple((colour, self._label(i)) for i, (_, colour) in enumerate(self.edges))

    def _label(self, i: int) -> str:
        unit = f" {self.unit}" if self.unit else ""
        upper = self.edges[i][0]
        high = f"{upper * self.scale:g}"
        if i == 0:
            return f"{high}{unit}" if upper == 0 else f"≤ {high}{unit}"
        low = f"{self.edges[i - 1][0] * self.scale:g}"
        return f"> {low}{unit}" if math.isinf(upper) else f"{low}–{high}{unit}"


#: Signal-to-quantization-noise ratio in dB, higher is better: below 10 dB a layer's output is
#: mostly error; a healthy int8 layer sits around 40 dB.
SQNR = Bands(
    "SQNR",
    ((10.0, RED), (20.0, ORANGE), (30.0, YELLOW), (40.0, LIGHT_GREEN), (math.inf, GREEN)),
    unit="dB",
)
#: The share of values a range clips (0 to 1), lower is better; the legend writes percent.
CLIPPED = Bands(
    "clipped",
    ((0.0, GREEN), (1e-4, LIGHT_GREEN), (1e-3, YELLOW), (1e-2, ORANGE), (1.0, RED)),
    unit="%",
    scale=100.0,
)


def bands_for(column: str) -> Bands | None:
    """The fixed bands of a table column: :data:`SQNR` for any column whose name contains
    ``sqnr`` (``local_sqnr``, ``weight_sqnr``, ``SQNR dB``), :data:`CLIPPED` for ``clipped``;
    None for every other column (it has no fixed scale).

    Example:
        >>> bands_for("local_worst_channel_sqnr").name, bands_for("clip_error_share")
        ('SQNR', None)
    """
    name = str(column).lower()
    if "sqnr" in name:
        return SQNR
    return CLIPPED if name == "clipped" else None
