"""Remedy estimates kept by what they were measured on, so diagnosing again measures only what
changed.

:func:`content_key` digests everything an estimate of :mod:`qviz.numeric.diagnose.gain` is
computed from; :class:`EstimateMemo` keeps estimates by it (and the remedy), the most recent
first; :data:`RECENT_ESTIMATES` is the one :func:`~qviz.numeric.diagnose` uses when given none.

Example:
    >>> memo = EstimateMemo(size=1)
    >>> memo["key"] = "an estimate"
    >>> memo.get("key"), memo.get("other")
    ('an estimate', None)
"""

from __future__ import annotations

import torch
from torch.fx.node import map_arg

from qviz.engine.graph.memo import ContentDigest, ContentMemo
from qviz.numeric.diagnose.gain import LocalOperator


class EstimateMemo(ContentMemo):
    """Remedy estimates by :func:`content_key` (and remedy), the most recently used ``size``
    kept: what :func:`~qviz.numeric.diagnose` takes estimates from instead of measuring them
    again (a :class:`~qviz.engine.graph.memo.ContentMemo`).

    Example:
        >>> memo = EstimateMemo(size=2)
        >>> memo["a"], memo["b"], memo["c"] = 1, 2, 3
        >>> memo.get("a"), memo.get("c"), len(memo)
        (None, 3, 2)
    """


#: The estimates :func:`~qviz.numeric.diagnose` keeps when it is given none: a notebook that
#: diagnoses a model, then opens a RepairSession on the same model and data, measures each
#: layer's remedies once.
RECENT_ESTIMATES = EstimateMemo()


def content_key(local: LocalOperator) -> str:
    """A digest of everything a remedy's estimate on ``local`` is computed from: the operator
    and its literal arguments, what it saw (its inputs on each batch and its float outputs, by
    their bytes), each quantized tensor's spec and its observer (class, settings and state), and
    the figure measured. Two operators with the same key get the same estimates, bit for bit
    (every estimate is deterministic: AdaRound's sampling is seeded), so a caller that
    diagnoses again after changing something else (``RepairSession``) measures only what
    changed.

    Example:
        >>> gm = torch.fx.symbolic_trace(lambda x, w: torch.nn.functional.linear(x, w))
        >>> node = next(n for n in gm.graph.nodes if n.op == "call_function")
        >>> x, w = torch.ones(3, 4), torch.ones(2, 4)
        >>> a = LocalOperator(node=node, edges=[], output=None, calls=[{"x": x, "w": w}])
        >>> b = LocalOperator(node=node, edges=[], output=None, calls=[{"x": x, "w": w * 2}])
        >>> content_key(a) == content_key(a) != content_key(b)
        True
    """
    digest = ContentDigest()
    add = digest.add
    node, inputs = local.node, [a.name for a in local.node.all_input_nodes]
    add((str(node.target), local.figure, torch.get_num_threads()))  # threads: sums' order
    add(map_arg((node.args, node.kwargs), lambda a: f"input {inputs.index(a.name)}"))
    for call in local.calls:
        for name in inputs:
            add(call.get(name))
    for ref in local.refs:
        add(ref)
    for edge in [*local.edges, local.output]:
        if edge is None:
            add(None)
            continue
        add((edge.key, inputs.index(edge.arg) if edge.arg in inputs else None, edge.constant))
        add(repr(edge.spec))
        observer = edge.observer
        add(type(observer).__qualname__)
        add(sorted((k, repr(v)) for k, v in vars(observer).items()  # its label only names it
                   if not k.startswith("_") and not isinstance(v, torch.Tensor)
                   and k != "qviz_label"))  # fmt: skip
        for key, value in sorted(observer.state_dict().items()):
            add(key)
            add(value)
    return digest.hexdigest()
