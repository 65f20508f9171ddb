"""The calibration explorer: which range would each calibration method give this observer?

:class:`CalibrationExplorer` (:mod:`~qviz.widgets.explorer.state`) holds the state; what it
explores, the HistogramObservers of a prepared model or the TensorQuantizers of a quant_nn
model, is a source of :mod:`~qviz.widgets.explorer.sources`; its ipywidgets belong to
:class:`~qviz.widgets.explorer.view.ExplorerView` (:mod:`~qviz.widgets.explorer.view`).

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> from qviz.widgets.explorer import CalibrationExplorer
    >>> gm = qviz.export(torch.nn.Linear(4, 4).eval(), (torch.randn(64, 4),))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(switchable=True))
    >>> prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), [torch.randn(64, 4)], progress=False)
    >>> CalibrationExplorer(prepared, graph=False).set(method="mse").state.method
    'mse'
"""

from qviz.widgets.explorer.state import CalibrationExplorer

__all__ = ["CalibrationExplorer"]
