"""NumericReport: the numeric suite's per-operator table, and views of it.

One row per quantized operator, in graph order. Its columns:

======================  ======================================================================
node, op                the operator's node name (as in the plan and the graphs) and ATen op
module                  the innermost module it came from (``nn_module_stack``)
local_sqnr              dB: the operator's own error (fed the float model's inputs); low = the
                        culprit
local_mse               the local comparison's mean squared error
cumulative_sqnr         dB: cumulative error (the quantized model end to end, everything
                        upstream included) against the float output
cumulative_mse,         the same cumulative comparison as mean squared error, cosine
cumulative_cosine,      similarity and largest absolute error
cumulative_max_abs_err
weight_sqnr             dB: the quantized weight against the float one (BatchNorm folded in),
                        or NaN
float_min/max           the float output's range over the data
grid_min/max            the range its output quantization can represent,
                        ``scale * (q - zero_point)``
clipped                 share of float output values beyond the last level's rounding boundary
                        (``qviz.engine.qparams.clip_limits``: clamping, not rounding, sets their
                        error)
rmse_scale              RMS error of fake-quantizing the float output, in steps: ~0.29 is pure
                        rounding noise; much larger means clipping or outliers
handle                  the debug handle matched on
clip_error_share        share of that fake-quantization error carried by the clipped values
                        (the rest is rounding): near 1 means the range, not the step, is wrong
local_worst_token_sqnr  dB: the local comparison's lowest SQNR of one token (dim 1 of a 3-D
worst_token             ``[batch, tokens, features]`` tensor) and that token's index (-1: none)
local_worst_channel_    dB: the same for one channel (dim 1 of a conv output or a 2-D / 4-D
sqnr, worst_channel     tensor, the features of a 3-D one) and its index
                        (:mod:`qviz.numeric.measure.slices`): a broken slice that the
                        tensor-wide SQNR hides (a CLS token, one outlier channel) shows here
local_bias_share        share of the local error energy that is a constant offset per channel
                        (each channel's mean error): what bias correction removes
worst_channel_bias_     the same share for the worst channel's own error
share
======================  ======================================================================

Every column says which comparison it comes from: ``local_*`` the operator alone,
``cumulative_*`` the quantized model end to end.

Example:
    >>> r = NumericReport.from_table([{"node": "conv2d", "op": "conv2d", "local_sqnr": 31.0,
    ...                                "cumulative_sqnr": 29.5}], output_sqnr=28.0)
    >>> r.worst(1)["node"].tolist(), r.output_sqnr
    (['conv2d'], 28.0)
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from qviz.engine.graph.fingerprint import Fingerprint
from qviz.engine.graph.fingerprint import fingerprint as fingerprint_of
from qviz.engine.graph.node_data import op_name
from qviz.errors import ConfigError

COLUMNS = (
    "node",
    "op",
    "module",
    "local_sqnr",
    "cumulative_sqnr",
    "cumulative_mse",
    "cumulative_cosine",
    "cumulative_max_abs_err",
    "local_mse",
    "weight_sqnr",
    "float_min",
    "float_max",
    "grid_min",
    "grid_max",
    "clipped",
    "rmse_scale",
    "handle",
    "clip_error_share",
    "local_worst_token_sqnr",
    "worst_token",
    "local_worst_channel_sqnr",
    "worst_channel",
    "local_bias_share",
    "worst_channel_bias_share",
)


def _module_path(node: Any) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path = ""
    for value in stack.values():
        if isinstance(value, tuple) and len(value) == 2:
            path = str(value[0])
    return path


def _row_dict(r: Any) -> dict[str, Any]:
    nan = math.nan
    local = r.local
    grid = r.grid
    return {
        "node": r.node.name,
        "op": op_name(r.node),
        "module": _module_path(r.node),
        "local_sqnr": local.sqnr if local is not None and local.count else nan,
        "cumulative_sqnr": r.cumulative.sqnr if r.cumulative.count else nan,
        "cumulative_mse": r.cumulative.mse,
        "cumulative_cosine": r.cumulative.cosine if r.cumulative.count else nan,
        "cumulative_max_abs_err": r.cumulative.max_abs if r.cumulative.count else nan,
        "local_mse": local.mse if local is not None else nan,
        "weight_sqnr": r.weight_sqnr,
        "float_min": grid.low if grid is not None and grid.count else nan,
        "float_max": grid.high if grid is not None and grid.count else nan,
        "grid_min": grid.grid_min if grid is not None else nan,
        "grid_max": grid.grid_max if grid is not None else nan,
        "clipped": grid.clipped if grid is not None else nan,
        "rmse_scale": grid.rmse_scale if grid is not None else nan,
        "handle": r.ref,
        "clip_error_share": grid.clip_error_share if grid is not None else nan,
        **_slice_columns(r.slices if local is not None else None),
    }


def _slice_columns(s: Any) -> dict[str, Any]:
    """The slice-aware columns of a row (:mod:`qviz.numeric.measure.slices`); NaN / -1 without."""
    if s is None or not s.count:
        return {"local_worst_token_sqnr": math.nan, "worst_token": -1,
                "local_worst_channel_sqnr": math.nan, "worst_channel": -1,
                "local_bias_share": math.nan, "worst_channel_bias_share": math.nan}  # fmt: skip
    return {
        "local_worst_token_sqnr": s.worst_token_sqnr(),
        "worst_token": s.worst_token(),
        "local_worst_channel_sqnr": s.worst_channel_sqnr(),
        "worst_channel": s.worst_channel(),
        "local_bias_share": s.bias_share(),
        "worst_channel_bias_share": s.worst_channel_bias_share(),
    }


class NumericReport:
    """Per-operator float-vs-quantized comparison (``.df``), with the model outputs' figures.

    Attributes:
        df: the table (pandas DataFrame), one row per quantized operator in graph order.
        output_sqnr: SQNR (dB) of the model outputs, quantized against float, over all data:
            every floating-point output tensor (each leaf of a tuple, dict or Hugging Face
            ``ModelOutput``) as one signal over one noise (:mod:`qviz.numeric.measure.totals`); NaN
            only with ``output_problem``.
        output_problem: why ``output_sqnr`` is not a number (no floating-point output, a NaN
            in one output only, ...), with what to do; None when it is one.
        output_leaves: each floating-point output leaf's own SQNR (dB), by path
            (``{"output.logits": 31.2}``).
        metric: the user's metric, averaged over samples (None when not given).
        batches, samples: how much data was compared.
        fingerprint, float_fingerprint: the quantized and the float model it measured
            (:func:`qviz.engine.graph.fingerprint.fingerprint`; None for a table built by
            hand). Export, views and the dashboard refuse the report with another model.

    Example:
        >>> r = NumericReport.from_table([
        ...     {"node": "a", "local_sqnr": 40.0, "cumulative_sqnr": 39.0},
        ...     {"node": "b", "local_sqnr": 12.0, "cumulative_sqnr": 11.0}])
        >>> r.worst(1, by="cumulative_sqnr")["node"].tolist()
        ['b']
    """

    def __init__(
        self,
        df: Any,
        *,
        output_sqnr: float = math.nan,
        output_problem: str | None = None,
        output_leaves: dict[str, float] | None = None,
        metric: float | None = None,
        batches: int = 0,
        samples: int = 0,
        fingerprint: Fingerprint | None = None,
        float_fingerprint: Fingerprint | None = None,
    ) -> None:
        self.df = df
        self.output_sqnr = output_sqnr
        self.output_problem = output_problem
        self.output_leaves = dict(output_leaves or {})
        self.metric = metric
        self.batches = batches
        self.samples = samples
        self.fingerprint = fingerprint
        self.float_fingerprint = float_fingerprint

    def measured(self, quantized_model: Any, float_model: Any) -> NumericReport:
        """Record the models this report measured (their fingerprints); returns ``self``."""
        self.fingerprint = fingerprint_of(quantized_model)
        self.float_fingerprint = fingerprint_of(float_model)
        return self

    @classmethod
    def from_rows(cls, rows: Sequence[Any], **figures: Any) -> NumericReport:
        """Build from the comparison's accumulated rows (see :func:`qviz.numeric.compare`) and
        its model-level figures (:meth:`qviz.numeric.measure.totals.OutputTotals.figures`)."""
        return cls.from_table([_row_dict(r) for r in rows], **figures)

    @classmethod
    def from_table(cls, records: Sequence[dict[str, Any]], **figures: Any) -> NumericReport:
        """Build from plain dicts (missing columns are NaN / empty)."""
        import pandas as pd

        df = pd.DataFrame.from_records(list(records))
        for col in COLUMNS:
            if col not in df.columns:
                df[col] = "" if col in ("node", "op", "module") else math.nan
        return cls(df[list(COLUMNS)], **figures)

    def worst(self, n: int = 5, by: str = "local_sqnr") -> Any:
        """The ``n`` rows with the lowest ``by`` (a numeric column), worst first."""
        if by not in self.df.columns or self.df[by].dtype.kind not in "fiu":
            numeric = [c for c in self.df.columns if self.df[c].dtype.kind in "fiu"]
            renamed = f"cumulative_{by}" if f"cumulative_{by}" in numeric else None
            hint = f" (the cumulative one is named {renamed!r})" if renamed else ""
            raise ConfigError(
                f"worst(by={by!r}): not a numeric column{hint}; choose one of {numeric}"
            )
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"worst(n={n!r}): n must be a positive int")
        return self.df.sort_values(by, kind="stable", na_position="last").head(n)

    def to_csv(self, path: str | os.PathLike[str]) -> None:
        """Write the table as CSV (the model figures are in the header comment lines)."""
        with open(path, "w", encoding="utf-8", newline="") as fh:
            fh.write(f"# output_sqnr_db={self.output_sqnr}\n# metric={self.metric}\n")
            self.df.to_csv(fh, index=False)

    def summary(self) -> str:
        """One line: data compared, output SQNR, metric, worst operator."""
        parts = [f"{len(self.df)} quantized ops", f"{self.samples} samples"]
        if self.output_problem is not None:
            parts.append(f"output SQNR not measured ({self.output_problem})")
        else:
            parts.append(f"output SQNR {self.output_sqnr:.2f} dB")
        if self.metric is not None:
            parts.append(f"metric {self.metric:.4g}")
        if len(self.df) and self.df["local_sqnr"].notna().any():
            worst = self.worst(1).iloc[0]
            parts.append(f"worst local: {worst['node']} ({worst['local_sqnr']:.2f} dB)")
        return ", ".join(parts)

    def plot(self, *, top: int | None = None) -> Any:
        """Bars of local and cumulative SQNR per operator (graph order); returns the Figure.

        Args:
            top: only the ``top`` operators with the lowest local SQNR (still in graph order).
        """
        from qviz.numeric.compare.plots import sqnr_bars

        return sqnr_bars(self.df, top=top, title=self.summary())

    def __repr__(self) -> str:
        return f"NumericReport({self.summary()})"

    def _repr_html_(self) -> str:
        """The notebook view (:mod:`qviz.numeric.compare.view`): the summary, the columns a
        reader needs first (SQNR and clipped cells in the fixed colour bands, long names
        wrapped) and a note naming the other columns of :attr:`df`."""
        from qviz.numeric.compare.view import report_html

        return report_html(self)
