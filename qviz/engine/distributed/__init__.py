"""Calibration and comparison across the ranks of a ``torch.distributed`` process group.

:mod:`~qviz.engine.distributed.sharded` runs each rank's shard and exchanges every rank's
outcome, then merges observer and calibrator state; :mod:`~qviz.engine.distributed.merge_rules`
says how each kind of state merges.

Example:
    >>> from qviz.engine.distributed import active
    >>> active(group=False)
    False
"""

from qviz.engine.distributed.sharded import (
    active,
    gather_outcomes,
    merge_observers,
    rank_and_size,
    run_sharded,
)

__all__ = ["active", "gather_outcomes", "merge_observers", "rank_and_size", "run_sharded"]
