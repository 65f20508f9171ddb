"""The figure of a :class:`~qviz.numeric.QATMonitor`: scales, clipping and changes, by name.

Every module is named by what it quantizes (``conv2d_1 weight``, ``relu output``: see
:mod:`qviz.numeric.qat.names`). The scale trajectories are drawn in two panels, weights and
activations, each with a legend; past :data:`LEGEND_LINES` lines in a panel the ones that moved
most keep a colour and a legend entry and the rest are grey. The clipped share is a heat map, one
named row per module, beside the count of steps on which its scale or zero_point changed. Each
:meth:`~qviz.numeric.QATMonitor.mark` (e.g. the dashboard's "freeze observers") is a dashed line
after its step, named at the top. No text is smaller than :data:`MIN_FONT_PT` points: 10 pixels
at 72 dpi, more at the 100 dpi a notebook shows.

Example:
    >>> import torch
    >>> from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e
    >>> from torchao.testing.pt2e._xnnpack_quantizer import (XNNPACKQuantizer,
    ...     get_symmetric_quantization_config)
    >>> from qviz.numeric import QATMonitor
    >>> gm = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),)).module()
    >>> monitor = QATMonitor(prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config(is_qat=True))))
    >>> _ = monitor.model(torch.randn(2, 4)); monitor.step()
    >>> fig = qat_figure(monitor)
    >>> [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    ['linear weight', 'input input_1', 'linear output']
"""

from __future__ import annotations

import math
from typing import Any

#: the smallest font in the figure, in points
MIN_FONT_PT = 10
#: lines per trajectory panel that get a colour and a legend entry
LEGEND_LINES = 10
_FONTS = {"font.size": MIN_FONT_PT, "axes.titlesize": 11, "axes.labelsize": MIN_FONT_PT,
          "xtick.labelsize": MIN_FONT_PT, "ytick.labelsize": MIN_FONT_PT,
          "legend.fontsize": MIN_FONT_PT, "figure.dpi": 100}  # fmt: skip


def _series(monitor: Any) -> dict[str, list[Any]]:
    by_name: dict[str, list[Any]] = {n: [] for n in monitor.modules}
    for r in monitor.records:
        by_name[r.name].append(r)
    return by_name


def _moved(rs: list[Any]) -> float:
    first, last = rs[0].scale or 1.0, rs[-1].scale or 1.0
    return abs(math.log(last / first)) if first > 0 and last > 0 else math.inf


def _trajectories(
    ax: Any, key: Any, series: dict[str, list[Any]], labels: dict[str, str], what: str
) -> None:
    """One line per module (scale / first scale); the LEGEND_LINES that moved most named in
    a legend on the ``key`` axes beside it."""
    names = [n for n in series if series[n]]
    named = set(sorted(names, key=lambda n: -_moved(series[n]))[:LEGEND_LINES])
    colours = iter(f"C{i}" for i in range(LEGEND_LINES))
    for name in names:
        rs = series[name]
        first = rs[0].scale or 1.0
        style = {"color": next(colours), "lw": 1.5, "label": labels[name]} if name in named \
            else {"color": "0.75", "lw": 1}  # fmt: skip
        ax.plot([r.step for r in rs], [r.scale / first for r in rs], **style)
    more = len(names) - len(named)
    title = f"{what} scales ({len(names)})" + (f", {more} more in grey" if more else "")
    ax.set_title(title, loc="left")
    ax.set(ylabel="scale / first")
    ax.grid(alpha=0.3)
    key.axis("off")
    if named:
        handles, texts = ax.get_legend_handles_labels()
        key.legend(handles, texts, loc="center left", frameon=False, borderaxespad=0)


def _events(axes: list[Any], events: list[Any]) -> None:
    for ax in axes:
        for event in events:
            ax.axvline(event.step + 0.5, color="tab:red", ls="--", lw=1.2)
    top = axes[0]
    right = max([top.get_xlim()[1]] + [e.step + 1.0 for e in events])  # a mark on the last
    top.set_xlim(right=right)  # step is drawn inside the axes, not on their edge
    taken: list[tuple[float, float, float, float]] = []
    for i, event in enumerate(events):  # each beside its line, where no curve or name is
        x = event.step + 0.5
        width, height = _text_size(top, event.text)
        left = _side(top, x, width, i, len(events))
        span = (x - width, x) if left else (x, x + width)
        y = _free_height(top, span, height, taken)
        taken.append((*span, y - height, y))
        top.annotate(event.text, (x, y), xycoords=("data", "axes fraction"),
                     xytext=(-3 if left else 3, 0), textcoords="offset points", va="top",
                     ha="right" if left else "left", color="tab:red", fontsize=MIN_FONT_PT,
                     bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 1})  # fmt: skip


def _text_size(ax: Any, text: str) -> tuple[float, float]:
    """A mark's name's width (data units of x) and height (axes fraction), estimated from its
    length (at most 0.6 em a character) and the axes' size."""
    box = ax.get_position()
    fig_w, fig_h = ax.figure.get_size_inches()
    lo, hi = ax.get_xlim()
    width_pt, height_pt = box.width * fig_w * 72, box.height * fig_h * 72
    width = (len(text) * 0.6 * MIN_FONT_PT + 8) / max(width_pt, 1.0) * (hi - lo)
    return width, 1.5 * MIN_FONT_PT / max(height_pt, 1.0)


def _side(ax: Any, x: float, width: float, index: int, count: int) -> bool:
    """Whether a mark's name goes left of its line: the first mark's to the left and the last's
    to the right (so two names never sit between their two lines), where there is room."""
    lo, hi = ax.get_xlim()
    room_left, room_right = x - width >= lo, x + width <= hi
    if index == 0 and count > 1 and room_left:
        return True
    if index == count - 1 and room_right:
        return False
    return room_left and (not room_right or x - lo > hi - x)


def _free_height(
    ax: Any, span: tuple[float, float], height: float, taken: list[tuple[float, ...]]
) -> float:
    """The highest top (axes fraction) for a name over ``span`` that no curve passes through
    and no other name covers; where none is free, the one fewest curve points cross."""
    ax.get_ylim()  # settles the autoscaled limits the transform below reads
    to_axes = ax.transData + ax.transAxes.inverted()
    points = [
        to_axes.transform(xy)
        for line in ax.get_lines() if line.get_linestyle() != "--"
        for xy in line.get_xydata() if span[0] - 1 <= xy[0] <= span[1] + 1
    ]  # fmt: skip
    best, fewest = 0.97, math.inf
    y, gap = 0.97, 0.4 * height  # a gap of about half a line between a name and a curve
    while y - height >= 0.02:
        crossing = sum(y - height - gap <= py <= y + gap for _, py in points)
        overlaps = any(a < span[1] and span[0] < b and lo < y and y - height < hi
                       for a, b, lo, hi in taken)  # fmt: skip
        if not crossing and not overlaps:
            return y
        if not overlaps and crossing < fewest:
            best, fewest = y, crossing
        y -= 0.04
    return best


def _heat(fig: Any, ax: Any, series: dict[str, list[Any]], steps: list[int]) -> None:
    column = {s: i for i, s in enumerate(steps)}
    heat = [[float("nan")] * len(steps) for _ in series]
    for row, rs in enumerate(series.values()):
        for r in rs:
            heat[row][column[r.step]] = r.clipped
    extent = (steps[0] - 0.5, steps[-1] + 0.5, len(series) - 0.5, -0.5)
    image = ax.imshow(heat, aspect="auto", interpolation="nearest", cmap="magma_r", extent=extent)
    ax.set(xlabel="step")
    ax.set_title("clipped share (zero gradient)", loc="left")
    fig.colorbar(image, ax=ax, location="bottom", shrink=0.6, aspect=40, pad=0.01)


def qat_figure(monitor: Any) -> Any:
    """A QATMonitor's records, every module named by the tensor it quantizes: weight and
    activation scale trajectories (relative to the first recorded scale), the share each
    clipped at each step (a heat map) and how many steps changed its qparams; marks as lines.

    Raises:
        ConfigError: the monitor has no steps yet.
    """
    import matplotlib

    from qviz.display.figure import new_figure
    from qviz.errors import ConfigError

    records = monitor.records
    if not records:
        raise ConfigError("the QATMonitor has no steps yet: call monitor.step() after each "
                          "optimizer step, then plot")  # fmt: skip
    series = _series(monitor)
    labels = {n: rs[-1].label or n for n, rs in series.items() if rs}
    weights = {n: rs for n, rs in series.items() if rs and rs[0].is_weight}
    acts = {n: rs for n, rs in series.items() if rs and not rs[0].is_weight}
    steps = sorted({r.step for r in records})
    with matplotlib.rc_context(_FONTS):
        fig = new_figure(figsize=(10, 5.2 + 0.26 * len(series)), layout="constrained")
        grid = fig.add_gridspec(3, 2, width_ratios=(2.4, 1),
                                height_ratios=(1, 1, 0.35 + 0.1 * len(series)))  # fmt: skip
        traj = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0])]
        traj[1].sharex(traj[0])
        _trajectories(traj[0], fig.add_subplot(grid[0, 1]), weights, labels, "weight")
        _trajectories(traj[1], fig.add_subplot(grid[1, 1]), acts, labels, "activation")
        clip = fig.add_subplot(grid[2, 0], sharex=traj[0])
        _heat(fig, clip, series, steps)
        clip.set_yticks(range(len(series)), [labels.get(n, n) for n in series])
        count = fig.add_subplot(grid[2, 1], sharey=clip)
        count.barh(range(len(series)), [monitor.changes[n] for n in series], color="tab:blue")
        count.tick_params(axis="y", labelleft=False)
        count.set(xlabel="steps with a change", title=f"changes in {monitor.steps} steps")
        _events([*traj, clip], list(monitor.events))
    return fig
