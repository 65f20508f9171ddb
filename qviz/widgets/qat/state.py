"""``QATDashboard``: watch quantization-aware training live, from inside the training loop.

A :class:`~qviz.numeric.QATMonitor` records every fake-quantize module at each
``monitor.step()``; the dashboard registers a callback on it
(:meth:`~qviz.numeric.QATMonitor.add_callback`) and redraws from those records while the cell
is still running: the current step, loss and metric, a table of the modules (current scale,
changes so far, the clipped share with a bar) and the monitor's figure (scale trajectories,
clipped heat map, change counts), every module named by the tensor it quantizes
(``conv2d_1 weight``, ``relu output``).

Two buttons act on the live model: **freeze observers** (every fake-quantize module stops
updating its statistics, so the scales stop moving) and **freeze BatchNorm statistics**
(:func:`qviz.freeze_bn_stats`). Each is a toggle (a second click undoes it), takes effect at the
next training step, is noted on the monitor (:meth:`~qviz.numeric.QATMonitor.mark`: a dashed line
in the figure) and in the status line. :meth:`QATDashboard.freeze_observers` and
:meth:`QATDashboard.freeze_bn_stats` do the same from code. Jupyter handles a click when the
kernel is free: click between two training cells (a click during a running cell is applied when
the cell ends).

Drawing costs time the training does not have, so it is throttled twice: at most once every
``every`` steps, and only when the training has run long enough since the last redraw, at
least ``min_interval_s`` and at least as long as the last redraw took times
``(1 - max_share) / max_share``. Rendering therefore takes at most about ``max_share`` of the
wall time (20 % by default). Measured with ``benchmarks/qat_dashboard.py`` on a shared 2-core
CPU (busy, load about 6): a digits QAT step (batch 64, 14 fake-quantize modules) took 0.1 s, a
redraw of the named figure 0.46 s (almost all of it the figure; text and table alone well under a
millisecond), and with ``every=10, min_interval_s=0.5`` the redraws took 15.5 % of a 100-step
loop. A step skipped by the throttle
is shown by the next redraw; call :meth:`QATDashboard.refresh` after the loop to show the last
step.

Example:
    >>> import torch
    >>> from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e
    >>> from torchao.testing.pt2e._xnnpack_quantizer import (XNNPACKQuantizer,
    ...     get_symmetric_quantization_config)
    >>> from qviz.numeric import QATMonitor
    >>> gm = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),)).module()
    >>> model = prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config(is_qat=True)))
    >>> monitor = QATMonitor(model)
    >>> dash = QATDashboard(monitor, every=2, min_interval_s=0, max_share=1, figure=False)
    >>> for _ in range(5):
    ...     _ = model(torch.randn(2, 4)); monitor.step(loss=1.0)
    >>> dash.shown_step, dash.refresh().shown_step
    (4, 5)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from qviz.errors import ConfigError
from qviz.widgets.kit.view_owner import ViewOwner
from qviz.widgets.qat.view import QATDashboardView


class QATDashboard(ViewOwner):
    """A live view of a :class:`~qviz.numeric.QATMonitor` that redraws during training.

    Creating it attaches it to the monitor: each ``monitor.step()`` may redraw it (see the
    throttle in the module docstring). Display it in a cell before the training loop runs.

    Args:
        monitor: the QATMonitor of the model being trained.
        every: redraw at most once every ``every`` steps.
        min_interval_s: and at most once every ``min_interval_s`` seconds of wall time.
        max_share: the largest share of the wall time redraws may take (0 < share <= 1).
        figure: draw the monitor's figure (the costly part); False keeps the text and table.
        clock: the time source, in seconds (tests pass a fake one).
        model: the model the freeze buttons act on; by default the monitor's
            (``monitor.model``, the model it was created on).

    Attributes:
        monitor: the monitor it shows.
        shown_step: the step the view shows.
        renders: how many times it has been drawn (the first when created).
        last_render_s: seconds the last redraw took; ``render_s``: all of them together.
        view: its :class:`~qviz.widgets.qat.view.QATDashboardView` (the ipywidgets).
        widget: the ipywidgets box (the dashboard also renders itself in Jupyter).
        observers_frozen, bn_frozen: whether the observers / BatchNorm statistics are frozen.
        note: the last freeze's outcome, as the status line shows it.

    Raises:
        ConfigError: ``monitor`` is not a QATMonitor, ``model`` is not a module, or a
            throttle setting is out of range.

    Example:
        >>> try:
        ...     QATDashboard(object())
        ... except ConfigError as exc:
        ...     print(str(exc)[:49])
        QATDashboard needs a qviz.numeric.QATMonitor (mon
    """

    def __init__(
        self,
        monitor: Any,
        *,
        every: int = 10,
        min_interval_s: float = 0.5,
        max_share: float = 0.2,
        figure: bool = True,
        clock: Callable[[], float] = time.monotonic,
        model: Any = None,
    ) -> None:
        from qviz.numeric.qat.monitor import QATMonitor

        if not isinstance(monitor, QATMonitor):
            raise ConfigError(
                f"QATDashboard needs a qviz.numeric.QATMonitor (monitor = QATMonitor(model) on "
                f"the QAT-prepared model), got {type(monitor).__name__}"
            )
        _check(every, "every", "an int >= 1", isinstance(every, int) and every >= 1)
        ok = isinstance(min_interval_s, int | float) and min_interval_s >= 0
        _check(min_interval_s, "min_interval_s", "a number of seconds >= 0", ok)
        ok = isinstance(max_share, int | float) and 0 < max_share <= 1
        _check(max_share, "max_share", "a share in (0, 1]", ok)
        self.monitor = monitor
        self.model = _model(monitor, model)
        self.observers_frozen = all(not _observing(m) for m in monitor.modules.values())
        self.bn_frozen = _bn_frozen(self.model)
        self.note = ""
        self.every, self.min_interval_s, self.max_share = every, float(min_interval_s), max_share
        self.figure, self._clock = bool(figure), clock
        self.shown_step, self.renders = 0, 0
        self.last_render_s, self.render_s = 0.0, 0.0
        self._opened = clock()
        self._next = -math.inf  # the earliest time of the next throttled redraw
        self._latest = _latest_records(monitor)
        self.view = QATDashboardView(self)
        self.refresh()
        monitor.add_callback(self._on_step)

    # -- training loop side --------------------------------------------------------------------
    def _on_step(self, monitor: Any, records: tuple[Any, ...]) -> None:
        self._latest = records
        if self.due():
            self.refresh()

    def due(self) -> bool:
        """Whether the next ``monitor.step()`` redraws: ``every`` steps and enough time passed."""
        return self.monitor.steps - self.shown_step >= self.every and self._clock() >= self._next

    def refresh(self) -> QATDashboard:
        """Redraw now, whatever the throttle says (e.g. after the loop, to show the last step)."""
        start = time.perf_counter()
        self.view.refresh()
        cost = time.perf_counter() - start
        self.renders += 1
        self.shown_step = self.monitor.steps
        self.last_render_s, self.render_s = cost, self.render_s + cost
        wait = max(self.min_interval_s, cost * (1 - self.max_share) / self.max_share)
        self._next = self._clock() + wait
        return self

    # -- controls ------------------------------------------------------------------------------
    def freeze_observers(self, frozen: bool = True) -> QATDashboard:
        """Stop (``frozen=False``: restart) every fake-quantize module's observer: from the next
        training step on, the scales and zero_points stay as they are. The button's twin.

        Example:
            >>> dash = QATDashboard(_example_monitor(), figure=False)
            >>> dash.freeze_observers().observers_frozen, dash.monitor.events[-1].text
            (True, 'observers frozen')
        """
        for module in self.monitor.modules.values():
            _switch(module, not frozen)
        self.observers_frozen = bool(frozen)
        self._noted("observers frozen" if frozen else "observers running again")
        return self

    def freeze_bn_stats(self, frozen: bool = True) -> QATDashboard:
        """Freeze the BatchNorm statistics with :func:`qviz.freeze_bn_stats` (``frozen=False``:
        :func:`qviz.update_bn_stats`): from the next training step on, the BatchNorms normalize
        with their running statistics and stop updating them. The button's twin.

        Raises:
            ConfigError: the model has no BatchNorm whose statistics can update.

        Example:
            >>> dash = QATDashboard(_example_monitor(), figure=False)
            >>> dash.freeze_bn_stats().bn_frozen, dash.note
            (True, 'BatchNorm statistics frozen after step 1')
        """
        import qviz

        (qviz.freeze_bn_stats if frozen else qviz.update_bn_stats)(self.model)
        self.bn_frozen = bool(frozen)
        self._noted("BatchNorm statistics frozen" if frozen else "BatchNorm statistics updating")
        return self

    def _noted(self, text: str) -> None:
        event = self.monitor.mark(text)
        self.note = f"{text} after step {event.step}"
        self.refresh()

    def close(self) -> None:
        """Detach from the monitor: later steps no longer redraw (the view stays)."""
        self.monitor.remove_callback(self._on_step)

    @property
    def records(self) -> tuple[Any, ...]:
        """The latest step's records, one per module (empty before the first step)."""
        return self._latest

    @property
    def render_share(self) -> float:
        """The share of the wall time since the dashboard was created spent redrawing it."""
        elapsed = self._clock() - self._opened
        return self.render_s / elapsed if elapsed > 0 else 0.0

    def __repr__(self) -> str:
        return (
            f"QATDashboard({len(self.monitor.modules)} modules, step {self.monitor.steps}, "
            f"shown step {self.shown_step}, {self.renders} renders, every={self.every}, "
            f"min_interval_s={self.min_interval_s})"
        )


def _check(value: Any, name: str, wanted: str, ok: bool) -> None:
    if not ok:
        raise ConfigError(f"QATDashboard: {name} must be {wanted}, got {value!r}")


def _model(monitor: Any, model: Any) -> Any:
    from torch import nn

    model = monitor.model if model is None else model
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"QATDashboard: model must be the QAT-prepared model the monitor watches, got "
            f"{type(model).__name__}; leave it out to use monitor.model"
        )
    return model


def _observing(module: Any) -> bool:
    flag = getattr(module, "observer_enabled", None)
    return flag is None or bool(flag.reshape(-1)[0])


def _switch(module: Any, observing: bool) -> None:
    """Start or stop one fake-quantize module's observer (qviz's, torchao's and torch.ao's)."""
    if observing:
        module.enable_observer()
    else:
        module.disable_observer()


def _bn_frozen(model: Any) -> bool:
    from qviz.engine.graph.train_eval import BN_FROZEN

    graph = getattr(model, "graph", None)
    return any(BN_FROZEN in n.meta for n in getattr(graph, "nodes", ()))


def _example_monitor() -> Any:
    """A QATMonitor on a one-layer model trained one step (for the examples)."""
    import torch

    import qviz
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    from qviz.numeric import QATMonitor

    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2)).train()
    gm = qviz.export(model, (torch.randn(2, 4),))
    q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_qat=True))
    monitor = QATMonitor(qviz.prepare_qat_pt2e(gm, q))
    monitor.model(torch.randn(2, 4))
    monitor.step()
    return monitor


def _latest_records(monitor: Any) -> tuple[Any, ...]:
    """The records of the monitor's last step, in module order (for a monitor already trained)."""
    if not monitor.steps:
        return ()
    last = {r.name: r for r in monitor.records if r.step == monitor.steps}
    return tuple(last[n] for n in monitor.modules if n in last)
