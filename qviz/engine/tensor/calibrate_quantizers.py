"""calibrate_quantizers: the source document's calibration recipe for a quant_nn model, in one call.

The recipe: put every TensorQuantizer in calibration mode with quantization off, run batches,
load each quantizer's amax with the chosen method, turn quantization back on. This does that
with a progress bar, in eval mode and without gradients, and returns what was chosen as a
table (one record per quantizer). The recipe written out by hand works as well; this is the
short form.

Example:
    >>> import torch
    >>> from qviz.engine import quant_nn
    >>> model = torch.nn.Sequential(quant_nn.QuantLinear(4, 3), torch.nn.ReLU())
    >>> table = calibrate_quantizers(model, [torch.randn(8, 4)], method="max", progress=False)
    >>> [(r.name, r.role, r.method) for r in table]
    [('0._input_quantizer', 'input', 'max'), ('0._weight_quantizer', 'weight', 'max')]
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from qviz.engine.graph.inputs import batches_of, bind_batch, call_model
from qviz.engine.graph.stage import Stage, check_stage
from qviz.engine.pt2e.calibrate import batch_total, check_max_batches, run_calibration
from qviz.engine.tensor.calib import CalibMethod
from qviz.engine.tensor.records import quantizer_role
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import CalibrationError, QvizError


@dataclass(frozen=True, kw_only=True)
class QuantizerAmax:
    """The amax one TensorQuantizer got: its module path, role and method, and the value(s)."""

    name: str
    role: str  # "input" or "weight"
    method: str
    num_bits: int
    axis: tuple[int, ...] | None
    amax: float  # the largest amax (the only one for a per-tensor quantizer)
    amax_min: float  # the smallest (per-channel); equal to amax per tensor
    channels: int
    calibrator: str


class AmaxTable(tuple):
    """The records of :func:`calibrate_quantizers`, printed as a table;
    ``pandas.DataFrame(table)`` gives one row per quantizer."""

    def __repr__(self) -> str:
        lines = [f"{'quantizer':40} {'role':6} {'method':10} {'bits':>4} {'amax':>10}"]
        for r in self:
            amax = f"{r.amax:.5g}" if r.channels == 1 else f"{r.amax_min:.3g}..{r.amax:.3g}"
            lines.append(f"{r.name:40} {r.role:6} {r.method:10} {r.num_bits:>4} {amax:>10}")
        return "\n".join(lines)


def _quantizers(model: nn.Module) -> list[tuple[str, TensorQuantizer]]:
    found = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, TensorQuantizer) and not m._disabled
    ]
    if not found:
        raise CalibrationError(
            f"calibrate_quantizers found no enabled TensorQuantizer in the "
            f"{type(model).__name__}: build the model under quant_modules.enable(), or swap its "
            f"layers with quant_modules.quantize_model(model)"
        )
    return found


def _run(model: nn.Module, batch: Any, index: int) -> None:
    where = f"calibration batch {index}"
    call_model(model, bind_batch(model, batch, where), where)


def _record(name: str, tq: TensorQuantizer, method: CalibMethod) -> QuantizerAmax:
    amax = tq.amax
    return QuantizerAmax(
        name=name, role=quantizer_role(name), method=method.value, num_bits=tq.num_bits,
        axis=tq.axis, amax=float(amax.max()), amax_min=float(amax.min()), channels=amax.numel(),
        calibrator=type(tq.calibrator).__name__,
    )  # fmt: skip


def _collect(model: nn.Module, batches: Iterable, total: int | None, progress: bool) -> int:
    from tqdm.auto import tqdm

    seen = 0
    with torch.no_grad():
        wanted = itertools.islice(batches, total)  # not a break: that leaves a red notebook bar
        for index, batch in enumerate(
            tqdm(wanted, total=total, desc="calibrating", disable=not progress)
        ):
            _run(model, batch, index)
            seen += 1
    return seen


@contextlib.contextmanager
def _calibrating(model: nn.Module, quantizers: list[tuple[str, TensorQuantizer]]) -> Iterator[None]:
    """Eval mode, quantizers collecting with quantization off; everything back afterwards."""
    was_training = model.training
    model.eval()
    for name, tq in quantizers:
        if quantizer_role(name) == "input":  # the document's recipe: activations seen unquantized,
            tq.disable_quant()  # weights quantized as they will be (their max is the same)
        tq.enable_calib()
    try:
        yield
    finally:
        for _, tq in quantizers:
            tq.disable_calib()
            tq.enable_quant()
        model.train(was_training)


def _check_all_saw_data(quantizers: list[tuple[str, TensorQuantizer]]) -> None:
    idle = [name for name, tq in quantizers if tq.calibrator.num_batches == 0]
    if idle:
        raise CalibrationError(
            f"these quantizers saw no data: {idle}; their layers never ran on the calibration "
            f"batches (check the model's forward), or disable them with .disable()"
        )


def calibrate_quantizers(
    model: nn.Module,
    data: Any,
    method: CalibMethod | str = "max",
    *,
    weight_method: CalibMethod | str = "max",
    max_batches: int | None = None,
    progress: bool = True,
    group: Any = None,
    **method_kwargs: Any,
) -> AmaxTable:
    """Calibrate every TensorQuantizer of ``model`` on ``data`` and load the chosen amax.

    Input quantizers use ``method``, weight quantizers ``weight_method``; a quantizer built to
    collect the max only gets a histogram calibrator when its method needs one. As in the
    document's recipe, input quantizers collect with quantization off while weights stay
    quantized, so every layer sees the activations it will see after calibration upstream of
    it only through its weights. The model runs
    in eval mode without gradients and gets its training mode back; the quantizers end in quant
    mode, also when a batch fails.

    Args:
        model: a quant_nn model (holding TensorQuantizers): the one stage it takes.
        data: batches as for :func:`qviz.calibrate` (tensors, (inputs, labels) tuples, dicts;
            a tuple binds to ``forward``'s required parameters, the items after them are the
            labels: :mod:`qviz.engine.graph.inputs`).
        method: ``"max"``, ``"percentile"``, ``"entropy"`` or ``"mse"`` for input quantizers.
        weight_method: the method for weight quantizers.
        max_batches: stop after this many batches.
        progress: show a progress bar (rank 0's only when distributed).
        group: a ``torch.distributed`` process group; when given, or when the default group
            is initialised, each rank collects on its shard of ``data`` (an empty one is fine)
            and the calibrators merge across the ranks before amax is chosen: max and the |x|
            histograms merge exactly, so every method picks on every rank the amax one process
            picks over all the shards (see :mod:`qviz.engine.distributed.sharded`);
            ``group=False``: this process alone.
        **method_kwargs: options of ``method`` (``percentile=99.99``, ``start_bin=``, ...).

    Returns:
        An :class:`AmaxTable`: one :class:`QuantizerAmax` per quantizer.

    Raises:
        ConfigError: not a quant_nn model (checked first), an unknown method, a bad
            ``max_batches`` or ``group``, or a failing batch (named by index).
        CalibrationError: no enabled TensorQuantizer, no batches, or quantizers that saw no
            data (named: their layers never ran). Distributed, whatever one rank raises before
            the merge (a bad argument included) is raised on every rank at once, naming that
            rank (as for :func:`qviz.calibrate`).

    Example:
        >>> import torch, qviz
        >>> from qviz.engine import quant_nn
        >>> model = torch.nn.Sequential(quant_nn.QuantLinear(4, 2), torch.nn.ReLU())
        >>> table = qviz.calibrate_quantizers(model, torch.randn(16, 4), progress=False)
        >>> [row.name for row in table]
        ['0._input_quantizer', '0._weight_quantizer']
        >>> model[0].input_quantizer.amax is not None
        True
    """
    chosen: dict[str, tuple[TensorQuantizer, CalibMethod, dict[str, Any]]] = {}

    def shard(show_progress: bool) -> int:  # the checks inside: a rank's bad argument is shared
        chosen.update(_choose(model, method, weight_method, max_batches, method_kwargs))
        batches = batches_of(data, "calibrate_quantizers")
        quantizers = [(name, tq) for name, (tq, _, _) in chosen.items()]
        with _calibrating(model, quantizers):
            return _collect(model, batches, batch_total(batches, max_batches), show_progress)

    run_calibration(model, shard, progress, group, "calibrate_quantizers")
    _check_all_saw_data([(name, tq) for name, (tq, _, _) in chosen.items()])
    for name, (tq, chosen_method, kwargs) in chosen.items():
        try:
            tq.load_calib_amax(chosen_method, **kwargs)
        except QvizError as exc:
            raise type(exc)(f"{name}: {exc}") from exc
    return AmaxTable(_record(name, tq, m) for name, (tq, m, _) in chosen.items())


def _choose(
    model: nn.Module,
    method: CalibMethod | str,
    weight_method: CalibMethod | str,
    max_batches: int | None,
    method_kwargs: dict[str, Any],
) -> dict[str, tuple[TensorQuantizer, CalibMethod, dict[str, Any]]]:
    """Check the arguments, then set each enabled quantizer's method: by name, the quantizer,
    its method and that method's options."""
    check_stage(model, Stage.QUANT_NN, where="calibrate_quantizers")
    method, weight_method = CalibMethod.parse(method), CalibMethod.parse(weight_method)
    check_max_batches(max_batches)
    chosen = {}
    for name, tq in _quantizers(model):
        mine = weight_method if quantizer_role(name) == "weight" else method
        tq.set_calib_method(mine)
        chosen[name] = (tq, mine, method_kwargs if mine is method else {})
    return chosen
