"""``ranges``: every observer group of a prepared model on one axis, so outlier ranges stand out.

One row per sharing group of ``prepared.plan``, in graph order (where its observer runs): a thin
line from the observed ``min_val`` to ``max_val`` and a thick bar over the range the observer
quantizes with, ``scale * (quant_min - zero_point) .. scale * (quant_max - zero_point)`` from
``calculate_qparams()``. A per-channel observer shows the envelope over its channels. Rows whose
range is more than ``outlier`` times the median width are drawn in red.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> from qviz.viz.ranges.range_view import ranges
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    >>> gm = qviz.export(model, (torch.randn(2, 4),))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> prepared = qviz.prepare_pt2e(gm, q)
    >>> prepared = qviz.calibrate(prepared, [torch.randn(2, 4)], progress=False)
    >>> fig = ranges(prepared)
    >>> [row["group"] for row in fig.qviz_rows]
    [0, 1, 2]
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from torch import nn

from qviz.engine.graph.stage import Stage, model_stage
from qviz.engine.pt2e.plan import plan_of
from qviz.errors import CalibrationError, ConfigError


def _new_figure(**kwargs: Any) -> Any:
    from qviz.display.figure import new_figure

    return new_figure(**kwargs)


def ranges(prepared: Any, *, outlier: float = 4.0, max_members: int = 2) -> Any:
    """Draw observed and quantization ranges of every observer group of a calibrated model.

    Args:
        prepared: a model from ``qviz.prepare_pt2e`` that went through ``qviz.calibrate``.
        outlier: rows whose quantization range is wider than this many times the median width
            are drawn in red.
        max_members: member tensors named per row label (the rest are counted).

    Returns:
        A matplotlib Figure. ``fig.qviz_rows`` holds one dict per row: ``group``, ``observer``,
        ``members``, ``observed_min``, ``observed_max``, ``low``, ``high`` (None when the
        observer computes no qparams, e.g. dynamic quantization) and ``outlier``.

    Raises:
        ConfigError: ``prepared`` has no ``.plan`` (not from ``qviz.prepare_pt2e``).
        CalibrationError: an observer saw no data.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
        >>> data = [torch.randn(8, 4) for _ in range(2)]
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> prepared = qviz.prepare_pt2e(qviz.export(model, (data[0],)), q)
        >>> fig = ranges(qviz.calibrate(prepared, data, progress=False))
        >>> len(fig.qviz_rows) >= 2, sorted(fig.qviz_rows[0])[:3]
        (True, ['group', 'high', 'low'])
    """
    if isinstance(prepared, nn.Module) and model_stage(prepared) is Stage.CONVERTED:
        raise ConfigError(
            "qviz.viz.ranges: prepared must be a calibrated model from qviz.prepare_pt2e, got a "
            "converted GraphModule (its observers became quantize/dequantize ops, so there is no "
            "observed range left to draw): pass the prepared model after qviz.calibrate, before "
            "qviz.convert_pt2e (e.g. ranges(prepared), then converted = "
            "qviz.convert_pt2e(prepared)); for a converted model use qviz.viz.graph(converted)"
        )
    plan = plan_of(prepared)
    if plan is None:
        raise ConfigError(
            f"ranges() reads the QuantPlan of a prepared model, got {type(prepared).__name__} "
            f"without .plan: pass the model returned by qviz.prepare_pt2e (after qviz.calibrate)"
        )
    rows = [_row(prepared, g, max_members) for g in _graph_order(prepared, plan.groups)]
    widths = [r["high"] - r["low"] for r in rows if r["low"] is not None]
    median = statistics.median(widths) if widths else 0.0
    for r in rows:
        wide = r["low"] is not None and median > 0 and r["high"] - r["low"] > outlier * median
        r["outlier"] = bool(wide)
    return _render(rows, outlier)


def _graph_order(prepared: Any, groups: tuple) -> list:
    """Groups sorted by the first node that reads their observer's output (then the observer's
    group id), so a layer's weight sits next to its input activation."""
    index: dict[Any, int] = {}
    position: dict[str, int] = {}
    graph = getattr(prepared, "graph", None)
    for i, node in enumerate(graph.nodes if graph is not None else ()):
        index[node] = i
    for node, i in index.items():
        if node.op == "call_module" and node.target not in position:
            first_user = min((index[u] for u in node.users), default=i)
            position[node.target] = first_user
    return sorted(groups, key=lambda g: (position.get(g.observer, len(index)), g.group))


def _label(group: Any, max_members: int) -> str:
    names = [str(m) for m in group.members]
    shown = ", ".join(names[:max_members])
    more = f" +{len(names) - max_members}" if len(names) > max_members else ""
    return f"g{group.group}: {shown}{more}"


def _row(prepared: Any, group: Any, max_members: int) -> dict[str, Any]:
    obs = prepared.get_submodule(group.observer)
    has_range = getattr(obs, "_has_range", None)
    if has_range is not None and not has_range():
        raise CalibrationError(
            f"observer {group.observer} (group {group.group}, {_label(group, 3)}) saw no data: "
            f"run qviz.calibrate(prepared, batches) before qviz.viz.ranges"
        )
    observed = (float(torch.min(obs.min_val)), float(torch.max(obs.max_val)))
    try:
        scale, zero_point = obs.calculate_qparams()
    except CalibrationError:  # e.g. dynamic quantization: qparams come at run time
        low = high = None
    else:
        scale, zero_point = scale.double().reshape(-1), zero_point.double().reshape(-1)
        low = float((scale * (obs.quant_min - zero_point)).min())
        high = float((scale * (obs.quant_max - zero_point)).max())
    return {
        "group": group.group,
        "observer": group.observer,
        "label": _label(group, max_members),
        "members": tuple(str(m) for m in group.members),
        "observed_min": observed[0],
        "observed_max": observed[1],
        "low": low,
        "high": high,
    }


def _render(rows: list[dict[str, Any]], outlier: float) -> Any:
    n = len(rows)
    fig = _new_figure(figsize=(9, 1.4 + 0.38 * max(n, 1)), layout="constrained")
    ax = fig.subplots()
    for y, r in enumerate(rows):
        color = "tab:red" if r["outlier"] else "tab:blue"
        ax.hlines(y, r["observed_min"], r["observed_max"], colors="0.25", linewidth=1.2,
                  gid=f"observed:{r['group']}")  # fmt: skip
        ax.plot([r["observed_min"], r["observed_max"]], [y, y], "|", color="0.25", markersize=9)
        if r["low"] is None:
            ax.text(r["observed_max"], y, "  no qparams (dynamic)", va="center", fontsize=7)
            continue
        ax.barh(y, r["high"] - r["low"], left=r["low"], height=0.55, color=color, alpha=0.45,
                edgecolor=color, gid=f"range:{r['group']}")  # fmt: skip
        right = max(r["high"], r["observed_max"])
        ax.text(right, y, f"  [{r['low']:.3g}, {r['high']:.3g}]", va="center", fontsize=7)
    ax.set_yticks(range(n), [r["label"] for r in rows], fontsize=8)
    ax.set_ylim(n - 0.5, -0.5)
    ax.axvline(0.0, color="0.6", linewidth=0.8)
    ax.margins(x=0.12)
    ax.set_xlabel("value")
    ax.set_title(
        f"{n} observer groups in graph order\nline: observed min..max   bar: quantization "
        f"range (red: wider than {outlier:g}x the median)",
        fontsize=9,
        loc="left",
    )
    fig.qviz_rows = [{k: v for k, v in r.items() if k != "label"} for r in rows]
    return fig
