"""Calibrate on many processes: one collective merge of observer and calibrator state.

Each process (rank) of a ``torch.distributed`` process group calibrates its own shard of the
data; then :func:`merge_observers` makes every observer, fake-quantize observer and
TensorQuantizer calibrator hold what one process would hold after all the shards:

1. one ``all_gather_object`` exchanges each rank's outcome: an error (raised on every rank,
   naming the rank and the reason, so no rank waits for a collective that never comes), the
   model's observers and a digest of its QuantPlan (a model that differs between ranks is named),
   the channel counts (a rank whose shard never reached a per-channel observer still merges) and
   the batch count (an empty shard is fine; no data anywhere is an error);
2. round 1 reduces ranges, amaxes, counts and weighted averages, round 2 the histograms re-binned
   onto the agreed ranges (:mod:`qviz.engine.distributed.merge_rules` says how each kind of state
   merges). The
   contributions of all observers are packed into one flat tensor per reduction and dtype: at
   most three ``all_reduce`` calls per round, however many observers the model has.

Only torch.distributed is used: gloo on CPU, NCCL on GPUs (the packed tensors go to the current
CUDA device there). A rank that dies without raising cannot report; the others then stop at
the process group's timeout (``torch.distributed.init_process_group(..., timeout=...)``).

Exactness: min / max (per tensor and per channel), the |x| histograms of HistogramCalibrator and
every amax method on them, and MaxCalibrator give bit for bit what one process gives over all
the batches. torch's HistogramObserver grows its range with a lossy re-binning, so even one
process's histogram depends on the order of its batches; the merge re-bins each rank's histogram
onto the global range with that same re-binning, which equals one process exactly when no
re-binning is needed (each rank's range is the global one). Moving averages merge as the
batch-count weighted mean of the ranks' averages
(:class:`~qviz.engine.distributed.merge_rules.MovingAverageRule`).

Example (one process; under ``torchrun`` every rank runs the same lines on its own shard):
    >>> import os, torch, torch.distributed as dist, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    >>> dist.init_process_group("gloo", rank=0, world_size=1)
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> _ = qviz.calibrate(prepared, [torch.randn(8, 4)], progress=False)  # merges
    >>> prepared.activation_post_process_0.num_batches
    1
    >>> dist.destroy_process_group()
"""

from __future__ import annotations

import hashlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from qviz.engine.distributed.merge_rules import Contributions, Rule, Shape, rule_for
from qviz.engine.observers.fake_quantize import FakeQuantize
from qviz.engine.pt2e.plan import plan_of
from qviz.errors import CalibrationError, ConfigError

__all__ = ["active", "gather_outcomes", "merge_observers", "rank_and_size", "run_sharded"]


def active(group: Any = None) -> bool:
    """Whether calibration should merge across processes: a group was passed, or the default
    process group is initialised (``group=False``: never, this process alone)."""
    import torch.distributed as dist

    if group is False:
        return False
    if group is not None:
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "group=... was given but torch.distributed is not initialised: call "
                "torch.distributed.init_process_group(...) first (torchrun sets up the "
                "environment it reads), or leave group=None for one process"
            )
        return True
    return dist.is_available() and dist.is_initialized()


def rank_and_size(group: Any = None) -> tuple[int, int]:
    """This process's rank in ``group`` and the group's size."""
    import torch.distributed as dist

    return dist.get_rank(group), dist.get_world_size(group)


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
    text = repr(getattr(plan, "groups", None)) + repr(getattr(plan, "tensors", None))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _outcome(model: nn.Module, items: list[_Item], batches: int) -> dict:
    return {
        "batches": batches,
        "plan": _plan_digest(model),
        "items": [(i.name, i.rule.signature(i.obj)) for i in items],
        "channels": [i.rule.channels(i.obj) for i in items],
        "keep": [i.rule.keep(i.obj) for i in items],
    }


def _check_errors(outcomes: list[dict], rank: int, local: BaseException | None, what: str) -> None:
    failed = [(r, o["error"]) for r, o in enumerate(outcomes) if o["error"]]
    if not failed:
        return
    lines = "\n".join(f"  rank {r}: {e}" for r, e in failed)
    raise CalibrationError(
        f"{what} failed on {len(failed)} of {len(outcomes)} ranks (this is rank {rank}); "
        f"nothing was merged:\n{lines}"
    ) from local


def _error_text(error: BaseException | None) -> str | None:
    return None if error is None else "".join(traceback.format_exception_only(error)).strip()


def gather_outcomes(
    payload: Any, group: Any = None, *, error: BaseException | None = None, what: str
) -> list[Any]:
    """Every rank's ``payload`` (picklable), in rank order, from one ``all_gather_object``.

    Raises on every rank, naming the rank and its error, when some rank passes ``error``
    (what it raised): the others learn it here instead of waiting in a later collective.
    """
    import torch.distributed as dist

    rank, size = rank_and_size(group)
    outcomes: list[Any] = [None] * size
    mine = {"error": _error_text(error), "payload": None if error else payload}
    dist.all_gather_object(outcomes, mine, group=group)
    _check_errors(outcomes, rank, error, what)
    return [o["payload"] for o in outcomes]


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


def merge_observers(
    model: nn.Module,
    group: Any = None,
    *,
    batches: int = 0,
    error: BaseException | None = None,
) -> nn.Module:
    """Merge every observer and calibrator of ``model`` across the ranks of ``group``, in place.

    Every rank must call it (collectives). After it, every rank holds identical state, so
    ``convert_pt2e`` (or ``load_calib_amax``) gives the same model on any rank.

    Args:
        model: a prepared model (observers), a QAT-prepared one (fake-quantize modules), or a
            model with TensorQuantizers that collected statistics.
        group: the process group (None: the default group).
        batches: how many batches this rank saw (no data on any rank is an error).
        error: what this rank raised while calibrating its shard, if anything: reported on
            every rank instead of merging.

    Returns:
        ``model``.

    Raises:
        CalibrationError: some rank failed (every rank raises, naming it), or no rank saw data.
        ConfigError: the ranks' models differ, or torch.distributed is not initialised.
    """
    if not active(group):
        return model

    items = _items(model)
    outcomes = gather_outcomes(
        _outcome(model, items, batches), group, error=error, what="calibration"
    )
    _check_same_model(outcomes)
    if sum(o["batches"] for o in outcomes) == 0:
        raise CalibrationError(
            f"calibration on {len(outcomes)} ranks got no batches at all: every shard is empty"
        )
    shapes = _shapes(outcomes, items)
    round1 = _reduce([i.rule.round1(i.obj, s) for i, s in zip(items, shapes, strict=True)], group)
    round2 = _reduce(
        [i.rule.round2(i.obj, r, s) for i, r, s in zip(items, round1, shapes, strict=True)], group
    )
    for item, r1, r2, shape in zip(items, round1, round2, shapes, strict=True):
        item.rule.apply(item.obj, r1, r2, shape)
    _refresh_fake_quantizers(model)
    return model


def run_sharded(model: nn.Module, work: Callable[[], int], group: Any = None) -> nn.Module:
    """Run ``work`` (this rank's calibration; returns its batch count) and merge, reporting a
    failure on every rank instead of leaving the others waiting in a collective."""
    batches, error = 0, None
    try:
        batches = work()
    except Exception as exc:  # reported to every rank, then raised there
        error = exc
    return merge_observers(model, group, batches=batches, error=error)
