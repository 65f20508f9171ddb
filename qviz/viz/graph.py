"""``qviz.viz.graph``: draw a model at its stage (float, observed, converted) from its records.

Example:
    >>> import torch, qviz
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> gm = qviz.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),))
    >>> prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(
    ...     get_symmetric_quantization_config()))
    >>> g = graph(prepared)
    >>> g.stage, g.dot.startswith("digraph qviz {")
    ('observed', True)
    >>> g.svg().lstrip().startswith("<?xml") or g.svg().lstrip().startswith("<svg")
    True
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch.fx import GraphModule

from qviz.errors import ConfigError, MissingDependencyError
from qviz.viz.dot import to_digraph
from qviz.viz.hierarchy import collapse as collapse_view
from qviz.viz.stages import GraphView, read_graph

__all__ = ["QGraph", "graph"]

_FORMATS = ("svg", "png", "pdf")


class QGraph:
    """A drawn graph that renders itself in Jupyter; ``.dot`` is its DOT text.

    Attributes:
        view: the records drawn (:class:`~qviz.viz.stages.GraphView`).
        digraph: the ``graphviz.Digraph``.

    Example:
        >>> import torch, qviz
        >>> g = graph(qviz.export(torch.nn.ReLU(), (torch.randn(2),)))
        >>> g.stage, len(g)
        ('float', 3)
    """

    def __init__(self, view: GraphView, digraph: Any) -> None:
        self.view = view
        self.digraph = digraph

    @property
    def stage(self) -> str:
        """``"float"``, ``"observed"`` or ``"converted"``."""
        return self.view.stage

    @property
    def dot(self) -> str:
        """The DOT source (deterministic: the same model gives the same text)."""
        return str(self.digraph.source)

    def __len__(self) -> int:
        return len(self.view.nodes)

    def _pipe(self, fmt: str) -> bytes:
        import graphviz

        try:
            return bytes(self.digraph.pipe(format=fmt))
        except graphviz.ExecutableNotFound as err:
            raise MissingDependencyError(
                "rendering needs graphviz's dot program: apt install graphviz (Debian/Ubuntu), "
                "brew install graphviz, or conda install graphviz; .dot works without it"
            ) from err

    def svg(self) -> str:
        """The graph as an SVG document (needs the ``dot`` program)."""
        return self._pipe("svg").decode("utf-8")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the graph to ``path``; the suffix picks the format (.svg, .png, .pdf, .dot)."""
        out = Path(path)
        fmt = out.suffix.lstrip(".").lower()
        if fmt in ("dot", "gv"):
            out.write_text(self.dot, encoding="utf-8")
            return out
        if fmt not in _FORMATS:
            raise ConfigError(f"cannot save {out.name}: use a .svg, .png, .pdf or .dot suffix")
        out.write_bytes(self._pipe(fmt))
        return out

    def _repr_svg_(self) -> str:
        return self.svg()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"image/svg+xml": self.svg(), "text/plain": repr(self)}

    def __repr__(self) -> str:
        return f"QGraph(stage={self.stage!r}, nodes={len(self)}, edges={len(self.view.edges)})"


def _highlight(highlight: str | Sequence[str] | None) -> tuple[str, ...]:
    if highlight is None:
        return ()
    if isinstance(highlight, str):
        return (highlight,)
    return tuple(highlight)


def graph(
    model: GraphModule,
    *,
    collapse: int | Sequence[str] | None = None,
    highlight: str | Sequence[str] | None = None,
    show_params: bool = False,
) -> QGraph:
    """Draw ``model`` at its stage: captured float, observed (prepared) or converted.

    The observed graph reads ``model.plan``: every observer is a small marker ``gN`` on the
    edges it observes, in its sharing group's colour; ops the plan left in float are grey with
    the reason as tooltip. The converted graph labels quantize/dequantize with the plan's scale
    and zero_point and marks integer weights.

    Args:
        model: a graph module from :func:`qviz.export`, :func:`qviz.prepare_pt2e` or
            :func:`qviz.convert_pt2e`.
        collapse: a module depth (``2``) or module paths (``["layer1"]``) to draw as one box
            each, labelled with the path and op count.
        highlight: node names or module paths drawn with a thick red outline.
        show_params: also draw parameters and constants (get_attr nodes).

    Returns:
        A :class:`QGraph`; it renders itself in Jupyter, ``.save("g.png")`` writes a file.

    Raises:
        ConfigError: ``model`` is not a graph module, or ``collapse`` is malformed.
        MissingDependencyError: the graphviz package (or, to render, the dot program) is missing.

    Example:
        >>> import torch, qviz
        >>> g = graph(qviz.export(torch.nn.Sequential(torch.nn.Linear(2, 2)), (torch.ones(1, 2),)),
        ...           collapse=1)
        >>> [n.label for n in g.view.nodes if n.kind == "collapsed"]
        ['0']
    """
    if not isinstance(model, GraphModule):
        raise ConfigError(
            f"graph() draws a graph module, got {type(model).__name__}: pass "
            f"qviz.export(model, inputs), or the result of prepare_pt2e / convert_pt2e"
        )
    view = collapse_view(read_graph(model, show_params=show_params), collapse)
    return QGraph(view, to_digraph(view, _highlight(highlight)))
