"""Which collective qviz calls each rank made on a group: counted in the group's store, read back
when an exchange fails, so that the error names the rank that did not come.

Every rank must make the same qviz calls with the same group, in the same order. A rank that
does not (it passes ``group=False`` while the others pass a group, or calls once more or once
less than they do) leaves the others in an exchange it never joins. The backend then gives up
on them: at once when that rank exits or destroys its process group (gloo: "Connection closed
by peer"), at the process group's timeout when it goes on with other work; either way its
message names an address, not a rank. So each rank counts its exchanges on each group in the
group's store (one ``add`` per exchange) and notes its last qviz call in the default group's
store (one ``set``; a call with ``group=False`` too, while a process group is up). When an
exchange fails in the backend, :func:`exchange_failed` reads every rank's count and note back,
with a timeout of seconds, and names the ranks whose count is behind this rank's, with what
they last did.

Example:
    >>> from qviz.engine.distributed.sharded import Shard
    >>> count_call(Shard(0, 1, False), "calibrate")  # no process group: nothing counted
    0
"""

from __future__ import annotations

import datetime
from typing import Any

from qviz.errors import CalibrationError, ConfigError, QvizError

#: how long a failed exchange waits for the store when it reads the ranks' counts back
READ_TIMEOUT = datetime.timedelta(seconds=5)
_CALLS = "qviz/calls/{rank}"  # in the group's store: a rank of the group
_LAST = "qviz/last/{rank}"  # in the default group's store: a rank of the default group


def _group_store(group: Any) -> Any:
    get = getattr(group, "get_group_store", None)
    return get() if callable(get) else None


def _world() -> tuple[Any, int] | None:
    """(the default group's store, this process's rank in it) while one is up with 2+ ranks."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    store = _group_store(dist.group.WORLD)
    return None if store is None else (store, dist.get_rank())


def _note(text: str) -> None:
    """This rank's last qviz call, for the other ranks' errors (a note: a store error is
    ignored here, the exchange reports it)."""
    world = _world()
    if world is None:
        return
    store, rank = world
    try:
        store.set(_LAST.format(rank=rank), text)
    except RuntimeError:
        pass


def note_alone(what: str) -> None:
    """Note that this rank runs ``what`` alone (``group=False``) while a process group is up.

    Example:
        >>> note_alone("calibrate")  # no process group: nothing to note
    """
    _note(f"{what} with group=False (alone)")


def count_call(shard: Any, what: str) -> int:
    """Count this rank's exchange on ``shard.group`` and note ``what``; the count (1 for the
    first), or 0 when it cannot be kept (no process group, or no store)."""
    if shard.group is False:
        return 0
    store = _group_store(shard.group)
    if store is None:
        return 0
    try:
        call = int(store.add(_CALLS.format(rank=shard.rank), 1))
    except RuntimeError:
        return 0
    _note(f"{what} (its exchange {call} on this group)")
    return call


def _read(shard: Any) -> tuple[list[int], list[str | None]] | None:
    """Every rank's count on the group and last note, or None when the store cannot be read
    within :data:`READ_TIMEOUT` (the rank that hosted it has gone)."""
    import torch.distributed as dist

    store, world = _group_store(shard.group), _world()
    if store is None:
        return None
    old = store.timeout
    try:
        store.set_timeout(READ_TIMEOUT)
        counts = [int(store.add(_CALLS.format(rank=r), 0)) for r in range(shard.size)]
        notes: list[str | None] = []
        for r in range(shard.size):
            key = _LAST.format(rank=dist.get_global_rank(shard.group, r))
            has = world is not None and world[0].check([key])
            notes.append(world[0].get(key).decode() if has else None)
        return counts, notes
    except RuntimeError:
        return None
    finally:
        try:
            store.set_timeout(old)
        except RuntimeError:
            pass


def _who(rank: int, read: tuple[list[int], list[str | None]] | None) -> str:
    if read is None:
        return f"rank {rank} (it left: its calls could not be read, the store went with it)"
    counts, notes = read
    last = f"; its last qviz call: {notes[rank]}" if notes[rank] else ""
    return f"rank {rank} (it made {counts[rank]} exchange(s) on this group{last})"


def exchange_failed(shard: Any, what: str, call: int, error: BaseException) -> QvizError:
    """The error for an exchange that failed in the backend: ConfigError naming the ranks
    whose exchanges on the group are fewer than this rank's ``call`` (with what they last
    did), else CalibrationError (a rank crashed or was stopped) with the backend's message.

    Example:
        >>> from qviz.engine.distributed.sharded import Shard
        >>> exchange_failed(Shard(0, 1, False), "calibrate", 0, RuntimeError("closed"))
        CalibrationError('calibrate: the exchange between the ranks failed in the backend (this is rank 0, in its exchange 0 on this group): closed; every rank had come as far, so a rank may have crashed or been stopped: check its log. Nothing was merged')
    """  # noqa: E501
    raw = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    read = _read(shard) if shard.group is not False else None
    if read is not None:
        behind = [r for r in range(shard.size) if r != shard.rank and read[0][r] < call]
    else:  # the store is gone: with two ranks it went with the other one
        behind = [1 - shard.rank] if shard.size == 2 and shard.group is not False else []
    head = (
        f"{what}: the exchange between the ranks failed in the backend (this is rank "
        f"{shard.rank}, in its exchange {call} on this group)"
    )
    if not behind:
        return CalibrationError(
            f"{head}: {raw}; every rank had come as far, so a rank may have crashed or been "
            f"stopped: check its log. Nothing was merged"
        )
    who = "; ".join(_who(r, read) for r in behind)
    return ConfigError(
        f"{head}: {who} did not join it. Every rank must make the same qviz calls with the same "
        f"group, in the same order: a rank that passes group=False while the others pass a "
        f"group, or calls once more or once less than they do, leaves them waiting. Nothing was "
        f"merged (the backend said: {raw})"
    )
