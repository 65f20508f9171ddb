"""history_plot: several training runs side by side, one panel per metric, one line per run.

Fine-tuning at a few bit widths gives one history per run; this draws them on shared axes so
the runs can be compared epoch by epoch, with an optional baseline (the float model) as a
dashed line. Each row of a history is a mapping or an object with an ``epoch`` and the metrics
(a :class:`~qviz.engine.tensor.fine_tune.EpochRecord` is one); rows without a metric's value
(``None``) are skipped for that metric.

Example:
    >>> runs = {"w4a8": [{"epoch": 0, "accuracy": 0.90}, {"epoch": 1, "accuracy": 0.97}]}
    >>> fig = history_plot(runs, metrics=("accuracy",), baseline={"accuracy": 0.98})
    >>> fig.qviz_rows
    [{'run': 'w4a8', 'epoch': 0, 'accuracy': 0.9}, {'run': 'w4a8', 'epoch': 1, 'accuracy': 0.97}]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from qviz.errors import ConfigError


def _value(row: Any, key: str) -> Any:
    """``row[key]`` for a mapping, ``row.key`` otherwise; None when the row has no such value."""
    if isinstance(row, Mapping):
        return row.get(key)
    return getattr(row, key, None)


def _rows(runs: Mapping[str, Sequence[Any]], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """One flat dict per (run, epoch): the run's label, the epoch and each metric's value."""
    rows = []
    for run, history in runs.items():
        for index, row in enumerate(history):
            epoch = _value(row, "epoch")
            if epoch is None:
                raise ConfigError(
                    f"history_plot: row {index} of run {run!r} has no 'epoch' ({row!r}); give "
                    f"each row an epoch (a dict key or an attribute, as EpochRecord has)"
                )
            rows.append({"run": run, "epoch": epoch, **{m: _value(row, m) for m in metrics}})
    return rows


def history_plot(
    runs: Mapping[str, Sequence[Any]],
    *,
    metrics: Sequence[str] = ("accuracy", "eval_loss"),
    ylabels: Mapping[str, str] | None = None,
    baseline: Mapping[str, float] | None = None,
    baseline_label: str = "float",
    xlabel: str = "epoch",
) -> Any:
    """Plot each run's history: one panel per metric, one labelled line per run.

    Args:
        runs: run label -> its rows in epoch order; a row is a mapping or an object with
            ``epoch`` and each metric (a ``FineTuneHistory``, or a list of dicts).
        metrics: the row fields to plot, one panel each.
        ylabels: metric -> the panel's y label (default: the metric's name).
        baseline: metric -> a reference value, drawn as a dashed grey line.
        baseline_label: the baseline's legend entry.
        xlabel: the x axis label of every panel.

    Returns:
        A matplotlib Figure that shows itself in a notebook. ``fig.qviz_rows`` holds the plotted
        values, one dict per run and epoch (``run``, ``epoch`` and each metric).

    Raises:
        ConfigError: no runs or no metrics, or a row without an epoch (named).

    Example:
        >>> runs = {"a": [{"epoch": 1, "loss": 0.5}], "b": [{"epoch": 1, "loss": 0.4}]}
        >>> fig = history_plot(runs, metrics=("loss",))
        >>> [line.get_label() for line in fig.axes[0].get_lines()]
        ['a', 'b']
    """
    from qviz.display.figure import new_figure

    if not runs or not metrics:
        raise ConfigError("history_plot needs at least one run and one metric")
    rows, ylabels, baseline = _rows(runs, metrics), ylabels or {}, baseline or {}
    fig = new_figure(figsize=(4.5 * len(metrics), 3.2), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics, strict=True):
        for run in runs:
            points = [(r["epoch"], r[metric]) for r in rows if r["run"] == run]
            points = [(e, v) for e, v in points if v is not None]
            ax.plot([e for e, _ in points], [v for _, v in points], "o-", label=run)
        if metric in baseline:
            ax.axhline(baseline[metric], color="grey", ls="--", label=baseline_label)
        epochs = sorted({r["epoch"] for r in rows})
        ax.set(xlabel=xlabel, ylabel=ylabels.get(metric, metric.replace("_", " ")), xticks=epochs)
    axes[-1].legend()
    fig.qviz_rows = rows
    return fig
