"""QATMonitor: watch quantization parameters move while a model trains with fake quantization.

The source document's QAT advice ("do not change quantization representation (scale) during
training, at least not too frequently"; small learning rates, since the straight-through
estimator adds variance) becomes measurable: after each optimizer step, ``monitor.step()``
records for every fake-quantize module its scale and zero_point, whether they changed since the
previous step, the share of elements it clipped (where the straight-through gradient is zero)
and the mean ``|x| / scale`` of what it saw (how many steps of the grid the values span).

The statistics of a tensor are taken on an evenly strided copy of at most ``sample`` elements
(8192 by default; None for all) that a forward hook on the fake-quantize module keeps with the
qparams it used; ``step()`` tallies every module's copies at once (:mod:`qviz.numeric.qat.tally`)
and sums them over the forward passes since the last step.
Memory is bounded: past ``max_records`` steps per module, every other record is dropped (the
change counts stay exact).

Each module is named by the tensor it quantizes, from the graph (``record.label``:
``conv2d_1 weight``, ``relu output``; :mod:`qviz.numeric.qat.names`), and ``monitor.mark(text)``
notes a change to the training (a freeze) at the current step, drawn as a line by ``plot()``.

Callbacks watch the training live: ``monitor.add_callback(fn)`` has ``fn(monitor, records)``
called at the end of every ``step()`` with that step's records, one per module (a live view such
as :class:`qviz.widgets.QATDashboard` redraws from them); ``remove_callback(fn)`` stops it.

Example:
    >>> import torch
    >>> from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e
    >>> from torchao.testing.pt2e._xnnpack_quantizer import (XNNPACKQuantizer,
    ...     get_symmetric_quantization_config)
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    >>> gm = torch.export.export(model, (torch.randn(2, 4),)).module()
    >>> prepared = prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config(is_qat=True)))
    >>> monitor = QATMonitor(prepared)
    >>> _ = prepared(torch.randn(2, 4)); monitor.step(loss=0.5)
    >>> [r.changed for r in monitor.records][:1], monitor.records[0].step
    ([True], 1)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from qviz.engine.pt2e.plan import plan_of
from qviz.errors import ConfigError
from qviz.numeric.qat.names import TensorLabel, tensor_labels
from qviz.numeric.qat.tally import Pending, Tally, sample_rows, tally_all

#: samples kept per module between two steps before they are tallied anyway (memory bound)
_MAX_PENDING = 8


@dataclass(frozen=True, kw_only=True)
class QATRecord:
    """One fake-quantize module at one training step."""

    step: int
    name: str  # the module's path in the model
    group: int | None  # its QuantPlan group, when the model has a plan
    per_channel: bool
    scale: float  # per channel: the mean over channels
    scale_min: float
    scale_max: float
    zero_point: float  # per channel: the mean
    changed: bool  # scale or zero_point differ from the previous step
    clipped: float  # share of elements outside the grid (zero gradient), since the last step;
    # nan on a step whose tensors were not tallied (``stats_every``)
    mean_abs_over_scale: float  # mean |x| / scale of those elements (nan likewise)
    loss: float | None = None
    metric: float | None = None
    label: str = ""  # what it quantizes, from the graph: "conv2d_1 weight", "relu output"
    is_weight: bool = False  # computed from constants only (a weight or bias)


@dataclass(frozen=True)
class QATEvent:
    """Something done to the training at a step (:meth:`QATMonitor.mark`): from step
    ``step + 1`` on, e.g. ``observers frozen``."""

    step: int
    text: str


#: What :meth:`QATMonitor.add_callback` takes: ``fn(monitor, records)``.
StepCallback = Callable[["QATMonitor", tuple[QATRecord, ...]], None]


def _is_fake_quantize(module: nn.Module) -> bool:
    return all(hasattr(module, a) for a in ("scale", "zero_point", "quant_min", "quant_max")) and (
        hasattr(module, "activation_post_process")
    )


def _groups(model: nn.Module) -> dict[str, int]:
    groups = getattr(plan_of(model), "groups", ()) or ()
    return {g.observer: g.group for g in groups if getattr(g, "observer", None)}


def _read_all(modules: list[nn.Module]) -> list[tuple[list[float], list[float]]]:
    """Every module's scales and zero_points as Python floats, in one read from the device."""
    scales = [m.scale.detach().reshape(-1) for m in modules]
    zeros = [m.zero_point.detach().reshape(-1) for m in modules]
    device = scales[0].device
    flat = torch.cat([t.to(device, torch.float64) for t in scales + zeros]).tolist()
    out, at = [], 0
    for t in scales:
        out.append([flat[at : at + t.numel()]])
        at += t.numel()
    for entry, t in zip(out, zeros, strict=True):
        entry.append(flat[at : at + t.numel()])
        at += t.numel()
    return [tuple(e) for e in out]


def _number(name: str, value: Any) -> float | None:
    """``value`` (None, a number or a one-element tensor) as a float, or a ConfigError.

    Example:
        >>> _number("loss", torch.tensor(0.25)), _number("metric", None)
        (0.25, None)
    """
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(
        f"QATMonitor.step: {name} must be a number or a one-element tensor, got "
        f"{type(value).__name__} {value!r:.60}; pass the step's {name}, e.g. "
        f"monitor.step(loss=loss.item())"
    )


class QATMonitor:
    """Record every fake-quantize module's scale, changes and clipping at each training step.

    Args:
        model: a model prepared for QAT (``qviz.prepare_qat_pt2e``, or torchao's): its
            fake-quantize modules are found by what they hold (scale, zero_point, quant_min,
            quant_max and an observer), labelled with their QuantPlan group when it has a plan.
        max_records: records kept per module; past it, every other one is dropped.
        stats_every: tally the tensors on every n-th step only (the clipped share and
            mean |x| / scale of the others are nan; scales and changes are read every step),
            for a monitor that costs less: on a digits QAT step the monitor costs about 15 %
            with every step tallied, 9 % with ``stats_every=4``, 2.4 % on a step it does not
            tally (``benchmarks/qat_monitor.py``).
        sample: the clipped share and mean |x| / scale of a tensor are taken on every k-th
            element, at most about this many (per channel: in every channel alike), which
            keeps the monitor's cost a small share of a training step; None takes them all.

    Attributes:
        model: the model it watches (what :class:`qviz.widgets.QATDashboard`'s freeze buttons
            act on).
        modules: the fake-quantize modules, by path.
        labels: what each module quantizes, named from the graph
            (:func:`qviz.numeric.qat.names.tensor_labels`: ``conv2d_1 weight``, ``relu output``);
            every record carries its ``label``.
        events: the :meth:`mark` s so far (the figure draws each as a dashed line).
        changes: per module, the exact number of steps on which its qparams changed.

    Raises:
        ConfigError: the model has no fake-quantize module.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        max_records: int = 2000,
        sample: int | None = 8192,
        stats_every: int = 1,
    ) -> None:
        if not isinstance(stats_every, int) or stats_every < 1:
            raise ConfigError(f"stats_every must be a positive int, got {stats_every!r}")
        self.stats_every = stats_every
        if not isinstance(max_records, int) or max_records < 2:
            raise ConfigError(f"max_records must be an int >= 2, got {max_records!r}")
        if sample is not None and (not isinstance(sample, int) or sample < 1):
            raise ConfigError(f"sample must be a positive int or None, got {sample!r}")
        self.sample = sample
        if not isinstance(model, nn.Module):
            raise ConfigError(
                f"QATMonitor: model must be the module qviz.prepare_qat_pt2e returned, got "
                f"{type(model).__name__} {model!r:.60}; pass the prepared model itself: "
                f"QATMonitor(qviz.prepare_qat_pt2e(exported, quantizer))"
            )
        self.modules = {n: m for n, m in model.named_modules() if _is_fake_quantize(m)}
        if not self.modules:
            raise ConfigError(
                f"QATMonitor found no fake-quantize module in the {type(model).__name__}: "
                f"give it the model qviz.prepare_qat_pt2e returned (a PTQ model has observers, "
                f"which do not train)"
            )
        self.max_records = max_records
        self.model = model
        #: what each module quantizes, named from the graph (``labels[name].label``)
        self.labels: dict[str, TensorLabel] = tensor_labels(model, self.modules)
        self.events: list[QATEvent] = []
        self._group = _groups(model)
        self._tally = {n: Tally() for n in self.modules}
        self._pending: dict[str, list[Pending]] = {}
        self._last: dict[str, tuple | None] = dict.fromkeys(self.modules)
        self._records: dict[str, list[QATRecord]] = {n: [] for n in self.modules}
        self.changes = dict.fromkeys(self.modules, 0)  # exact counts, never thinned
        self.steps = 0
        self._callbacks: list[StepCallback] = []
        self._hooks = [
            hook
            for name, m in self.modules.items()
            for hook in (
                m.register_forward_pre_hook(lambda mod, args, name=name: self._flush(name)),
                m.register_forward_hook(
                    lambda mod, args, out, name=name: self._see(name, mod, args)
                ),
            )
        ]

    def _see(self, name: str, module: nn.Module, args: tuple) -> None:
        """Keep a strided copy of what ``module`` has just fake-quantized (tallied at step)."""
        if self.steps % self.stats_every:  # this step's tensors are not tallied
            return
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return
        scale = module.scale.detach()
        axis = module.ch_axis % x.dim() if scale.numel() > 1 else None
        samples = self._pending.setdefault(name, [])
        if len(samples) >= _MAX_PENDING:  # many forwards without a step: tally what waits
            tally_all(samples, self._tally)
            samples.clear()
        samples.append(
            Pending(
                name=name,
                rows=sample_rows(x, axis, self.sample),
                scale=scale,
                zero_point=module.zero_point.detach(),
                quant_min=int(module.quant_min),
                quant_max=int(module.quant_max),
            )
        )

    def _flush(self, name: str) -> None:
        """Before ``name`` runs again in the same step (its qparams may move), keep a copy of
        the qparams its pending samples used; everything is tallied at :meth:`step`."""
        for pending in self._pending.get(name, ()):
            if not pending.frozen:
                pending.scale, pending.zero_point = (
                    pending.scale.clone(),
                    pending.zero_point.clone(),
                )
                pending.frozen = True

    def step(self, loss: float | torch.Tensor | None = None, metric: float | None = None) -> None:
        """Record the current state of every module; call it after each optimizer step.

        Args:
            loss: the step's loss (a tensor is read with ``float()``).
            metric: any number to plot beside it (an accuracy, a learning rate).
        """
        loss, metric = _number("loss", loss), _number("metric", metric)
        tally_all([p for samples in self._pending.values() for p in samples], self._tally)
        self._pending.clear()
        self.steps += 1
        now = []
        read = _read_all(list(self.modules.values()))
        for name, qparams in zip(self.modules, read, strict=True):
            now.append(self._record(name, qparams, loss, metric))
            self._records[name].append(now[-1])
            if len(self._records[name]) > self.max_records:
                self._records[name] = self._records[name][::2]
        for callback in list(self._callbacks):
            callback(self, tuple(now))

    def add_callback(self, callback: StepCallback) -> StepCallback:
        """Call ``callback(monitor, records)`` at the end of every :meth:`step`.

        ``records`` are the step's :class:`QATRecord` s, one per module in the order of
        :attr:`modules`. A callback runs inside the training loop: keep it short, or throttle
        it (as :class:`qviz.widgets.QATDashboard` does). Adding the same callback twice calls it
        once.

        Returns:
            ``callback``, so it can be used as a decorator.

        Example:
            >>> import torch
            >>> from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e
            >>> from torchao.testing.pt2e._xnnpack_quantizer import (XNNPACKQuantizer,
            ...     get_symmetric_quantization_config)
            >>> gm = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),)).module()
            >>> monitor = QATMonitor(prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(
            ...     get_symmetric_quantization_config(is_qat=True))))
            >>> seen = []
            >>> fn = monitor.add_callback(lambda m, records: seen.append((m.steps, len(records))))
            >>> monitor.step(); monitor.remove_callback(fn); monitor.step()
            >>> seen
            [(1, 3)]
        """
        if not callable(callback):
            raise ConfigError(
                f"add_callback needs a function fn(monitor, records), got {type(callback).__name__}"
            )
        if callback not in self._callbacks:
            self._callbacks.append(callback)
        return callback

    def mark(self, text: str) -> QATEvent:
        """Note that something changed after the current step (the figure draws a line there).

        Example:
            >>> import torch
            >>> from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e
            >>> from torchao.testing.pt2e._xnnpack_quantizer import (XNNPACKQuantizer,
            ...     get_symmetric_quantization_config)
            >>> gm = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),)).module()
            >>> monitor = QATMonitor(prepare_qat_pt2e(gm, XNNPACKQuantizer().set_global(
            ...     get_symmetric_quantization_config(is_qat=True))))
            >>> monitor.step(); monitor.mark("observers frozen")
            QATEvent(step=1, text='observers frozen')
        """
        if not isinstance(text, str) or not text:
            raise ConfigError(f"QATMonitor.mark needs a short text, got {text!r}")
        self.events.append(QATEvent(self.steps, text))
        return self.events[-1]

    def remove_callback(self, callback: StepCallback) -> None:
        """Stop calling ``callback``; one that was never added is ignored."""
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def _record(self, name: str, qparams: tuple, loss, metric) -> QATRecord:
        scales, zeros = qparams
        changed = self._last[name] != qparams  # exact: the floats are the tensors' values
        self.changes[name] += int(changed)
        self._last[name] = qparams
        tally, self._tally[name] = self._tally[name], Tally()
        clipped, over = tally.shares()  # nan: a step whose tensors were not tallied
        return QATRecord(
            step=self.steps, name=name, group=self._group.get(name),
            per_channel=len(scales) > 1, scale=math.fsum(scales) / len(scales),
            scale_min=min(scales), scale_max=max(scales),
            zero_point=math.fsum(zeros) / len(zeros), changed=changed, clipped=clipped,
            mean_abs_over_scale=over, loss=loss, metric=metric,
            label=self.labels[name].label, is_weight=self.labels[name].is_weight,
        )  # fmt: skip

    @property
    def records(self) -> list[QATRecord]:
        """Every kept record, by step then module."""
        return sorted((r for rs in self._records.values() for r in rs), key=lambda r: r.step)

    def __iter__(self) -> Iterator[QATRecord]:
        return iter(self.records)

    @property
    def df(self) -> Any:
        """The records as a pandas DataFrame, one row per module and step."""
        import pandas as pd

        columns = list(QATRecord.__annotations__)
        return pd.DataFrame([asdict(r) for r in self.records], columns=columns)

    def plot(self) -> Any:
        """Scale trajectories, clipping per module over steps and change counts (a Figure)."""
        from qviz.numeric.qat.plot import qat_figure

        return qat_figure(self)

    def close(self) -> None:
        """Remove the hooks (the records stay)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def __enter__(self) -> QATMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        moving = sum(1 for n in self.modules if self.changes[n] > 1)
        return (
            f"QATMonitor({len(self.modules)} fake-quantize modules, {self.steps} steps, "
            f"{moving} changed their scale after the first step)"
        )
