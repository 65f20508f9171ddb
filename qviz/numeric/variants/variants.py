"""Variants of one exported model, each quantized and scored against the same float outputs:
what :func:`~qviz.numeric.sensitivity` and :func:`~qviz.numeric.search_precision` build by
the dozen.

* :class:`VariantScorer` keeps the float model's outputs on the evaluation data once, and scores
  a quantized variant by its output SQNR and the user's metric over every rank of a process
  group (one exchange per score, so every rank sees the same figures). A converted variant runs
  as its exact simulation (:func:`~qviz.engine.pt2e.simulation.simulated`: its outputs bit for
  bit, at about the cost of a float forward). A figure that is not a number
  (:mod:`qviz.numeric.measure.totals`) is refused with a MeasurementError naming the variant,
  never ranked or searched on.
* :func:`quantize_variant` prepares a variant, fills its observers from an
  :class:`~qviz.engine.pt2e.observer_reuse.ObserverReuse` where each has a calibrated twin
  (the same statistics without a pass) or calibrates it, and converts it:
  :func:`prepare_variant` stops before the convert, for callers that keep the prepared model.
* :func:`variant_batches` is the evaluation / calibration data of every entry point that builds
  variants (``calibration_data`` checked, or ``data`` when it is None).

Every variant built in qviz is built here: sensitivity, compare_configs, search_precision,
RepairSession, the numeric dashboard's fallbacks, the ``qviz`` command and
:func:`qviz.data.quantize_digits`.

Example:
    >>> import torch, qviz
    >>> from qviz.engine import distributed
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> data = [torch.randn(8, 4)]
    >>> scorer = VariantScorer(gm, data, None, "example", distributed.Shard(0, 1, False))
    >>> sqnr, metric = scorer.score(quantize_variant(gm, q, data))
    >>> sqnr > 30, metric
    (True, None)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule

from qviz.engine import distributed
from qviz.engine.graph.inputs import bind_batch, call_model, measured_batches
from qviz.engine.graph.memo import ContentMemo
from qviz.engine.pt2e.observer_reuse import ObserverReuse, held_out
from qviz.engine.pt2e.simulation import simulated
from qviz.errors import ConfigError
from qviz.numeric.measure.batches import batch_size, metric_value
from qviz.numeric.measure.totals import OutputTotals, check_figures


class VariantScorer:
    """The float model's outputs on the data, kept (outputs only), and quantized models scored
    (over every rank of ``shard``'s group, one exchange per score).

    Args:
        float_gm: the float graph module the variants are built from.
        data: this rank's evaluation batches (already checked).
        metric: ``metric(float_out, quant_out, target) -> float`` or None.
        where: the public function's name, for messages.
        shard: this rank's place (:class:`qviz.engine.distributed.Shard`).

    Example:
        >>> import torch, qviz
        >>> from qviz.engine import distributed
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
        >>> alone = distributed.Shard(0, 1, False)  # this process alone
        >>> s = VariantScorer(gm, [torch.randn(8, 4)], None, "example", alone)
        >>> len(s.float_outputs)
        1
    """

    def __init__(
        self,
        float_gm: GraphModule,
        data: Any,
        metric: Callable | None,
        where: str,
        shard: distributed.Shard,
    ) -> None:
        self.group, self.where = shard.group, where
        names = [f"{where}: batch {i}" for i in range(len(data))]
        self.batches = [(n, bind_batch(float_gm, b, n)) for n, b in zip(names, data, strict=True)]
        if not self.batches and not shard.distributed:
            raise ConfigError(f"{where}: the data has no batches")
        self.metric = metric
        with torch.no_grad():
            self.float_outputs = [call_model(float_gm, b, n) for n, b in self.batches]
        self.float_metric: float | None = None
        #: the dequantized weights of the variants scored so far, by their exact integers and
        #: qparams: a weight no variant changed is dequantized once per scorer
        self._weights = ContentMemo(size=4096)

    def score_float(self) -> None:
        """The float model's own metric, over every rank (a collective: after the setup).

        Raises:
            MeasurementError: the metric is not a finite number.
        """
        if self.metric is not None:
            totals = self._merged(lambda: self._sums(None))
            where = f"{self.where}: the float model"
            self.float_metric = check_figures(math.inf, None, totals.metric_value, where)[1]

    def _sums(self, model: Any) -> OutputTotals:
        """This process's output statistics, metric sum and sample count (``model`` None: the
        float model against itself)."""
        totals = OutputTotals.for_metric(self.metric)
        if isinstance(model, GraphModule):  # the converted model's outputs, bit for bit, faster
            model = simulated(model, constants=self._weights)
        with torch.no_grad():
            for (name, bound), ref in zip(self.batches, self.float_outputs, strict=True):
                out = ref if model is None else call_model(model, bound, name)
                value = metric_value(self.metric, ref, out, bound.target, name)
                totals.add(ref, out, batch_size(bound.args), value, name)
        return totals

    def _merged(self, local: Callable[[], OutputTotals]) -> OutputTotals:
        """``local``'s sums, over every rank when distributed."""
        out = distributed.sharded(lambda shard: local(), self.group, self.where)
        totals = out.result
        if out.shard.distributed:
            totals = OutputTotals.for_metric(self.metric)
            for part in out.shared:  # every rank's, in rank order
                totals.merge(part)
        return totals

    def score(self, model: Any, label: str = "a quantized variant") -> tuple[float, float | None]:
        """(output SQNR in dB, the metric averaged over samples or None), over every rank.

        Args:
            model: the quantized variant.
            label: what it is, for a message (``"the fully quantized model"``).

        Raises:
            MeasurementError: a figure that is not a number (NaN; an infinite SQNR that no
                exact match explains), naming ``label``, why, and the fix.
        """
        return self._merged(lambda: self._sums(model)).checked(f"{self.where}: {label}")


def variant_batches(
    data: Any, calibration_data: Any, model: Any, where: str, *, allow_empty: bool = False
) -> tuple[list[Any], list[Any]]:
    """THE batches of an entry point that builds variants: ``(evaluation, calibration)``.

    ``data`` is measured (:func:`~qviz.engine.graph.inputs.measured_batches`: finite, and at
    least one unless ``allow_empty``); ``calibration_data`` is checked the same way and is what
    variants calibrate on, or ``data`` itself when it is None. Every batch of both is bound to
    ``model`` first (when given), so a batch that does not fit stops the entry point, named,
    before anything runs.

    Args:
        data: the evaluation batches.
        calibration_data: the calibration batches, or None to calibrate on ``data``.
        model: the model the batches must bind to (the float graph), or None.
        where: the entry point, for messages (``"sensitivity"``).
        allow_empty: no batch is fine (a rank's shard, when the entry point checks that some
            rank had data).

    Raises:
        CalibrationError: no batch, or a non-finite value (named by batch and tensor).
        ConfigError: a batch that does not bind to ``model`` (named).

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(4, 2)
        >>> evaluation, calibration = variant_batches([torch.randn(8, 4)], None, model, "demo")
        >>> calibration is evaluation
        True
        >>> nan = torch.full((8, 4), float("nan"))
        >>> variant_batches([torch.randn(8, 4)], [nan], model, "demo")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        qviz.errors.CalibrationError: demo(calibration_data=...): batch 0: batch holds 32 non-fin...
    """
    # "{where}: batch i" for the data, as compare and evaluate name theirs; the calibration
    # batches as "{where}(calibration_data=...): batch i"
    batches = _bound(measured_batches(data, where, allow_empty=allow_empty), model, where)
    if calibration_data is None:
        return batches, batches
    where = f"{where}(calibration_data=...)"
    return batches, _bound(measured_batches(calibration_data, where, allow_empty=allow_empty),
                           model, where)  # fmt: skip


def _bound(batches: list[Any], model: Any, where: str) -> list[Any]:
    """``batches``, each checked to bind to ``model`` first (named ``"{where}: batch i"``)."""
    if model is not None:
        for index, batch in enumerate(batches):
            bind_batch(model, batch, f"{where}: batch {index}")
    return batches


def prepare_variant(
    gm: GraphModule,
    quantizer: Any,
    calibration: Any,
    group: Any = False,
    reuse: ObserverReuse | None = None,
    where: str = "sensitivity",
    *,
    progress: bool = False,
) -> GraphModule:
    """Prepare (every rank's prepare exchanged first: one that fails is named on every rank)
    and calibrate over every rank, taking ``reuse``'s copies for the observers that have a
    twin (the same statistics, without seeing the data): when every observer has one there is
    no pass; otherwise one pass in which only the others see the data. A variant calibrated is
    added to ``reuse``, for the variants after it.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer
        >>> from qviz.engine.quantizers import get_symmetric_quantization_config as config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
        >>> q, data = XNNPACKQuantizer().set_global(config()), [torch.randn(8, 4)]
        >>> reuse = ObserverReuse()
        >>> first = prepare_variant(gm, q, data, reuse=reuse)  # calibrated, added to reuse
        >>> second = prepare_variant(gm, q, data, reuse=reuse)  # copies: no pass
        >>> len(reuse)
        3
    """
    import qviz

    def prepare(shard: distributed.Shard) -> GraphModule:
        return qviz.prepare_pt2e(gm, quantizer)

    prepared = distributed.sharded(prepare, group, where, share=lambda _: None).result
    if reuse is None:
        qviz.calibrate(prepared, calibration, progress=progress, group=group)
        return prepared
    filling = reuse.fill_known(prepared)
    if filling.left:  # a group whose membership changed: only its observers see the data
        reuse.add(prepared)  # before calibrating: its observers' starting state
        with held_out(prepared, filling.copied):
            qviz.calibrate(prepared, calibration, progress=progress, group=group)
    return prepared


def quantize_variant(
    gm: GraphModule,
    quantizer: Any,
    calibration: Any,
    group: Any = False,
    reuse: ObserverReuse | None = None,
    where: str = "sensitivity",
    *,
    progress: bool = False,
) -> GraphModule:
    """:func:`prepare_variant`, then convert (in place: the prepared model is the variant's own;
    ``reuse`` holds its observers, not the model).

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer
        >>> from qviz.engine.quantizers import get_symmetric_quantization_config as config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
        >>> q = XNNPACKQuantizer().set_global(config())
        >>> quantize_variant(gm, q, [torch.randn(8, 4)]).plan is not None
        True
    """
    import qviz

    prepared = prepare_variant(gm, quantizer, calibration, group, reuse, where, progress=progress)
    return qviz.convert_pt2e(prepared, inplace=True)  # nobody else holds this prepared model


def quantized_ops(prepared_plan: Any, gm: GraphModule) -> list[str]:
    """The operators of ``gm`` that ``prepared_plan`` observes a tensor of, in plan order.

    Example:
        >>> import torch, qviz
        >>> from qviz.engine.quantizers import XNNPACKQuantizer
        >>> from qviz.engine.quantizers import get_symmetric_quantization_config as config
        >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
        >>> quantized_ops(qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config())).plan, gm)
        ['linear']
    """
    names: dict[str, None] = {}
    for record in prepared_plan.tensors:
        ref = record.tensor
        names[ref.consumer if ref.consumer is not None else ref.producer] = None
    ops = {n.name for n in gm.graph.nodes if n.op == "call_function"}
    return [n for n in names if n in ops]
