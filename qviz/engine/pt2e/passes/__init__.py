"""Graph passes of the PT2E flow: one pass per module, each edits the graph in place and leaves it
valid (``graph.lint()``).

They read facts from :mod:`qviz.engine.graph` and never import the flow
(:mod:`qviz.engine.pt2e`'s other modules), which calls them.

Example:
    >>> import torch
    >>> from qviz.engine.pt2e.passes.bn_fold import fold_batch_norm
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2)).eval()
    >>> gm = torch.export.export(model, (torch.randn(1, 1, 5, 5),)).module()
    >>> fold_batch_norm(gm)   # the BatchNorms left unfolded, and why: none
    []
    >>> sum("batch_norm" in str(n.target) for n in gm.graph.nodes)
    0
"""
