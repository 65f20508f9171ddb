"""Watch quantization-aware training: the monitor, its names, tallies and plot.

:class:`QATMonitor` (:mod:`~qviz.numeric.qat.monitor`) records scales, clipping and changes each
step; :mod:`~qviz.numeric.qat.names` names the fake-quantizers, :mod:`~qviz.numeric.qat.tally`
counts and :mod:`~qviz.numeric.qat.plot` draws them.

Example:
    >>> from qviz.numeric.qat import QATMonitor, QATRecord
    >>> QATMonitor.__name__, QATRecord.__name__
    ('QATMonitor', 'QATRecord')
"""

from qviz.numeric.qat.monitor import QATMonitor, QATRecord

__all__ = ["QATMonitor", "QATRecord"]
