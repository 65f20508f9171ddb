"""``PrecisionExplorer``: pick a mixed-precision assignment from the trade-off the search found.

:func:`qviz.numeric.search_precision` returns a :class:`~qviz.numeric.PrecisionResult`: the
Pareto front of cost against the target's figure, and the full evaluations that confirmed it.
The explorer draws that front as a clickable plot; clicking a point shows its cost, its estimate
and (if it was evaluated) what it measured and whether it meets the target, its per-layer table
(:meth:`PrecisionResult.table <qviz.numeric.PrecisionResult.table>`), and the float graph
coloured by each layer's precision there. "use this" hands back the quantizer that reproduces
the point (:meth:`PrecisionResult.quantizer <qviz.numeric.PrecisionResult.quantizer>`) as
:attr:`PrecisionExplorer.quantizer`.

Every control has a Python equivalent (:meth:`~PrecisionExplorer.select`,
:meth:`~PrecisionExplorer.use`); a point qviz refuses leaves the selection as it was and shows
the message in :attr:`~PrecisionExplorer.error`.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> from qviz.numeric.precision.result import Evaluation, FrontPoint, PrecisionResult
    >>> from qviz.numeric.precision.units import Unit
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(2, 4),))
    >>> front = (FrontPoint(1.0, 30.0, ("w4a8",)), FrontPoint(2.0, 45.0, ("w8a8",)))
    >>> result = PrecisionResult(
    ...     target="output_sqnr", limit=40.0, float_metric=None, cost_unit="KiB",
    ...     units=(Unit("linear", ("linear",), (), (), 8),),
    ...     layers=(("linear", "linear", "",
    ...     "linear"),), reference=("w8a8",), screened=(), front=front,
    ...     evaluations=(Evaluation(point=1, cost=2.0, output_sqnr=45.5, metric=None,
    ...     meets=True),), chosen=1,
    ...     base=XNNPACKQuantizer().set_global(get_symmetric_quantization_config()))
    >>> explorer = PrecisionExplorer(result, gm, graph=False)
    >>> explorer.selected, explorer.select(0).selected
    (1, 0)
    >>> quantizer = explorer.use()
    >>> explorer.point, quantizer is explorer.quantizer
    (0, True)
"""

from __future__ import annotations

import operator
from typing import Any

from qviz.engine.graph.fingerprint import fingerprint
from qviz.engine.graph.stage import Stage, check_stage
from qviz.errors import ConfigError
from qviz.numeric.precision.result import Evaluation, PrecisionResult
from qviz.widgets.kit.view_owner import ViewOwner
from qviz.widgets.precision.view import PrecisionExplorerView, evaluation_of

_WHERE = "PrecisionExplorer"


class PrecisionExplorer(ViewOwner):
    """A search's Pareto front as a clickable plot beside its per-layer table and the float
    graph coloured by precision; "use this" hands back the point's quantizer.

    Args:
        result: what :func:`qviz.numeric.search_precision` returned.
        float_model: the float graph module the search ran on (from :func:`qviz.export`); the
            graph is drawn from it. Another model is refused (its fingerprint differs).
        graph: draw the graph (needs graphviz's ``dot``).

    Attributes:
        result: the search's :class:`~qviz.numeric.PrecisionResult`.
        selected: the front index shown; it opens on the chosen point (when none met the
            target: the last one evaluated, else the most accurate).
        point: the front index last handed back by :meth:`use` (None before).
        quantizer: the quantizer of :attr:`point` (None before :meth:`use`): prepare,
            calibrate and convert the float model with it.
        error: the last refused action's message, or None.
        view: its :class:`~qviz.widgets.precision.view.PrecisionExplorerView`.
        widget: the ipywidgets box (the explorer also renders itself in Jupyter).

    Raises:
        ConfigError: ``result`` is not a PrecisionResult or has no front, ``float_model`` is
            not a float graph module from :func:`qviz.export`, or the search ran on another
            model.

    Example:
        >>> try:
        ...     PrecisionExplorer("result", None)
        ... except ConfigError as exc:
        ...     print(str(exc)[:60])
        PrecisionExplorer takes what qviz.numeric.search_precision r
    """

    def __init__(self, result: PrecisionResult, float_model: Any, *, graph: bool = True) -> None:
        if not isinstance(result, PrecisionResult):
            raise ConfigError(
                f"{_WHERE} takes what qviz.numeric.search_precision returns (a PrecisionResult), "
                f"got {type(result).__name__}"
            )
        if not result.front:
            raise ConfigError(f"{_WHERE}: the search's Pareto front is empty; nothing to pick")
        check_stage(float_model, Stage.FLOAT, where=_WHERE, arg="float_model", exported=True)
        _check_model(result, float_model)
        self.result, self.float_model = result, float_model
        self.selected: int = _opening_point(result)
        self.point: int | None = None
        self.quantizer: Any = None
        self.error: str | None = None
        self.view = PrecisionExplorerView(self, with_graph=graph)
        self.view.refresh()

    def select(self, point: int) -> PrecisionExplorer:
        """Show front point ``point`` (an index of ``result.front``; negative counts from the
        end): the plot rings it, the table and graph show its precisions.

        Example:
            >>> from qviz.numeric.precision.result import FrontPoint, PrecisionResult
            >>> import torch, qviz
            >>> r = PrecisionResult(target="output_sqnr", limit=40.0, float_metric=None,
            ...     cost_unit="KiB", units=(), layers=(), reference=(), screened=(),
            ...     front=(FrontPoint(1.0, 30.0, ()), FrontPoint(2.0, 45.0,
            ...     ())), evaluations=(), chosen=None)
            >>> ex = PrecisionExplorer(r, qviz.export(torch.nn.ReLU(), (torch.randn(2),)),
            ...                        graph=False)
            >>> ex.select(-2).selected, ex.select(7).selected, ex.error
            (0, 0, 'point=7: the front has 2 points')
        """

        def action() -> None:
            self.selected = self._index(point)

        return self._guard(action)

    def use(self, point: int | None = None) -> Any:
        """Hand back the quantizer of front point ``point`` (default: the one shown), as "use
        this" does: it becomes :attr:`quantizer`, and :attr:`point` that index.

        Raises:
            ConfigError: ``point`` is not an index of the front.

        Example:
            >>> from qviz.numeric.precision.result import FrontPoint, PrecisionResult
            >>> import torch, qviz
            >>> r = PrecisionResult(target="output_sqnr", limit=40.0, float_metric=None,
            ...     cost_unit="KiB", units=(), layers=(), reference=(), screened=(),
            ...     front=(FrontPoint(1.0, 30.0, ()),), evaluations=(), chosen=None)
            >>> ex = PrecisionExplorer(r, qviz.export(torch.nn.ReLU(), (torch.randn(2),)),
            ...                        graph=False)
            >>> type(ex.use()).__name__, ex.point
            ('OverrideQuantizer', 0)
        """
        index = self.selected if point is None else self._index(point)
        quantizer = self.result.quantizer(index)
        self.selected, self.point, self.quantizer, self.error = index, index, quantizer, None
        self.view.refresh()
        return quantizer

    @property
    def evaluation(self) -> Evaluation | None:
        """The full evaluation of the point shown (None: it was only estimated).

        Example:
            >>> from qviz.numeric.precision.result import Evaluation, FrontPoint, PrecisionResult
            >>> import torch, qviz
            >>> r = PrecisionResult(target="output_sqnr", limit=40.0, float_metric=None,
            ...     cost_unit="KiB", units=(), layers=(), reference=(), screened=(),
            ...     front=(FrontPoint(1.0, 30.0, ()), FrontPoint(2.0, 45.0, ())),
            ...     evaluations=(Evaluation(point=1, cost=2.0, output_sqnr=44.0, metric=None,
            ...     meets=True),), chosen=1)
            >>> ex = PrecisionExplorer(r, qviz.export(torch.nn.ReLU(), (torch.randn(2),)),
            ...                        graph=False)
            >>> ex.evaluation.output_sqnr, ex.select(0).evaluation
            (44.0, None)
        """
        return evaluation_of(self.result, self.selected)

    def table(self) -> Any:
        """The per-layer table of the point shown (``result.table(selected)``): a DataFrame.

        Example:
            >>> from qviz.numeric.precision.result import FrontPoint, PrecisionResult
            >>> import torch, qviz
            >>> r = PrecisionResult(target="output_sqnr", limit=40.0, float_metric=None,
            ...     cost_unit="KiB", units=(), layers=(), reference=(), screened=(),
            ...     front=(FrontPoint(1.0, 30.0, ()),), evaluations=(), chosen=None)
            >>> ex = PrecisionExplorer(r, qviz.export(torch.nn.ReLU(), (torch.randn(2),)),
            ...                        graph=False)
            >>> len(ex.table())   # a result built by hand has no layers
            0
        """
        return self.result.table(self.selected)

    def _index(self, point: Any) -> int:
        try:
            index = operator.index(point)
        except TypeError:
            raise ConfigError(f"point={point!r}: give an index of result.front") from None
        self.result._point(index)  # the range check
        return index % len(self.result.front)

    def __repr__(self) -> str:
        used = "" if self.point is None else f", using point {self.point}"
        return f"PrecisionExplorer({len(self.result.front)} points, point {self.selected}{used})"


def _opening_point(result: PrecisionResult) -> int:
    """The chosen point; without one, the last evaluated; else the best estimate."""
    if result.chosen is not None:
        return result.chosen
    evaluated = [e.point for e in result.evaluations if e.point is not None]
    if evaluated:
        return evaluated[-1]
    return max(range(len(result.front)), key=lambda i: result.front[i].estimate)


def _check_model(result: PrecisionResult, float_model: Any) -> None:
    """Refuse ``float_model`` unless the search ran on it (house rule 14). A result without
    a fingerprint (built by hand) is taken as it is."""
    searched = result.float_fingerprint
    this = fingerprint(float_model)
    if searched is None or this == searched:
        return
    raise ConfigError(
        f"{_WHERE}: the search ran on another model than float_model: "
        f"{searched.difference(this) or f'{searched} against {this}'}; pass the float graph "
        f"module that search_precision(gm, ...) was given, or search this model with "
        f"search_precision"
    )
