"""The reading guide of the HTML report: what its colours, columns and notation mean.

:func:`qviz.viz.report` writes numbers in a compact notation (``clipped 4.579% (0–9.16%)``,
``g3``, ``zp``, ``rmse_scale``). This module holds the words that explain them, next to where
they appear: :func:`guide` is the page's "How to read this report" section (SQNR and its fixed
colour bands, the graph's boxes); :func:`glossary` is the short legend under a table, one entry
per column the table has.

Example:
    >>> "≤ 10 dB" in guide(numeric=True) and "Higher is better" in guide(numeric=True)
    True
    >>> "beyond the grid" in glossary(["clipped"], TABLE_TERMS)
    True
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping

from qviz.display.bands import SQNR, Bands

_SQNR = (
    "<b>SQNR</b> (signal-to-quantization-noise ratio), in <b>dB</b>: 10·log10 of the float "
    "output's power over the error's power (quantized − float). <b>Higher is better</b>; every "
    "6 dB halves the RMS error (about one bit); below 0 dB the error is larger than the signal. "
    "A healthy int8 layer is near 40 dB. Every SQNR "
    "in this page, in the graph's boxes and in the tables, is coloured by these <b>fixed</b> "
    "bands, the same in every report and in the Model Explorer export (a value on a boundary "
    "takes the lower band):"
)

#: The numeric suite's columns (``qviz.numeric.compare``) and the lowering comparison's.
TABLE_TERMS: dict[str, str] = {
    "node": "the operator's node name, as in the graph",
    "op": "the ATen operator it runs",
    "module": "the innermost module it came from",
    "local_sqnr": "SQNR of the operator's own error: its quantized computation fed the float "
    "model's inputs. A low value points at the culprit",
    "cumulative_sqnr": "SQNR of the quantized model end to end up to here, against the float "
    "model: everything upstream included. Low after a culprit without being one",
    "weight_sqnr": "SQNR of the quantized weight against the float one (BatchNorm folded in)",
    "local_mse": "mean squared error of the local comparison",
    "cumulative_mse": "mean squared error of the cumulative comparison",
    "cumulative_cosine": "cosine similarity of quantized and float output (1 = same direction)",
    "cumulative_max_abs_err": "largest absolute error of the cumulative comparison",
    "float_min": "float_min, float_max: the range the float output took over the data",
    "grid_min": "grid_min, grid_max: the range the output's quantization grid represents, "
    "scale · (q − zero_point) at quant_min and quant_max",
    "clipped": "share (0 to 1; 0.001 = 0.1 %) of the float output values beyond the grid: more "
    "than half a step past its lowest or highest level, where clamping, not rounding, sets the "
    "error; counted exactly over the data. Coloured by fixed bands, 0 green to over 1 % red",
    "rmse_scale": "RMS error of quantizing the float output, in steps of the grid: about 0.29 "
    "(1/√12) is pure rounding noise; much more means clipping or outliers",
    "clip_error_share": "share of that error carried by the clipped values (the rest is "
    "rounding): near 1, the range is wrong, not the step",
    "local_worst_token_sqnr": "local SQNR of the worst token (dim 1 of a [batch, tokens, "
    "features] output); worst_token: its index (−1: none)",
    "local_worst_channel_sqnr": "local SQNR of the worst channel (dim 1 of a conv output, the "
    "features of a 3-D one); worst_channel: its index (−1: none)",
    "local_bias_share": "share of the local error that is a constant offset per channel (what "
    "bias correction removes); worst_channel_bias_share: the same for the worst channel",
    "handle": "the debug handle the float and quantized operators were matched on",
}
#: The lowering comparison's columns (``qviz.numeric.compare_lowered``).
LOWERING_TERMS: dict[str, str] = {
    "tensor": "the reference's quantize node",
    "op": "the node whose output it quantizes",
    "elements": "elements: values in the tensor; differing: how many of the real kernels' "
    "integers differ from the reference's; share: their fraction",
    "max_steps": "the largest difference, in steps of the tensor's grid (integer levels)",
    "local_sqnr": TABLE_TERMS["local_sqnr"],
    "cumulative_sqnr": TABLE_TERMS["cumulative_sqnr"],
}
#: Columns explained under another column's entry.
_SAME_AS = {"float_max": "float_min", "grid_max": "grid_min", "worst_token":
            "local_worst_token_sqnr", "worst_channel": "local_worst_channel_sqnr",
            "worst_channel_bias_share": "local_bias_share", "differing": "elements",
            "share": "elements"}  # fmt: skip

#: The plan's group table.
PLAN_TERMS: dict[str, str] = {
    "group": "the sharing group: gN in the graph; every tensor of a group shares one observer, "
    "so one scale and zero_point",
    "members": "the tensors it quantizes: producer -> consumer is the edge into the consumer's "
    "input, a name alone that node's output",
    "kind": "observed: an observer measures the range; fixed: fixed scale and zero_point; "
    "derived: computed from other groups (a bias from its input's and weight's scales)",
    "range": "[quant_min, quant_max]: the integer levels of the grid",
    "qscheme": "per_tensor / per_channel (one scale per index of ch_axis), affine (any "
    "zero_point) or symmetric (zero_point fixed, 0 for int8)",
    "ch_axis": "the axis whose every index has its own scale (per-channel), empty otherwise",
    "qparams": "scale (lowest..highest over the channels, and how many) and zp, the "
    "zero_point: the integer that stands for 0.0",
}

#: The methods' table under each histogram.
HISTOGRAM_TERMS: dict[str, str] = {
    "method": "the calibration method; (observer's) marks the one the observer uses",
    "range [low, high]": "the float range the method picks; scale and zero_point: the grid it "
    "gives",
    "clipped": "e.g. 4.579% (0–9.16%): the share of the values the observer saw that lie beyond "
    "that grid (more than half a step past its end levels, where clamping, not rounding, sets "
    "the error). The observer kept a histogram, not the values, so 4.579% is an estimate that "
    "spreads each bin's count evenly over the bin; the bracket bounds the true share: 0% counts "
    "only the bins wholly beyond a limit, 9.16% every bin that reaches past one. No bracket: no "
    "limit falls inside a bin that holds values, so the share is exact",
    "SQNR dB": "SQNR of that grid on the histogram's values (each bin's centre quantized, "
    "weighted by its count)",
}


def band_legend(bands: Bands) -> str:
    """One line of swatches, each band's colour and bounds (``≤ 10 dB`` ...); for SQNR also the
    RMS error each band allows, as a share of the signal's RMS.

    Example:
        >>> "&gt; 40 dB (error &lt; 1 %)" in band_legend(SQNR), "#f46d43" in band_legend(SQNR)
        (True, True)
    """
    return '<div class="bands">' + "".join(
        f'<span class="band"><span class="swatch" style="background:{c}"></span>'
        f"{html.escape(label + _error_text(bands, i))}</span>"
        for i, (c, label) in enumerate(bands.legend())
    ) + "</div>"  # fmt: skip


def _error_text(bands: Bands, i: int) -> str:
    """`` (error 3.2–10 %)``: the RMS error over the signal's RMS, 10^(-dB/20), of band ``i``."""
    if bands is not SQNR:
        return ""
    edges = [upper for upper, _ in bands.edges]

    def share(db: float) -> str:
        return f"{100 * 10 ** (-db / 20):.2g}"

    if i == 0:
        return f" (error ≥ {share(edges[0])} % of the signal's RMS)"
    if i == len(edges) - 1:
        return f" (error < {share(edges[i - 1])} %)"
    return f" (error {share(edges[i])}–{share(edges[i - 1])} %)"


def glossary(columns: Iterable[str], terms: Mapping[str, str]) -> str:
    """A legend of the ``columns`` that ``terms`` explains, in the columns' order; a column
    explained under another (``grid_max`` under ``grid_min``) is listed once.

    Example:
        >>> glossary(["grid_min", "grid_max", "mystery"], TABLE_TERMS).count("<dt>")
        1
    """
    seen, rows = set(), []
    for column in columns:
        key = _SAME_AS.get(str(column), str(column))
        if key in terms and key not in seen:
            seen.add(key)
            rows.append(f"<dt>{html.escape(key)}</dt><dd>{html.escape(terms[key])}</dd>")
    return f'<dl class="terms">{"".join(rows)}</dl>' if rows else ""


def guide(*, numeric: bool = False, coloured: bool = False, lowered: bool = False) -> str:
    """The "How to read this report" section: SQNR and its bands when the page has numeric
    results (``numeric``), the graph's boxes (``coloured``: by local_sqnr; ``lowered``: the
    real kernels), and where each table's legend is."""
    parts = []
    if numeric:
        parts.append(f"<p>{_SQNR}</p>{band_legend(SQNR)}")
    parts.append(
        "<p><b>Graph</b>: one box per operator, arrows in data order; the legend drawn inside "
        "the graph says what each colour means. <b>gN</b> marks the observer of sharing group "
        "N: tensors with the same gN share one scale and zero_point (<b>zp</b>). A converted "
        "model's quantize / dequantize boxes show that scale and zp. "
        + ("Each operator's box shows its local_sqnr, in its band's colour. " if coloured else "")
        + ("On real kernels: a blue border runs on an integer kernel, an orange dashed one on a "
           "float kernel; that graph is coloured by steps from the reference, 0 green to 4× "
           "the tolerance red. " if lowered else "")
        + "Hover over a box (in a browser) for the full node.</p>"
    )  # fmt: skip
    parts.append(
        "<p>Each table's columns are explained under it. Empty cells: not measured (an operator "
        "without a weight has no weight_sqnr; a conv fused with its ReLU is quantized once, "
        "after the ReLU, so its grid columns are on the ReLU's row).</p>"
    )
    return "\n".join(parts)
