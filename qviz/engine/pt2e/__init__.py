"""The PyTorch 2 export quantization flow, in its order.

Annotations are validated (:mod:`~qviz.engine.pt2e.annotations`), grouped into sharing groups as
pure data (:mod:`~qviz.engine.pt2e.sharing`), recorded in the QuantPlan
(:mod:`~qviz.engine.pt2e.plan`) and applied by :mod:`~qviz.engine.pt2e.prepare` (or
:mod:`~qviz.engine.pt2e.qat`); :mod:`~qviz.engine.pt2e.calibrate` feeds the observers and
:mod:`~qviz.engine.pt2e.convert` turns them into quantize / dequantize operators through the graph
passes of :mod:`qviz.engine.pt2e.passes`. The public functions are re-exported from :mod:`qviz`.
"""
