"""THE sharded path: run locally, exchange every rank's outcome, merge.

Every collective entry point (``qviz.calibrate``, ``qviz.calibrate_quantizers``,
``qviz.numeric.compare`` for both kinds of model, ``qviz.numeric.sensitivity``) runs its work
through :func:`sharded`:

1. ``group`` is resolved first (None: the default group when one is initialised, else this
   process alone; False: alone; a ``ProcessGroup``); anything else is a ConfigError naming the
   argument and the fix, exchanged on the default group when there is one;
2. the entry point's work runs on this rank's shard inside a ``try``, its argument checks first,
   so a bad argument, a bad batch or a model at the wrong stage is an outcome like any other;
3. one ``all_gather_object`` exchanges every rank's outcome: the entry point's name, its error
   or the part of its result it shares;
4. a failure anywhere, or ranks in different entry points, raises the same QvizError on every
   rank, naming each failing rank and its error: no rank waits for a collective that a failed
   rank never joins. Otherwise every rank gets every rank's shared part for its merge.

Calibration merges observer and calibrator state (:func:`calibrate_sharded`): the exchange
carries the model's observers and a digest of its QuantPlan (a model that differs between ranks
is named), the channel counts (a rank whose shard never reached a per-channel observer still
merges) and the batch count (an empty shard is fine; no data anywhere is an error); then round 1
reduces ranges, amaxes, counts and weighted averages, round 2 the histograms re-binned onto the
agreed ranges (:mod:`qviz.engine.distributed.merge_rules` says how each kind of state merges).
The contributions of all observers are packed into one flat tensor per reduction and dtype: at
most three ``all_reduce`` calls per round, however many observers the model has.

Only torch.distributed is used: gloo on CPU, NCCL on GPUs (the packed tensors go to the current
CUDA device there). A rank that never joins an exchange (``group=False`` on that rank only, or
one call more or fewer than the others) cannot report; the others stop when the backend gives
up on it: at once when it exits or destroys its process group, at the process group's timeout
(``torch.distributed.init_process_group(..., timeout=...)``) when it goes on with other work.
Then every waiting rank raises a ConfigError naming that rank and what it last did (each rank
counts its exchanges in the group's store, read back within seconds:
:mod:`qviz.engine.distributed.call_log`); a rank that crashed is a CalibrationError.

What every rank holds after the merge, per kind of state (the guarantee; measured on the
digits model, 6 batches of 16 split 4 + 2 or 5 + 0 + 1 between ranks, no anchor batch, the
converted outputs on all 96 images, ``tests/engine/distributed``):

* **bit for bit one process over all the batches**: min / max (MinMaxObserver,
  PerChannelMinMaxObserver), OrderFreeHistogramObserver (its histogram over power-of-two ranges
  is the same for any batch order and any sharding, and so are its qparams: difference 0), the
  |x| histograms of HistogramCalibrator (right-closed bins over power-of-two ranges: growing a
  range merges bins exactly, a value on the top edge included) and every amax method on them,
  MaxCalibrator;
* **within one process's batch-order spread**: torch's HistogramObserver grows its range with
  a lossy re-binning, so even one process's histogram depends on the order of its batches; the
  merge re-bins each rank's histogram onto the global range with that same re-binning. It
  equals one process exactly when no re-binning is needed (each rank's range is the global one,
  e.g. every rank's first batch covers it), and otherwise differs from one process by no more
  than one process differs from itself over batch orders (digits: 0.0617 on 2 and 3 ranks,
  against 0.1234 between five batch orders of one process);
* **by a documented rule**: moving averages (MovingAverageMinMaxObserver and its per-channel
  twin, the observers of fake-quantize modules), whose single-process value depends on the
  batch order, merge as the batch-count weighted mean of the ranks' averages
  (:class:`~qviz.engine.distributed.merge_rules.MovingAverageRule`): every rank holds the same,
  and a rank that alone saw data gives its own average.

In every case all ranks hold the same state, so ``convert_pt2e`` gives the same model on any.

Example (one process; under ``torchrun`` every rank runs the same lines on its own shard):
    >>> import os, socket, torch, torch.distributed as dist, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> with socket.socket() as s:
    ...     s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    >>> os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    >>> dist.init_process_group("gloo", rank=0, world_size=1)
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> _ = qviz.calibrate(prepared, [torch.randn(8, 4)], progress=False)  # merges
    >>> prepared.activation_post_process_0.num_batches
    1
    >>> sharded(lambda shard: shard.rank + 10, None, "example").shared
    (10,)
    >>> dist.destroy_process_group()
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch import nn

import qviz.errors as errors  # the classes by name: a failing rank's, re-raised here
from qviz.engine.distributed.call_log import count_call, exchange_failed, note_alone
from qviz.engine.distributed.merge_rules import Contributions, Rule, Shape, rule_for
from qviz.engine.graph.fingerprint import digest
from qviz.engine.observers.fake_quantize import FakeQuantize
from qviz.engine.pt2e.plan import plan_of
from qviz.errors import CalibrationError, ConfigError, QvizError

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """Where an entry point's work runs: this process's rank, the group's size and the group
    (``False``: this process alone, rank 0 of 1)."""

    rank: int
    size: int
    group: Any

    @property
    def distributed(self) -> bool:
        """Whether the outcome is exchanged with other ranks (a one-rank group included)."""
        return self.group is not False


_ALONE = Shard(0, 1, False)


@dataclass(frozen=True)
class Outcomes(Generic[T]):
    """What :func:`sharded` returns: where the work ran, this rank's result (the very object
    its work returned) and every rank's shared part, in rank order (this rank's is its own
    object, the others' arrive as copies)."""

    shard: Shard
    result: T
    shared: tuple[Any, ...]

    @property
    def others(self) -> tuple[Any, ...]:
        """The other ranks' shared parts, in rank order (empty for one process)."""
        rank = self.shard.rank
        return self.shared[:rank] + self.shared[rank + 1 :]


def _bad_group(group: Any) -> ConfigError:
    return ConfigError(
        f"group={group!r} is not a process group: pass None (the default group, which "
        f"torch.distributed.init_process_group(...) sets up; torchrun sets up the environment "
        f"it reads), False (this process alone) or a torch.distributed.ProcessGroup "
        f"(torch.distributed.group.WORLD, torch.distributed.new_group(ranks))"
    )


def _resolve(group: Any) -> tuple[Shard, ConfigError | None]:
    """Where ``group`` runs the work, and the ConfigError a bad ``group`` is. A bad group is
    exchanged on the default group when one is initialised (the other ranks learn it there),
    and raised at once when none is (nobody waits)."""
    import torch.distributed as dist

    ready = dist.is_available() and dist.is_initialized()
    if group is False or (group is None and not ready):
        return _ALONE, None
    error = None
    if group is not None and not (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        error, group = _bad_group(group), None
    elif not ready:
        error = ConfigError(
            "group=... was given but torch.distributed is not initialised: call "
            "torch.distributed.init_process_group(...) first (torchrun sets up the environment "
            "it reads), or leave group=None for one process"
        )
    if not ready and error is not None:  # nobody to tell: raised at once
        raise error
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ConfigError(
            f"this process (rank {dist.get_rank()} of the default group) is not a member of "
            f"group={group!r}: only the group's members call with it; pass a group this rank "
            f"belongs to, or group=False to work alone"
        )
    return Shard(rank, dist.get_world_size(group), group), error


def active(group: Any = None) -> bool:
    """Whether work with ``group`` runs across processes: a process group was passed, or the
    default one is initialised (``group=False``: never, this process alone).

    Raises:
        ConfigError: ``group`` is not None, False or a ProcessGroup, or torch.distributed is
            not initialised while a group was passed.

    Example:
        >>> active(group=False)
        False
    """
    shard, error = _resolve(group)
    if error is not None:
        raise error
    return shard.distributed


def sharded(
    work: Callable[[Shard], T],
    group: Any,
    what: str,
    *,
    share: Callable[[T], Any] | None = None,
) -> Outcomes[T]:
    """Run ``work`` on this rank and exchange every rank's outcome: THE sharded path.

    ``group`` is resolved first (a bad one is this rank's error); then ``work(shard)`` runs (its
    argument checks first: everything it raises is exchanged); then one ``all_gather_object``
    carries ``what``, the error or ``share(result)`` (default: the result) of every rank. Every
    collective entry point calls it before its merge, and every rank must call it.

    Args:
        work: this rank's part, given its :class:`Shard` (``shard.rank == 0`` shows progress).
        group: None (the default group if initialised, else alone), False (alone) or a
            ``torch.distributed.ProcessGroup``.
        what: the entry point (``"calibrate"``): ranks in different entry points are an error.
        share: what of the result the other ranks get (picklable); default the whole result.

    Returns:
        :class:`Outcomes`: alone, ``work``'s result and its shared part, nothing exchanged.

    Raises:
        QvizError: on every rank alike when any rank failed, naming each failing rank and its
            error: the class of the lowest failing rank's error when it is a QvizError (a bad
            argument is a ConfigError everywhere), else CalibrationError; ConfigError when the
            ranks are in different entry points, or (on the ranks that waited) when a rank
            never joined the exchange, naming it. Alone, what ``work`` raised, as it raised it.

    Example:
        >>> out = sharded(lambda shard: (shard.rank, "model"), False, "example",
        ...               share=lambda result: result[0])
        >>> out.result, out.shared, out.others
        ((0, 'model'), (0,), ())
    """
    import torch.distributed as dist

    shard, error = _resolve(group)
    if not shard.distributed:
        if group is False:
            note_alone(what)  # named by the others' error if they wait for this rank
        result = work(shard)
        return Outcomes(shard, result, (result if share is None else share(result),))
    call = count_call(shard, what)
    result, mine, payload = None, None, b""
    if error is None:
        try:
            result = work(shard)
            mine = result if share is None else share(result)
            payload = pickle.dumps(mine)  # here, so that a payload that cannot go is an error
        except Exception as exc:  # exchanged, then raised on every rank
            error = exc
    records: list[Any] = [None] * shard.size
    try:
        dist.all_gather_object(
            records, {"what": what, "error": _error_record(error), "payload": payload}, shard.group
        )
    except RuntimeError as exc:  # the backend gave up: a rank left, or never came in time
        raise exchange_failed(shard, what, call, exc) from exc
    _raise_failures(records, shard, what, error)
    shared = [
        mine if r == shard.rank else pickle.loads(o["payload"]) for r, o in enumerate(records)
    ]
    return Outcomes(shard, result, tuple(shared))


def _error_record(error: BaseException | None) -> tuple[str | None, str] | None:
    """(the nearest qviz.errors class's name, or None; the error as one line of text)."""
    if error is None:
        return None
    kind = next((c.__name__ for c in type(error).__mro__ if c.__module__ == errors.__name__), None)
    return kind, f"{type(error).__name__}: {error}"


def _raise_failures(
    records: list[dict], shard: Shard, what: str, local: BaseException | None
) -> None:
    """Raise the same error on every rank when a rank failed or the ranks' calls differ."""
    calls = [r["what"] for r in records]
    failed = [(rank, r["error"]) for rank, r in enumerate(records) if r["error"] is not None]
    if not failed and len(set(calls)) == 1:
        return
    if len(set(calls)) > 1:
        head = (
            "the ranks made different calls ("
            + ", ".join(f"rank {r}: {c}" for r, c in enumerate(calls))
            + "): every rank must call the same qviz functions, with the same group, in the "
            "same order"
        )
    else:
        head = f"{what} failed on {len(failed)} of {shard.size} ranks"
    lines = "".join(f"\n  rank {rank}: {text}" for rank, (_, text) in failed)
    message = f"{head} (this is rank {shard.rank}); nothing was merged"
    kind = _error_class(failed[0][1][0]) if failed else ConfigError
    raise kind(message + (f":{lines}" if lines else "")) from local


def _error_class(name: str | None) -> type[QvizError]:
    """The qviz.errors class of that name (what the failing rank raised), else
    CalibrationError (a RuntimeError, as most errors that are not QvizErrors are)."""
    found = getattr(errors, str(name), None)
    if isinstance(found, type) and issubclass(found, QvizError):
        return found
    return CalibrationError


@dataclass(frozen=True)
class _Item:
    name: str
    obj: Any
    rule: Rule


def _items(model: nn.Module) -> list[_Item]:
    """Every observer, observer-held calibrator and TensorQuantizer calibrator, by module name."""
    items = []
    for name, module in model.named_modules():
        rule = rule_for(module)
        if rule is not None:
            items.append(_Item(name, module, rule))
        calibrator = getattr(module, "calibrator", None)
        if calibrator is not None and not isinstance(calibrator, nn.Module):
            calib_rule = rule_for(calibrator)
            if calib_rule is not None:
                items.append(_Item(f"{name}.calibrator", calibrator, calib_rule))
    return items


def _plan_digest(model: nn.Module) -> str:
    plan = plan_of(model)
    return digest([repr(getattr(plan, "groups", None)), repr(getattr(plan, "tensors", None))])


def _outcome(model: nn.Module, items: list[_Item], batches: int) -> dict:
    return {
        "batches": batches,
        "plan": _plan_digest(model),
        "items": [(i.name, i.rule.signature(i.obj)) for i in items],
        "channels": [i.rule.channels(i.obj) for i in items],
        "keep": [i.rule.keep(i.obj) for i in items],
    }


def _check_same_model(outcomes: list[dict]) -> None:
    first = outcomes[0]
    for rank, other in enumerate(outcomes[1:], start=1):
        if other["items"] == first["items"] and other["plan"] == first["plan"]:
            continue
        pairs = zip(first["items"], other["items"], strict=False)
        where = next((f"{a} vs {b}" for a, b in pairs if a != b), None)
        if where is None and len(first["items"]) != len(other["items"]):
            where = f"{len(first['items'])} observers vs {len(other['items'])}"
        where = where or f"QuantPlan digest {first['plan']} vs {other['plan']}"
        raise ConfigError(
            f"rank {rank}'s prepared model differs from rank 0's ({where}): every rank must "
            f"prepare the same exported model with the same quantizer (same shapes, same "
            f"annotations) before calibrating"
        )


def _shapes(outcomes: list[dict], items: list[_Item]) -> list[Shape]:
    shapes = []
    for index, item in enumerate(items):
        seen = {o["channels"][index] for o in outcomes} - {None}
        if len(seen) > 1:
            raise ConfigError(
                f"{item.name}: ranks saw different channel counts {sorted(seen)}; a per-channel "
                f"observer needs the same channel count on every rank"
            )
        keep = next((o["keep"][index] for o in outcomes if o["keep"][index] is not None), ())
        shapes.append(Shape(next(iter(seen), None), tuple(keep)))
    return shapes


def _device(group: Any) -> torch.device:
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reduce(parts: list[Contributions], group: Any) -> list[dict[str, torch.Tensor]]:
    """All contributions reduced with one ``all_reduce`` per (reduction, dtype)."""
    import torch.distributed as dist

    buckets: dict[tuple[str, torch.dtype], list[tuple[int, str, bool, torch.Tensor]]] = {}
    for index, contributions in enumerate(parts):
        for key, (op, tensor) in sorted(contributions.items()):
            flat = tensor.reshape(-1)
            negate = op == "max"  # MAX rides in the MIN tensor as -x
            bucket = ("sum" if op == "sum" else "min", flat.dtype)
            buckets.setdefault(bucket, []).append((index, key, negate, -flat if negate else flat))
    out: list[dict[str, torch.Tensor]] = [{} for _ in parts]
    device = _device(group)
    for (op, _dtype), entries in sorted(buckets.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        packed = torch.cat([t for *_, t in entries]).to(device)
        reduce_op = dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MIN
        dist.all_reduce(packed, op=reduce_op, group=group)
        pieces = packed.cpu().split([t.numel() for *_, t in entries])
        for (index, key, negate, _), piece in zip(entries, pieces, strict=True):
            out[index][key] = -piece if negate else piece
    return out


def _refresh_fake_quantizers(model: nn.Module) -> None:
    """A fake-quantize module's scale / zero_point follow its merged observer."""
    for module in model.modules():
        if isinstance(module, FakeQuantize) and module.activation_post_process.num_batches:
            module._update_qparams()


def calibrate_sharded(model: nn.Module, work: Callable[[Shard], int], group: Any, what: str) -> int:
    """Run ``work`` (this rank's batches through ``model``, its argument checks first; returns
    how many ran) through :func:`sharded`, then merge every observer and calibrator of
    ``model`` across the ranks, in place: every rank then holds the same state (one process's
    over all the shards, bit for bit, for min / max, OrderFreeHistogramObserver and the
    calibrators; see the module docstring for HistogramObserver and moving averages), so
    ``convert_pt2e`` (or ``load_calib_amax``) gives the same model on any.

    Args:
        model: a prepared model (observers), a QAT-prepared one (fake-quantize modules), or a
            model with TensorQuantizers that collect statistics.
        work: this rank's calibration, given its :class:`Shard`.
        group: as for :func:`sharded`.
        what: the entry point (``"calibrate"``).

    Returns:
        The number of batches over every rank (this process's alone: nothing merged).

    Raises:
        QvizError: a rank failed (every rank raises, naming it; :func:`sharded`).
        CalibrationError: distributed, and no rank saw data.
        ConfigError: the ranks' models differ (named), or ``group`` is not a process group.

    Example:
        >>> from qviz.engine.observers import MinMaxObserver
        >>> model = torch.nn.Sequential(MinMaxObserver())
        >>> calibrate_sharded(model, lambda shard: len([model(torch.ones(2))]), False, "example")
        1
    """

    def measured(shard: Shard) -> dict:
        seen = work(shard)
        return _outcome(model, _items(model), seen) if shard.distributed else {"batches": seen}

    outcomes = sharded(measured, group, what)
    if outcomes.shard.distributed:
        _merge(model, list(outcomes.shared), outcomes.shard.group)
    return sum(o["batches"] for o in outcomes.shared)


def _merge(model: nn.Module, outcomes: list[dict], group: Any) -> None:
    """Every rank's observers merged into ``model``'s, from the exchanged outcomes."""
    _check_same_model(outcomes)
    if sum(o["batches"] for o in outcomes) == 0:
        raise CalibrationError(
            f"calibration on {len(outcomes)} ranks got no batches at all: every shard is empty"
        )
    items = _items(model)
    shapes = _shapes(outcomes, items)
    round1 = _reduce([i.rule.round1(i.obj, s) for i, s in zip(items, shapes, strict=True)], group)
    round2 = _reduce(
        [i.rule.round2(i.obj, r, s) for i, r, s in zip(items, round1, shapes, strict=True)], group
    )
    for item, r1, r2, shape in zip(items, round1, round2, shapes, strict=True):
        item.rule.apply(item.obj, r1, r2, shape)
    _refresh_fake_quantizers(model)


def merge_observers(
    model: nn.Module,
    group: Any = None,
    *,
    batches: int = 0,
    error: BaseException | None = None,
) -> nn.Module:
    """Merge every observer and calibrator of ``model`` across the ranks of ``group``, in place,
    after calibrating this rank's shard by hand (:func:`calibrate_sharded` with the work done).

    Args:
        model: as for :func:`calibrate_sharded`.
        group: None (the default group, if initialised), False or a ProcessGroup.
        batches: how many batches this rank saw (no data on any rank is an error).
        error: what this rank raised while calibrating its shard, if anything: reported on
            every rank instead of merging (raised as it is for one process).

    Returns:
        ``model``.

    Example:
        >>> from qviz.engine.observers import MinMaxObserver
        >>> model = torch.nn.Sequential(MinMaxObserver())
        >>> merge_observers(model, group=False, batches=1) is model
        True
    """

    def done(shard: Shard) -> int:
        if error is not None:
            raise error
        return batches

    calibrate_sharded(model, done, group, "calibrate")
    return model
