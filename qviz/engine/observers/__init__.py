"""Graph observers for the PT2E engine: ``nn.Module``\\ s that watch tensors and decide qparams.

``prepare_pt2e`` inserts one observer per sharing group; calibration batches flow through them
(``forward`` returns its input unchanged); ``convert_pt2e`` asks each for
``calculate_qparams() -> (scale, zero_point)``. Given the same batches, the qparams agree bit for
bit with torchao's observers of the same names (same dtypes, shapes and values), with two
deliberate differences: an observer that saw no data raises CalibrationError instead of returning
``(1.0, 0)``, and NaN/Inf inputs raise CalibrationError instead of being kept (or dropped).

=========================================  =================================================
observer                                   qparams from
=========================================  =================================================
MinMaxObserver                             running min/max
MovingAverageMinMaxObserver                moving average of each batch's min/max
PerChannelMinMaxObserver                   running min/max per ``ch_axis`` slice
MovingAveragePerChannelMinMaxObserver      moving average per slice
HistogramObserver                          histogram: torch's L2 search (default), or
                                           max / percentile / entropy / mse (HistogramCalibrator)
OrderFreeHistogramObserver                 histogram over a power-of-two range, the same for any
                                           batch order or sharding: the L2 search
FixedQParamsObserver                       fixed ``scale``/``zero_point``
PlaceholderObserver                        none: dynamic quantization or a cast
DerivedQParamsObserver                     a function of other observers (e.g. int32 bias)
=========================================  =================================================

Calibrated on several processes (``qviz.calibrate(..., group=...)``), the min/max observers and
OrderFreeHistogramObserver merge to one process's state bit for bit; HistogramObserver to within
one process's spread over batch orders; moving averages to the batch-weighted mean of the
ranks' averages (:mod:`qviz.engine.distributed.sharded`).

Every observer also keeps what the views read: ``num_batches``, ``num_elements``, the observed
``min_val``/``max_val`` (buffers) and a short tensor-free repr; ``reset()`` forgets it all.
``Observer.with_args(**kwargs)`` returns a constructor with those arguments bound.

Example:
    >>> import torch
    >>> from qviz.engine.observers import HistogramObserver
    >>> obs = HistogramObserver.with_args(eps=2**-12)(dtype=torch.int8)
    >>> for x in (torch.tensor([-1.0, 0.5]), torch.tensor([0.25, 2.0])):
    ...     _ = obs(x)
    >>> obs
    HistogramObserver(int8 per_tensor_affine [-128, 127] bins=2048 method=l2 batches=2 min=-1 max=2)
    >>> obs.calculate_qparams()
    (tensor([0.0118]), tensor([-43], dtype=torch.int32))
"""

from qviz.engine.observers.base import INTEGER_DTYPE_RANGES, ObserverBase, ObserverFactory
from qviz.engine.observers.histogram import (
    HISTOGRAM_METHODS,
    HistogramObserver,
    parse_histogram_method,
)
from qviz.engine.observers.minmax import (
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
)
from qviz.engine.observers.order_free_histogram import OrderFreeHistogramObserver
from qviz.engine.observers.passthrough import (
    DerivedQParamsObserver,
    FixedQParamsObserver,
    PlaceholderObserver,
)
from qviz.engine.observers.uniform import (
    PER_CHANNEL_QSCHEMES,
    PER_TENSOR_QSCHEMES,
    UniformQuantizationObserverBase,
)

__all__ = [
    "HISTOGRAM_METHODS",
    "INTEGER_DTYPE_RANGES",
    "PER_CHANNEL_QSCHEMES",
    "PER_TENSOR_QSCHEMES",
    "DerivedQParamsObserver",
    "FixedQParamsObserver",
    "HistogramObserver",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver",
    "ObserverBase",
    "ObserverFactory",
    "OrderFreeHistogramObserver",
    "PerChannelMinMaxObserver",
    "PlaceholderObserver",
    "UniformQuantizationObserverBase",
    "parse_histogram_method",
]
