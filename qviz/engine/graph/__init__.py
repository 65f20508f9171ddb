"""Facts about a captured graph, and no quantization decisions.

Capture (:mod:`~qviz.engine.graph.capture`), the one batch path every entry point uses
(:mod:`~qviz.engine.graph.inputs`), the one stage check (:mod:`~qviz.engine.graph.stage`), debug
handles, get_attr values, graph mutation, control flow, train / eval switching of exported graphs,
the quantize / dequantize operator sets, the per-node values handed to other tools, and the
fingerprint a record keeps of the model it measured (:mod:`~qviz.engine.graph.fingerprint`).

Nothing here imports :mod:`qviz.engine.pt2e`: the passes and the flow build on these facts.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.graph.stage import model_stage
    >>> model_stage(qviz.export(torch.nn.ReLU(), (torch.randn(2),))).value
    'float'
"""
