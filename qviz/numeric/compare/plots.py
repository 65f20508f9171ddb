"""Figures of the numeric suite's tables (matplotlib Figures, returned, never shown).

Example:
    >>> import pandas as pd
    >>> df = pd.DataFrame({"node": ["conv2d", "relu"], "local_sqnr": [35.0, 40.0],
    ...                    "cumulative_sqnr": [35.0, 33.0]})
    >>> fig = sqnr_bars(df)
    >>> [t.get_text() for t in fig.axes[0].get_yticklabels()]
    ['conv2d', 'relu']
"""

from __future__ import annotations

import math
from typing import Any


def _figure(**kwargs: Any) -> Any:
    from qviz.display.figure import new_figure

    return new_figure(**kwargs)


def _finite(values: Any) -> list[float]:
    """Bar lengths: +inf (no error at all) drawn as the largest finite value, NaN as 0."""
    finite = [v for v in values if isinstance(v, float | int) and math.isfinite(v)]
    cap = max(finite, default=0.0)
    return [cap if v == math.inf else (0.0 if not math.isfinite(v) else float(v)) for v in values]


def _max_ticks(n: int) -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(n)


def sqnr_bars(df: Any, *, top: int | None = None, title: str = "") -> Any:
    """Horizontal bars per operator: local SQNR and cumulative SQNR side by side (dB).

    The operator with the lowest local SQNR is outlined in red: that is where error originates;
    a low cumulative bar after a normal local one is error inherited from upstream.
    """
    if top is not None:
        keep = df.sort_values("local_sqnr", kind="stable").head(top).index
        df = df.loc[sorted(keep)]
    labels = [str(n) for n in df["node"]]
    local, cumulative = _finite(list(df["local_sqnr"])), _finite(list(df["cumulative_sqnr"]))
    height = max(2.5, 0.28 * len(labels) + 1.2)
    fig = _figure(figsize=(8, height), layout="constrained")
    ax = fig.subplots()
    ys = list(range(len(labels)))
    ax.barh([y - 0.2 for y in ys], local, height=0.4, color="tab:blue", label="local (own error)")
    ax.barh([y + 0.2 for y in ys], cumulative, height=0.4, color="tab:orange", label="cumulative")
    measured = [i for i, v in enumerate(df["local_sqnr"]) if not math.isnan(float(v))]
    if measured:
        worst = min(measured, key=lambda i: local[i])
        ax.barh(worst - 0.2, local[worst], height=0.4, fill=False, edgecolor="red", linewidth=2)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("SQNR (dB, higher is better)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=2, frameon=False)
    if title:
        fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    return fig


def detail_figure(detail: Any) -> Any:
    """Float against quantized outputs (scatter, with the identity line) and the error histogram.

    Example:
        >>> import numpy as np
        >>> from qviz.numeric.compare.detail import LayerDetail
        >>> x = np.linspace(-1, 1, 50, dtype=np.float32)
        >>> d = LayerDetail(node="relu", sqnr=40.0, numel=50, float_values=x,
        ...     quantized_values=x + 0.01, error_counts=np.ones(3), error_edges=np.linspace(0, 0.02,
        ...     4))
        >>> [ax.get_xlabel() for ax in detail_figure(d).axes]
        ['float output', 'quantized − float']
    """
    fig = _figure(figsize=(9, 3.4), layout="constrained")
    scatter, hist = fig.subplots(1, 2)
    f, q = detail.float_values, detail.quantized_values
    scatter.scatter(f, q, s=4, alpha=0.35, color="tab:blue", linewidths=0, rasterized=True)
    if len(f):
        low, high = float(min(f.min(), q.min())), float(max(f.max(), q.max()))
        scatter.plot([low, high], [low, high], color="0.4", linewidth=0.8, linestyle="--")
    scatter.set_xlabel("float output")
    scatter.set_ylabel("quantized output")
    scatter.set_title(f"{detail.node}: {len(f)} of {detail.numel} values", fontsize=10)
    hist.stairs(detail.error_counts, detail.error_edges, fill=True, color="tab:orange")
    hist.set_xlabel("quantized − float")
    hist.xaxis.set_major_locator(_max_ticks(5))
    hist.set_ylabel("values")
    hist.set_title(f"error, SQNR {detail.sqnr:.2f} dB on the sample batch", fontsize=10)
    if detail.in_float:
        fig.suptitle("kept in float (fallback): the error is inherited from upstream", fontsize=10)
    return fig
