"""Which modules of a graph widget are drawn as one box, and how a click changes that.

Big models open with every top-level module collapsed (as Model Explorer does); a click on a
collapsed box expands it one level (its submodules that have submodules of their own stay
collapsed), a click on an expanded module's cluster collapses it again. Plain data: the list of
collapsed module paths, read from the graph's ``nn_module_stack``.

Example:
    >>> import torch, qviz
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Linear(2, 2))
    >>> fold = Folding(qviz.export(model.eval(), (torch.randn(1, 2),)), big=1)
    >>> fold.collapsed
    ['0', '1']
    >>> fold.toggle("0").collapsed
    ['1']
"""

from __future__ import annotations

from torch.fx import GraphModule

from qviz.engine.quantizers.fallback import module_path

#: Graphs with more operators than this open with every top-level module collapsed.
BIG_GRAPH = 50


class Folding:
    """The collapsed module paths of one model's drawing.

    Args:
        model: the graph module drawn (any stage: paths come from ``nn_module_stack``).
        big: open collapsed when the graph has more operators than this.
    """

    def __init__(self, model: GraphModule, *, big: int = BIG_GRAPH) -> None:
        self.modules = _modules(model)
        ops = sum(1 for n in model.graph.nodes if n.op == "call_function")
        self.collapsed: list[str] = (
            sorted(p for p in self.modules if "." not in p) if ops > big else []
        )

    def children(self, path: str) -> set[str]:
        """The direct submodules of ``path``."""
        depth = path.count(".") + 1
        return {p for p in self.modules if p.startswith(f"{path}.") and p.count(".") == depth}

    def toggle(self, path: str) -> Folding:
        """Expand a collapsed module one level, or collapse an expanded one."""
        path = path.removeprefix("module/")
        if path in self.collapsed:
            self.collapsed = [p for p in self.collapsed if p != path]
            inner = {c for c in self.children(path) if self.children(c)}  # not leaves
            self.collapsed += sorted(inner - set(self.collapsed))
        else:
            self.collapsed = [p for p in self.collapsed if not p.startswith(f"{path}.")] + [path]
        return self

    @property
    def collapse(self) -> list[str] | None:
        """What ``qviz.viz.graph(collapse=...)`` takes (None when nothing is collapsed)."""
        return list(self.collapsed) or None


def _modules(model: GraphModule) -> set[str]:
    paths = set()
    for node in model.graph.nodes:
        path = module_path(node)
        while path:
            paths.add(path)
            path = path.rpartition(".")[0]
    return paths
