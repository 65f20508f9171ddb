"""A fast SVG drawing of :class:`~qviz.viz.ranges.histograms.HistogramData`, for widgets.

:func:`qviz.viz.histogram` draws with matplotlib (about 0.5 s with its table); a widget that
redraws on every slider move needs a few milliseconds. This renderer writes the same data (the
same bins, the same method lines) straight into SVG text: the observed counts as one path, a
dashed line per method, a dotted one for the observer's own range, axis ticks, and a legend in
a band above the plot, never over the counts.

Example:
    >>> import torch
    >>> from qviz.viz.ranges.histograms import histogram_data
    >>> svg = histogram_svg(histogram_data(torch.randn(10_000), methods=("max", "mse")))
    >>> svg.startswith("<svg") and 'data-gid="method:mse"' in svg
    True
"""

from __future__ import annotations

import html
import math
from typing import Any

from qviz.viz.ranges.histograms import _COLORS, HistogramData, _display_bins, clipped_text

_PAD_L, _PAD_R, _PAD_T, _PAD_B = 56, 12, 26, 36
#: The drawing's text sizes (SVG user units: pixels when the drawing is shown at its own size).
FONT_SIZE, TITLE_SIZE = 11, 12
#: How much wider than drawn a fluid drawing (``min_text_px`` given) may grow.
MAX_GROWTH = 1.25


def _ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    step = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 5, 10):
        if raw <= mult * step:
            step *= mult
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.3g}" if v else "0"


def histogram_svg(
    data: HistogramData,
    *,
    log: bool = False,
    width: int = 640,
    height: int = 260,
    highlight: str | None = None,
    min_text_px: float | None = None,
) -> str:
    """SVG text of ``data``: counts, method lines (``highlight`` drawn thicker), ticks, legend.

    Args:
        data: from :func:`qviz.viz.ranges.histograms.histogram_data`.
        log: logarithmic count axis.
        width, height: pixels.
        highlight: a method name whose line is drawn thicker (the one being chosen).
        min_text_px: make the drawing fluid: it takes its container's width, but never less
            than where its smallest text (:data:`FONT_SIZE`) would drop under ``min_text_px``
            pixels, nor more than :data:`MAX_GROWTH` times ``width`` (None: fixed size).

    Raises:
        ConfigError: ``width``, ``height`` or ``min_text_px`` is not positive.

    Example:
        >>> import torch
        >>> from qviz.viz.ranges.histograms import histogram_data
        >>> data = histogram_data(torch.randn(1000), methods=("max",))
        >>> svg = histogram_svg(data, width=480, min_text_px=10)
        >>> svg[svg.index("style="):].split('"')[1]
        'width:100%;min-width:437px;max-width:600px;height:auto'
    """
    _check_size(width, height, min_text_px)
    counts, edges = _display_bins(data.counts, data.edges)
    x_lo, x_hi = _x_range(counts, edges, data)
    legend = _legend_layout(data, width)
    top = legend[-1][2] + _LEGEND_ROW + 6 if legend else _PAD_T  # the plot starts under it
    plot_w, plot_h = width - _PAD_L - _PAD_R, height - top - _PAD_B

    def sx(x: float) -> float:
        return _PAD_L + (x - x_lo) / (x_hi - x_lo) * plot_w

    sy = _y_scale(counts, log, plot_h, top)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" '
        f'font-size="{FONT_SIZE}"{_fluid(width, min_text_px)}>',
        f'<text x="{_PAD_L}" y="15" font-size="{TITLE_SIZE}">{html.escape(data.title)}</text>',
        _bars(counts, edges, sx, sy, top + plot_h),
        _axes(x_lo, x_hi, sx, plot_w, plot_h, data.signed, top),
        _y_label(plot_h, log, top),
    ]
    parts += _lines(data, sx, plot_h, highlight, top, legend)
    parts.append("</svg>")
    return "".join(parts)


def _x_range(counts: Any, edges: Any, data: HistogramData) -> tuple[float, float]:
    """The x range drawn: the bins that hold values and every method's line, padded by 2 %."""
    nonzero = [i for i, c in enumerate(counts) if c > 0]
    first, last = (nonzero[0], nonzero[-1] + 1) if nonzero else (0, len(counts))
    xs = [float(edges[first]), float(edges[last]), *(x for _, x, _ in data.lines)]
    x_lo, x_hi = min(xs), max(xs)
    pad = 0.02 * ((x_hi - x_lo) or 1.0)
    return x_lo - pad, x_hi + pad


#: The legend band: the height of one row of entries, the width of a swatch and its gap, and
#: the width of a character (Helvetica's are at most about 0.6 em) to place entries by.
_LEGEND_ROW, _SWATCH, _CHAR_EM = FONT_SIZE + 4, 22, 0.6


def _legend_layout(data: HistogramData, width: int) -> list[tuple[str, float, float]]:
    """Where each labelled line's legend entry goes, ``(label, x, y)``: left to right in rows
    above the plot, a new row when an entry would pass the drawing's right edge."""
    placed: list[tuple[str, float, float]] = []
    x, y = float(_PAD_L), float(_PAD_T)
    for _, _, label in data.lines:
        if not label:
            continue
        w = _SWATCH + len(label) * FONT_SIZE * _CHAR_EM + 14
        if placed and x + w > width - _PAD_R:
            x, y = float(_PAD_L), y + _LEGEND_ROW
        placed.append((label, x, y))
        x += w
    return placed


def _y_scale(counts: Any, log: bool, plot_h: float, plot_top: float = _PAD_T) -> Any:
    """``count -> y`` in the plot: linear from 0, or logarithmic from half the smallest count."""
    top = max((float(c) for c in counts), default=1.0) or 1.0
    floor = min((float(c) for c in counts if c > 0), default=1.0) * 0.5

    def sy(c: float) -> float:
        if log:
            c = max(c, floor)
            t = (math.log10(c) - math.log10(floor)) / ((math.log10(top) - math.log10(floor)) or 1)
        else:
            t = c / top
        return plot_top + (1 - t) * plot_h

    return sy


def _check_size(width: int, height: int, min_text_px: float | None) -> None:
    from qviz.errors import ConfigError

    for name, value in (("width", width), ("height", height), ("min_text_px", min_text_px)):
        if value is not None and not value > 0:
            raise ConfigError(f"histogram_svg: {name} must be positive, got {value!r}")


def _fluid(width: int, min_text_px: float | None) -> str:
    """The root's style attribute of a fluid drawing ('' for a fixed one)."""
    if min_text_px is None:
        return ""
    narrowest = math.ceil(width * min_text_px / FONT_SIZE)
    widest = max(narrowest, round(width * MAX_GROWTH))
    return f' style="width:100%;min-width:{narrowest}px;max-width:{widest}px;height:auto"'


def _bars(counts: Any, edges: Any, sx: Any, sy: Any, base: float) -> str:
    points = [f"M{sx(float(edges[0])):.1f},{base:.1f}"]
    for c, left, right in zip(counts, edges[:-1], edges[1:], strict=True):
        y = sy(float(c)) if c > 0 else base
        points.append(f"L{sx(float(left)):.1f},{y:.1f}L{sx(float(right)):.1f},{y:.1f}")
    points.append(f"L{sx(float(edges[-1])):.1f},{base:.1f}Z")
    return f'<path d="{"".join(points)}" fill="#a6a6a6" stroke="none" data-gid="observed"/>'


def _axes(
    x_lo: float, x_hi: float, sx: Any, plot_w: float, plot_h: float, signed: bool, top: float
) -> str:
    base = top + plot_h
    out = [
        f'<rect x="{_PAD_L}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
        f'stroke="#555"/>'
    ]
    for t in _ticks(x_lo, x_hi):
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 4}" stroke="#555"/>')
        out.append(f'<text x="{x:.1f}" y="{base + 16}" text-anchor="middle">{_fmt(t)}</text>')
    label = "x" if signed else "|x|"
    out.append(
        f'<text x="{_PAD_L + plot_w / 2}" y="{base + 31}" text-anchor="middle">{label}</text>'
    )
    return "".join(out)


def _y_label(plot_h: float, log: bool, top: float) -> str:
    y = top + plot_h / 2
    text = "count (log)" if log else "count"
    return (
        f'<text x="{_PAD_L - 10}" y="{y:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 {_PAD_L - 10} {y:.1f})">{text}</text>'
    )


def _lines(
    data: HistogramData,
    sx: Any,
    plot_h: float,
    highlight: str | None,
    top: float,
    legend: list[tuple[str, float, float]],
) -> list[str]:
    out, entries = [], iter(legend)
    for gid, x, label in data.lines:
        method = gid.split(":", 1)[1]
        observer = gid.startswith("observer")
        colour = "#000000" if observer else _css_colour(_COLORS.get(method, "tab:gray"))
        dash = "2,3" if observer else "6,4"
        widest = 3.2 if method == highlight else 1.6
        px = sx(x)
        out.append(
            f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + plot_h}" '
            f'stroke="{colour}" stroke-width="{widest}" stroke-dasharray="{dash}" '
            f'data-gid="{html.escape(gid)}" data-x="{x:.6g}"/>'
        )
        if label:  # in the band above the plot: never over the counts
            _, left, y = next(entries)
            mid = y + FONT_SIZE * 0.62
            out.append(
                f'<line x1="{left:.1f}" y1="{mid:.1f}" x2="{left + 18:.1f}" y2="{mid:.1f}" '
                f'stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>'
                f'<text x="{left + _SWATCH:.1f}" y="{y + FONT_SIZE:.1f}" '
                f'data-legend="{html.escape(gid)}">{html.escape(label)}</text>'
            )
    return out


_TAB = {
    "tab:red": "#d62728",
    "tab:orange": "#ff7f0e",
    "tab:green": "#2ca02c",
    "tab:purple": "#9467bd",
    "tab:blue": "#1f77b4",
    "tab:gray": "#7f7f7f",
}


def _css_colour(name: str) -> str:
    return _TAB.get(name, name)


def rows_html(rows: Any, *, highlight: str | None = None, chosen: str | None = None) -> str:
    """The methods' table (range, scale, zero_point, clipped share, SQNR) as HTML.

    ``highlight`` marks the row being considered; ``chosen`` (a user's choice, e.g.
    ``"entropy"`` or ``"percentile 99.9"``) gets a star.

    Example:
        >>> import torch
        >>> from qviz.viz.ranges.histograms import histogram_data
        >>> "<td" in rows_html(histogram_data(torch.randn(1000), methods=("max",)).rows)
        True
    """
    cell = 'style="padding:2px 6px;border-bottom:1px solid #ddd;text-align:right"'
    head = "".join(
        f"<th {cell}>{h}</th>"
        for h in ("method", "range [low, high]", "scale", "zero_point", "clipped", "SQNR dB")
    )
    body = []
    for r in rows:
        style = ' style="background:#fff3c4;font-weight:bold"' if r["method"] == highlight else ""
        star = " ★" if chosen and chosen.split()[0] == r["method"] else ""
        own = " (observer's)" if r.get("current") else ""
        values = (
            f"{html.escape(r['method'])}{own}{star}",
            f"[{r['low']:.4g}, {r['high']:.4g}]",
            f"{r['scale']:.4g}",
            str(r["zero_point"]),
            clipped_text(r),
            f"{r['sqnr_db']:.2f}",
        )
        body.append(f"<tr{style}>" + "".join(f"<td {cell}>{v}</td>" for v in values) + "</tr>")
    return (
        '<table class="qviz-calib" style="border-collapse:collapse;font-size:12px">'
        f"<tr>{head}</tr>{''.join(body)}</table>"
    )
