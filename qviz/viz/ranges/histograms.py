"""``histogram``: what a calibrator or observer saw, and the range each calibration method picks.

One function, one code path, four kinds of input. Each input is first turned into a
``HistogramData``: the counts to draw, the vertical lines to draw and one row of numbers per method,
all read from the calibrator or observer itself (``compute_amax``, ``calculate_qparams``,
``histogram``); then one renderer draws any source.

=============================  ===========================================================
input                          what is drawn
=============================  ===========================================================
a tensor                       the |x| histogram of a fresh HistogramCalibrator fed it
HistogramCalibrator            its |x| histogram (``channel`` picks a per-channel one)
TensorQuantizer                its calibrator's
HistogramObserver              its calibrator's |x| histogram when it keeps one
                               (``switchable=True`` or a calibrator method), else its own
                               signed histogram over ``[min_val, max_val]`` with the only
                               method it can compute, ``"l2"``
=============================  ===========================================================

The table's SQNR is computed from the histogram itself (each bin's centre weighted by its count,
fake-quantized), so it needs no raw tensor; it matches the exact number within the error of the
bin width. A value counts as clipped when it lies beyond the rounding boundary of the grid's last
level (``qviz.engine.qparams.clip_limits``: clamping, not rounding, sets its error), the same
definition as everywhere in qviz. From counts alone the clipped share is known exactly only when
no limit falls inside a bin that holds values; otherwise the row holds the estimate (each bin's
count spread over its width) and the bounds the raw values must lie in
(``clipped_least`` / ``clipped_most``), and the table shows both, so that two close ranges never
seem to contradict each other.

Example:
    >>> import torch
    >>> from qviz.viz.ranges.histograms import histogram
    >>> x = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    >>> fig = histogram(x, methods=("max", "mse"))
    >>> [row["method"] for row in fig.qviz_rows]
    ['max', 'mse']
    >>> round(fig.qviz_rows[0]["amax"], 2), round(fig.qviz_rows[0]["sqnr_db"], 1)
    (4.34, 40.1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from qviz.engine.observers import HistogramObserver, OrderFreeHistogramObserver
from qviz.engine.qparams import bits_of_range, clip_limits, quant_range, symmetric_scale
from qviz.engine.tensor.calib import CalibMethod, HistogramCalibrator, MaxCalibrator
from qviz.engine.tensor.tensor_quant import fake_tensor_quant
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import CalibrationError, ConfigError
from qviz.numeric.measure.metrics import histogram_clipped_fraction

_DEFAULT_METHODS = ("max", "percentile", "entropy", "mse")
_DISPLAY_BINS = 256  # bins drawn (neighbours summed); the numbers use every bin
_MAX_GRID_LEVELS = 64  # draw the quantization grid only when at most this many levels show
#: The smallest text drawn, in points: 12.5 px in a notebook (100 dpi), 10 px in a widget that
#: shows figures at 80 px per inch; no text of a figure is smaller.
SMALLEST_FONT_PT = 9
_COLORS = {
    "max": "tab:red",
    "percentile": "tab:orange",
    "entropy": "tab:green",
    "mse": "tab:purple",
    "l2": "tab:blue",
}


@dataclass(frozen=True)
class QuantGrid:
    """The quantization levels ``scale * (q - zero_point)`` for q in quant_min..quant_max."""

    scale: float
    zero_point: int
    quant_min: int
    quant_max: int


@dataclass(frozen=True, kw_only=True)
class HistogramData:
    """Everything a histogram view draws, read from one calibrator or observer.

    ``lines`` are ``(gid, x, label)``: ``"method:<name>"`` at each method's amax and
    ``"observer:..."`` at the observer's own range; ``rows`` one dict per method (see
    :func:`histogram`); ``grid`` the quantization levels of the first row (or the observer's).
    """

    title: str
    counts: torch.Tensor  # float64
    edges: torch.Tensor  # float64, len(counts) + 1
    signed: bool  # False: a histogram of |x|
    lines: tuple[tuple[str, float, str], ...]  # (gid, x, legend label)
    rows: tuple[dict[str, Any], ...]
    grid: QuantGrid | None
    note: str = ""


def new_figure(**kwargs: Any) -> Any:
    """A matplotlib Figure not registered with pyplot (so nothing is shown behind one's back)
    that shows itself as a PNG in a notebook."""
    from qviz.display.figure import new_figure as figure

    return figure(**kwargs)


def histogram(
    observer_or_tensor: Any,
    *,
    methods: tuple[str, ...] | list[str] = _DEFAULT_METHODS,
    log: bool = False,
    num_bits: int | None = None,
    percentile: float | None = None,
    channel: int = 0,
) -> Any:
    """Draw the observed distribution, the range each calibration method picks, and their cost.

    Args:
        observer_or_tensor: a tensor, a HistogramCalibrator, a TensorQuantizer (its
            calibrator) or a HistogramObserver.
        methods: calibration methods to draw, from ``"max"``, ``"percentile"``, ``"entropy"``,
            ``"mse"``; an observer without an |x| histogram can only show its own ``"l2"``.
        log: logarithmic count axis (shows the sparse tail that clipping cuts off).
        num_bits: bit width; only for a tensor (default 8). Calibrators and observers pick their
            ranges for their own bit width, so any other value is a ConfigError.
        percentile: for ``"percentile"``; default the observer's own, else 99.99.
        channel: which histogram of a per-channel calibrator.

    Returns:
        A matplotlib Figure. ``fig.qviz_rows`` holds the table as dicts with ``method``,
        ``amax`` (the line drawn; None for ``"l2"``), ``low``, ``high``, ``scale``,
        ``zero_point``, ``clipped_fraction`` (with ``clipped_least`` / ``clipped_most``, the
        bounds the raw values' share lies in), ``sqnr_db`` and ``current`` (the observer's own
        method).

    Raises:
        ConfigError: an input without a histogram, an unknown method, or a ``num_bits`` that
            the calibrator was not created for.
        CalibrationError: the calibrator or observer saw no data.

    Example:
        >>> import torch
        >>> from qviz.engine.tensor.calib import HistogramCalibrator
        >>> calib = HistogramCalibrator(4)
        >>> calib.collect(torch.linspace(-1.0, 1.0, 2001))
        >>> fig = histogram(calib, methods=("max",), log=True)
        >>> fig.qviz_rows[0]["scale"], fig.qviz_rows[0]["clipped_fraction"]
        (0.14285714285714285, 0.0)
    """
    source = histogram_data(
        observer_or_tensor,
        methods=methods,
        num_bits=num_bits,
        percentile=percentile,
        channel=channel,
    )
    return _render(source, log=bool(log))


def histogram_data(
    observer_or_tensor: Any,
    *,
    methods: tuple[str, ...] | list[str] = _DEFAULT_METHODS,
    num_bits: int | None = None,
    percentile: float | None = None,
    channel: int = 0,
) -> HistogramData:
    """What :func:`histogram` draws, as data: counts, each method's range and its cost.

    The same arguments as :func:`histogram` (without ``log``); other renderers (the widgets'
    fast SVG) draw the same numbers.

    Example:
        >>> import torch
        >>> data = histogram_data(torch.linspace(-1, 1, 1001), methods=("max",))
        >>> data.rows[0]["method"], round(data.rows[0]["amax"], 3), data.signed
        ('max', 1.0, False)
    """
    wanted = _parse_methods(methods)
    if percentile is not None and not (
        isinstance(percentile, int | float) and not isinstance(percentile, bool)
    ):
        raise ConfigError(f"percentile must be a number in (0, 100], got {percentile!r}")
    return _source(observer_or_tensor, wanted, num_bits, percentile, channel)


def _parse_methods(methods: Any) -> tuple[str, ...]:
    if isinstance(methods, str):
        methods = (methods,)
    if not isinstance(methods, tuple | list) or not methods:
        raise ConfigError(
            f"methods must be a non-empty tuple of method names, e.g. {_DEFAULT_METHODS}, "
            f"got {methods!r}"
        )
    parsed = tuple("l2" if m == "l2" else CalibMethod.parse(m).value for m in methods)
    return tuple(dict.fromkeys(parsed))


def _source(
    obj: Any, methods: tuple[str, ...], num_bits: int | None, pct: float | None, channel: int
) -> HistogramData:
    """Dispatch on the input kind; every branch ends in the same ``HistogramData``."""
    if isinstance(obj, OrderFreeHistogramObserver):
        _check_bits(num_bits, bits_of_range(obj.quant_min, obj.quant_max), type(obj).__name__)
        return _order_free_source(obj, methods)
    if "l2" in methods and not isinstance(obj, HistogramObserver):
        raise ConfigError(
            "method 'l2' is a HistogramObserver's own search (torch's L2 range search); a "
            "tensor or calibrator offers max, percentile, entropy and mse"
        )
    if isinstance(obj, torch.Tensor):
        calib = HistogramCalibrator(8 if num_bits is None else num_bits, name="tensor")
        calib.collect(obj)
        return _calibrator_source(calib, methods, pct, channel, narrow_range=True, title="tensor")
    if isinstance(obj, TensorQuantizer):
        calib, title = obj.calibrator, f"TensorQuantizer {obj.name or ''}".rstrip()
        narrow = obj.narrow_range
    elif isinstance(obj, HistogramObserver):
        _check_bits(num_bits, bits_of_range(obj.quant_min, obj.quant_max), type(obj).__name__)
        return _observer_source(obj, methods, pct)
    else:
        calib, title, narrow = obj, type(obj).__name__, True
    if isinstance(calib, MaxCalibrator):
        raise ConfigError(
            f"{title} keeps only the running max of |x|, no histogram to draw: calibrate with a "
            f"HistogramCalibrator (QuantDescriptor(calib_method='histogram'))"
        )
    if not isinstance(calib, HistogramCalibrator):
        raise ConfigError(
            f"histogram() draws a tensor, a HistogramCalibrator, a TensorQuantizer or a "
            f"HistogramObserver, got {type(obj).__name__}: pass one of those (for another "
            f"observer, e.g. MinMaxObserver, use qviz.viz.ranges on the prepared model)"
        )
    _check_bits(num_bits, calib.num_bits, title)
    return _calibrator_source(calib, methods, pct, channel, narrow_range=narrow, title=title)


def _check_bits(num_bits: int | None, own: int, what: str) -> None:
    if num_bits is not None and num_bits != own:
        raise ConfigError(
            f"{what} picks its ranges for {own} bits, not num_bits={num_bits}: leave num_bits "
            f"out, or calibrate a {num_bits}-bit calibrator/observer (or pass the raw tensor)"
        )


def _weighted_metrics(
    values: torch.Tensor,
    weights: torch.Tensor,
    quantized: torch.Tensor,
    edges: torch.Tensor,
    limits: tuple[float, float],
) -> tuple[tuple[float, float, float], float]:
    """((clipped estimate, least, most), SQNR in dB) of a histogram and its fake-quantized
    bin centres; clipped is counted against the grid's ``clip_limits``."""
    clipped = histogram_clipped_fraction(weights, edges, *limits)
    signal = float((weights * values.square()).sum())
    noise = float((weights * (values - quantized).square()).sum())
    if noise == 0.0:
        return clipped, math.inf
    return clipped, (10.0 * math.log10(signal / noise) if signal > 0 else -math.inf)


def _centres(counts: torch.Tensor, edges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (edges[:-1] + edges[1:]) / 2, counts.to(torch.float64)


def _calibrator_source(
    calib: HistogramCalibrator,
    methods: tuple[str, ...],
    pct: float | None,
    channel: int,
    *,
    narrow_range: bool,
    title: str,
) -> HistogramData:
    counts, edges = calib.histogram(channel)
    values, weights = _centres(counts, edges)
    bits, unsigned = calib.num_bits, calib.unsigned
    _, qmax = quant_range(bits, unsigned=unsigned, narrow_range=narrow_range)
    rows, lines = [], []
    for method in methods:
        amax = float(calib.compute_amax(method, percentile=pct or 99.99).reshape(-1)[channel])
        quantized = fake_tensor_quant(
            values.float(), amax, bits, unsigned, narrow_range=narrow_range
        ).double()
        scale = float(symmetric_scale(amax, num_bits=bits, unsigned=unsigned))
        _, reach = clip_limits(scale, 0, -qmax, qmax)  # |x|: the positive limit applies
        clipped, sqnr_db = _weighted_metrics(values, weights, quantized, edges, (-reach, reach))
        low = 0.0 if unsigned else -amax
        rows.append(_row(method, amax, low, amax, scale, 0, clipped, sqnr_db, current=False))
        lines.append((f"method:{method}", amax, f"{method}  amax={amax:.4g}"))
    first = rows[0]
    grid = QuantGrid(first["scale"], 0, 0 if unsigned else -qmax, qmax)
    axis = f" channel {channel}" if calib.axis is not None else ""
    head = f"{title}{axis}: |x| of {calib.num_elements:,} values, {bits}-bit"
    return HistogramData(
        title=head,
        counts=weights,
        edges=edges,
        signed=False,
        lines=tuple(lines),
        rows=tuple(rows),
        grid=grid,
    )


def _row(method, amax, low, high, scale, zero_point, clipped, sqnr_db, *, current):
    return {
        "method": method,
        "amax": amax,
        "low": low,
        "high": high,
        "scale": scale,
        "zero_point": zero_point,
        "clipped_fraction": clipped[0],
        "clipped_least": clipped[1],
        "clipped_most": clipped[2],
        "sqnr_db": sqnr_db,
        "current": current,
    }


def _affine(values: torch.Tensor, scale: float, zero_point: int, qmin: int, qmax: int):
    q = torch.clamp(torch.round(values / scale) + zero_point, qmin, qmax)
    return (q - zero_point) * scale


def _observer_source(
    obs: HistogramObserver, methods: tuple[str, ...], pct: float | None
) -> HistogramData:
    """Rows from ``calculate_qparams(method=...)``; lines at the calibrator's amax."""
    if obs.num_batches == 0 or not (obs.calibrator is not None or float(obs.histogram.sum())):
        raise CalibrationError(
            f"{type(obs).__name__} has no histogram to draw (it saw no data, or was loaded from "
            f"a state_dict): run calibration batches through it (qviz.calibrate) first"
        )
    calib = obs.calibrator if obs.calibrator is not None and obs.calibrator.num_batches else None
    keeps_l2 = obs.switchable or obs.method == "l2"
    available = tuple(
        m for m in methods if (m == "l2" and keeps_l2) or (m != "l2" and calib is not None)
    )
    missing = [m for m in methods if m not in available]
    keeps_signed = float(obs.histogram.sum()) > 0
    if keeps_signed:
        lo, hi = float(obs.min_val), float(obs.max_val)
        edges = torch.linspace(lo, hi, obs.bins + 1, dtype=torch.float64)
        counts = obs.histogram.detach().cpu().to(torch.float64)
    else:
        counts, edges = calib.histogram()
        counts = counts.to(torch.float64)
    values, weights = _centres(counts, edges)
    qmin, qmax = obs.quant_min, obs.quant_max
    rows, lines = [], []
    order = [*available, *([obs.method] if obs.method not in available else [])]
    for method in order:
        opts = {"percentile": pct} if method == "percentile" and pct is not None else {}
        scale_t, zp_t = obs.calculate_qparams(method=method, **opts)
        scale, zp = float(scale_t.reshape(-1)[0]), int(zp_t.reshape(-1)[0])
        low, high = scale * (qmin - zp), scale * (qmax - zp)
        quantized = _affine(values, scale, zp, qmin, qmax)
        limits = clip_limits(scale, zp, qmin, qmax)
        clipped, sqnr_db = _weighted_metrics(values, weights, quantized, edges, limits)
        amax = None
        if method != "l2":
            amax_kw = {"percentile": pct or obs.percentile} if method == "percentile" else {}
            amax = float(calib.compute_amax(method, **amax_kw))
            lines.append((f"method:{method}", amax, f"{method}  amax={amax:.4g}"))
        current = method == obs.method
        rows.append(_row(method, amax, low, high, scale, zp, clipped, sqnr_db, current=current))
    return _observer_finish(obs, calib, rows, lines, missing)


def _order_free_source(obs: OrderFreeHistogramObserver, methods: tuple[str, ...]) -> HistogramData:
    """Its signed histogram over the power-of-two range and its own (L2) range: the one range
    it computes; the calibrator methods are listed as not kept."""
    if not bool(obs.counts.sum()):
        raise CalibrationError(
            f"{type(obs).__name__} has no histogram to draw (it saw no data): run calibration "
            f"batches through it (qviz.calibrate) first"
        )
    counts, edges = obs.histogram()
    values, weights = _centres(counts, edges)
    scale_t, zp_t = obs.calculate_qparams()
    scale, zp = float(scale_t.reshape(-1)[0]), int(zp_t.reshape(-1)[0])
    qmin, qmax = obs.quant_min, obs.quant_max
    quantized = _affine(values, scale, zp, qmin, qmax)
    clipped, sqnr_db = _weighted_metrics(
        values, weights, quantized, edges, clip_limits(scale, zp, qmin, qmax)
    )
    low, high = scale * (qmin - zp), scale * (qmax - zp)
    rows = [_row("l2", None, low, high, scale, zp, clipped, sqnr_db, current=True)]
    lines = [("observer:low", low, "observer (l2) range"), ("observer:high", high, "")]
    missing = [m for m in methods if m != "l2"]
    note = f"{', '.join(missing)}: not kept by this observer (its range is its L2 search)"
    note = note if missing else ""
    dtype = str(obs.dtype).removeprefix("torch.")
    lo, hi = float(obs.min_val), float(obs.max_val)
    head = (
        f"OrderFreeHistogramObserver {dtype} [{qmin}, {qmax}]: {int(counts.sum()):,} values in "
        f"[{lo:.4g}, {hi:.4g}], bins over ±{float(obs.hist_range):.4g}"
    )
    grid = QuantGrid(scale, zp, qmin, qmax)
    return HistogramData(
        title=head,
        counts=weights,
        edges=edges,
        signed=True,
        lines=tuple(lines),
        rows=tuple(rows),
        grid=grid,
        note=note,
    )


def _observer_finish(obs, calib, rows, lines, missing) -> HistogramData:
    own = next(r for r in rows if r["current"])
    signed = calib is None
    if signed:
        lines.append(("observer:low", own["low"], f"observer ({own['method']}) range"))
        lines.append(("observer:high", own["high"], ""))
        counts = obs.histogram.detach().cpu().to(torch.float64)
        lo, hi = float(obs.min_val), float(obs.max_val)
        edges = torch.linspace(lo, hi, obs.bins + 1, dtype=torch.float64)
        what = f"{obs.num_elements:,} values in [{lo:.4g}, {hi:.4g}]"
    else:
        reach = max(abs(own["low"]), abs(own["high"]))
        bounds = f"[{own['low']:.4g}, {own['high']:.4g}]"
        lines.append(("observer:range", reach, f"observer ({own['method']}) range {bounds}"))
        counts, edges = calib.histogram()
        counts = counts.to(torch.float64)
        what = f"|x| of {obs.num_elements:,} values"
    note = ""
    if missing:
        note = (
            f"{', '.join(missing)}: not kept by this observer "
            f"(create it with HistogramObserver.with_args(switchable=True))"
        )
    dtype = str(obs.dtype).removeprefix("torch.")
    head = f"HistogramObserver {dtype} [{obs.quant_min}, {obs.quant_max}]: {what}"
    grid = QuantGrid(own["scale"], own["zero_point"], obs.quant_min, obs.quant_max)
    return HistogramData(
        title=head,
        counts=counts,
        edges=edges,
        signed=signed,
        lines=tuple(lines),
        rows=tuple(rows),
        grid=grid,
        note=note,
    )


def _render(src: HistogramData, *, log: bool) -> Any:
    """Draw a source: histogram, method lines, grid ticks, legend and the table below."""
    n_rows = len(src.rows)
    fig = new_figure(figsize=(9, 5.2 + 0.28 * n_rows), layout="constrained")
    plot_ax, table_ax = fig.subplots(
        2, 1, gridspec_kw={"height_ratios": [5.0, 0.9 + 0.32 * n_rows]}
    )
    counts, edges = _display_bins(src.counts, src.edges)
    plot_ax.stairs(counts, edges, fill=True, color="0.65", label="observed", baseline=0)
    if log:
        plot_ax.set_yscale("log")
        positive = counts[counts > 0]
        if positive.size:
            plot_ax.set_ylim(bottom=max(positive.min() * 0.5, 1e-3))
    nonzero = (counts > 0).nonzero()[0]  # the data's extent, not the histogram's spare bins
    first, last = (int(nonzero[0]), int(nonzero[-1]) + 1) if nonzero.size else (0, len(counts))
    xs = [float(edges[first]), float(edges[last])]
    same_x: dict[float, int] = {}
    for gid, x, _ in src.lines:
        if not gid.startswith("observer"):
            same_x[x] = same_x.get(x, 0) + 1
    drawn_at: dict[float, int] = {}
    for gid, x, label in src.lines:
        method = gid.split(":", 1)[1]
        observer = gid.startswith("observer")
        style: Any = ":"
        if not observer:  # methods that pick the same range interleave their dashes
            k, n = drawn_at.get(x, 0), same_x[x]
            drawn_at[x] = k + 1
            style = "--" if n == 1 else (4.0 * k, (4.0, 4.0 * (n - 1)))
        plot_ax.axvline(
            x,
            color="black" if observer else _COLORS.get(method, "tab:gray"),
            linestyle=style,
            linewidth=1.6,
            label=label or None,
            gid=gid,
        )
        xs.append(x)
    span = max(xs) - min(xs) or 1.0
    plot_ax.set_xlim(min(xs) - 0.02 * span, max(xs) + 0.02 * span)
    _draw_grid(plot_ax, src)
    plot_ax.set_xlabel("x" if src.signed else "|x|")
    plot_ax.set_ylabel("count (log)" if log else "count")
    title = f"{src.title}\n{src.note}" if src.note else src.title
    plot_ax.set_title(title, fontsize=SMALLEST_FONT_PT + 1, loc="left")
    plot_ax.legend(fontsize=SMALLEST_FONT_PT, loc="best", framealpha=0.9)
    _draw_table(table_ax, src.rows)
    fig.qviz_rows = [dict(r) for r in src.rows]
    return fig


def _display_bins(counts: torch.Tensor, edges: torch.Tensor) -> tuple[Any, Any]:
    """Sum neighbouring bins down to at most ``_DISPLAY_BINS`` (exact sums; for drawing only)."""
    factor = max(1, math.ceil(len(counts) / _DISPLAY_BINS))
    if factor == 1:
        return counts.numpy(), edges.numpy()
    pad = (-len(counts)) % factor
    merged = torch.cat([counts, counts.new_zeros(pad)]).reshape(-1, factor).sum(1)
    width = edges[1] - edges[0]
    new_edges = edges[0] + width * factor * torch.arange(len(merged) + 1, dtype=torch.float64)
    new_edges[-1] = edges[-1] + width * pad
    return merged.numpy(), new_edges.numpy()


def _draw_grid(ax: Any, src: HistogramData) -> None:
    """Light ticks at the quantization levels, when few enough are visible to tell apart."""
    g = src.grid
    if g is None or g.scale <= 0:
        return
    low, high = ax.get_xlim()
    k = torch.arange(g.quant_min, g.quant_max + 1, dtype=torch.float64)
    levels = (k - g.zero_point) * g.scale
    if not src.signed:
        levels = levels.abs().unique()
    visible = levels[(levels >= low) & (levels <= high)]
    if len(visible) == 0 or len(visible) > _MAX_GRID_LEVELS:
        return
    ax.vlines(visible.numpy(), 0, 0.05, transform=ax.get_xaxis_transform(), colors="tab:blue",
              linewidth=0.8, alpha=0.8, gid="grid")  # fmt: skip
    ax.text(0.01, 0.07, f"ticks: {len(visible)} quantization levels ({src.rows[0]['method']})",
            transform=ax.transAxes, fontsize=SMALLEST_FONT_PT, color="tab:blue")  # fmt: skip


def _fmt(value: float | None, spec: str) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    return format(value, spec)


def clipped_text(row: dict[str, Any]) -> str:
    """A row's clipped share as a table shows it: the share, and the bounds the raw values'
    share lies in when the histogram cannot tell it exactly.

    Example:
        >>> clipped_text({"clipped_fraction": 0.0458, "clipped_least": 0.0, "clipped_most": 0.0916})
        '4.580% (0–9.16%)'
        >>> clipped_text({"clipped_fraction": 0.01, "clipped_least": 0.01, "clipped_most": 0.01})
        '1.000%'
    """
    text = f"{row['clipped_fraction']:.3%}"
    least, most = row.get("clipped_least"), row.get("clipped_most")
    if least is None or most is None or most - least < 5e-6:
        return text
    return f"{text} ({100 * least:.3g}–{100 * most:.3g}%)"


def _draw_table(ax: Any, rows: tuple[dict[str, Any], ...]) -> None:
    ax.axis("off")
    header = ["method", "range [low, high]", "scale", "zero_point", "clipped", "SQNR (dB)"]
    cells = [
        [
            r["method"] + (" (observer's)" if r["current"] else ""),
            f"[{r['low']:.4g}, {r['high']:.4g}]",
            _fmt(r["scale"], ".4g"),
            str(r["zero_point"]),
            clipped_text(r),
            _fmt(r["sqnr_db"], ".2f"),
        ]
        for r in rows
    ]
    widths = [0.15, 0.2, 0.11, 0.1, 0.3, 0.12]  # the clipped column holds a bracket too
    table = ax.table(
        cellText=cells, colLabels=header, colWidths=widths, loc="upper center", cellLoc="center"
    )
    table.auto_set_font_size(False)
    table.set_fontsize(SMALLEST_FONT_PT)
    table.scale(1.0, 1.25)
    for i, r in enumerate(rows, start=1):
        table[i, 0].get_text().set_color(_COLORS.get(r["method"], "black"))
    for j in range(len(header)):
        table[0, j].set_facecolor("0.9")
