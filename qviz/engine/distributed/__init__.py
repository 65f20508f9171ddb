"""Calibration and comparison across the ranks of a ``torch.distributed`` process group.

:mod:`~qviz.engine.distributed.sharded` is THE sharded path every collective entry point takes
(:func:`sharded`: resolve the group, run this rank's work, exchange every rank's outcome, raise
a failure on every rank) and merges observer and calibrator state (:func:`calibrate_sharded`);
:mod:`~qviz.engine.distributed.merge_rules` says how each kind of state merges.

Example:
    >>> from qviz.engine.distributed import active
    >>> active(group=False)
    False
"""

from qviz.engine.distributed.sharded import (
    Outcomes,
    Shard,
    active,
    calibrate_sharded,
    merge_observers,
    sharded,
)

__all__ = ["Outcomes", "Shard", "active", "calibrate_sharded", "merge_observers", "sharded"]
