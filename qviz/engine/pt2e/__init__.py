"""The PyTorch 2 export quantization flow, in its order.

Annotations are validated (:mod:`~qviz.engine.pt2e.annotations`), grouped into sharing groups as
pure data (:mod:`~qviz.engine.pt2e.sharing`), recorded in the QuantPlan
(:mod:`~qviz.engine.pt2e.plan`) and applied by :mod:`~qviz.engine.pt2e.prepare` (or
:mod:`~qviz.engine.pt2e.qat`); :mod:`~qviz.engine.pt2e.calibrate` feeds the observers and
:mod:`~qviz.engine.pt2e.convert` turns them into quantize / dequantize operators through the graph
passes of :mod:`qviz.engine.pt2e.passes`. The public functions are re-exported from :mod:`qviz`.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(3, 4),))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> prepared = qviz.prepare_pt2e(gm, q)
    >>> len(prepared.plan.groups)   # input, weight, output
    3
"""
