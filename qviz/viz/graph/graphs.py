"""``qviz.viz.graph``: draw a model at its stage (float, annotated, observed, converted).

The annotated graph (a quantizer's ``annotate`` ran, not prepared yet) labels each edge
with its input spec (``int8 [-127,127] sym/ch0``, ``fixed s=0.0039 zp=-128``,
``shares (x -> add)``) and each op with its output spec; full text in tooltips.

The observed graph reads ``model.plan``: every observer is a small marker ``gN`` on the
edges it observes, in its sharing group's colour; ops the plan left in float are grey with
the reason as tooltip. The converted graph labels quantize/dequantize with the plan's scale
and zero_point and marks integer weights.

In a notebook (JupyterLab, Voila) a :class:`QGraph` shows as SVG inline in HTML, so hovering a
box or an edge label shows its tooltip; the drawing shrinks to the output's width while its text
stays legible (10 px), scrolling in its own box past that, and a graph taller than 2200 px is folded
under a one-line summary, a click away (``graph(..., fold=False)`` never folds; the rules:
:mod:`qviz.viz.graph.inline_svg`). Other front-ends get the plain ``image/svg+xml``.

A graph exported from a quant_nn model (``qviz.export(quantize_model(m), inputs)``) draws
each TensorQuantizer as one marker on the edge it quantizes, its arithmetic hidden:
``int8 amax=4.52 scale=0.0356 entropy`` (scale = amax / quant_max), the range for a
per-channel weight quantizer, ``dynamic`` without amax; disabled quantizers are not drawn
(:mod:`qviz.viz.graph.quantizer_view`).

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

import math
import numbers
import os
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch.fx import GraphModule

from qviz.display.bands import Bands
from qviz.engine.graph.fingerprint import check_fingerprint
from qviz.errors import ConfigError, MissingDependencyError, closest_names
from qviz.viz.graph.dot import to_digraph
from qviz.viz.graph.graph_records import GraphView
from qviz.viz.graph.hierarchy import collapse as collapse_view
from qviz.viz.graph.inline_svg import InlineLayout, inline_html
from qviz.viz.graph.long_edges import fold_long_edges
from qviz.viz.graph.read_graph import read_graph

_FORMATS = ("svg", "png", "pdf")


class QGraph:
    """A drawn graph that renders itself in Jupyter; ``.dot`` is its DOT text.

    Attributes:
        view: the records drawn (:class:`~qviz.viz.graph.graph_records.GraphView`).
        digraph: the ``graphviz.Digraph``.
        layout: how it sits in a notebook output: fitted to the width, folded when tall
            (:class:`~qviz.viz.graph.inline_svg.InlineLayout`; change it with :meth:`with_layout`).

    Example:
        >>> import torch, qviz
        >>> g = graph(qviz.export(torch.nn.ReLU(), (torch.randn(2),)))
        >>> g.stage, len(g)
        ('float', 3)
    """

    def __init__(self, view: GraphView, digraph: Any, layout: InlineLayout | None = None) -> None:
        self.view = view
        self.digraph = digraph
        self.layout = InlineLayout() if layout is None else layout
        if not isinstance(self.layout, InlineLayout):
            raise ConfigError(
                f"QGraph(layout=...) takes an InlineLayout, got {type(layout).__name__}"
            )

    def with_layout(self, **changes: Any) -> QGraph:
        """This drawing with other notebook-output choices (``fold``, ``max_height``,
        ``page_width``, ``min_text_px``: :class:`~qviz.viz.graph.inline_svg.InlineLayout`).

        Raises:
            ConfigError: an unknown choice or a bad value.

        Example:
            >>> import torch, qviz
            >>> g = graph(qviz.export(torch.nn.ReLU(), (torch.randn(2),)))
            >>> g.with_layout(fold=True).layout.fold, g.layout.fold
            (True, None)
        """
        known = ("fold", "max_height", "page_width", "min_text_px")
        unknown = sorted(set(changes) - set(known))
        if unknown:
            raise ConfigError(f"QGraph.with_layout: unknown {unknown}; choose from {list(known)}")
        return QGraph(self.view, self.digraph, replace(self.layout, **changes))

    @property
    def stage(self) -> str:
        """``"float"``, ``"annotated"``, ``"observed"``, ``"converted"`` or ``"quant_nn"``."""
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

    def html(self) -> str:
        """The drawing as HTML for a notebook output: the SVG inline (tooltips on hover), fitted
        to the width, folded when tall (:mod:`qviz.viz.graph.inline_svg`; needs ``dot``).

        Example:
            >>> import shutil, torch, qviz
            >>> g = graph(qviz.export(torch.nn.ReLU(), (torch.randn(2),)))
            >>> g.html().startswith('<div class="qviz-graph-box"') if shutil.which("dot") else True
            True
        """
        return inline_html(self.svg(), self.layout, f"{self.stage} graph, {len(self)} nodes")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        svg = self.svg()
        return {
            "text/html": inline_html(svg, self.layout, f"{self.stage} graph, {len(self)} nodes"),
            "image/svg+xml": svg,
            "text/plain": repr(self),
        }

    def __repr__(self) -> str:
        return f"QGraph(stage={self.stage!r}, nodes={len(self)}, edges={len(self.view.edges)})"


def _highlight_names(highlight: Any) -> tuple[str, ...]:
    """``highlight`` as a tuple of names: None, a name, or a list / tuple / set of names."""
    if highlight is None:
        return ()
    names = (highlight,) if isinstance(highlight, str) else highlight
    if not isinstance(names, list | tuple | set | frozenset) or not all(
        isinstance(n, str) for n in names
    ):
        raise ConfigError(
            f"graph(highlight={highlight!r:.60}): give a node name or module path (a str), a "
            f"list of them, or None"
        )
    return tuple(names)


def _highlight(names: tuple[str, ...], view: GraphView) -> tuple[str, ...]:
    """``names``, each a node of ``view`` (before collapsing) or a module path on its nodes'
    stacks; an unknown one is a ConfigError naming it with the closest names."""
    known = {n.name for n in view.nodes if n.kind != "marker"}
    paths: set[str] = set()
    for node in view.nodes:
        parts = node.module.split(".") if node.module else []
        paths.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    unknown = [n for n in dict.fromkeys(names) if n not in known | paths]
    if unknown:
        each = "; ".join(f"{n!r} ({closest_names(n, known | paths)})" for n in unknown)
        raise ConfigError(
            f"graph(highlight=...): {len(unknown)} name(s) are no node or module path of this "
            f"graph: {each}; give node names as the graph spells them ([n.name for n in "
            f"gm.graph.nodes]) or module paths as model.named_modules() spells them ('layer1')"
        )
    return names


def _table_values(df: Any, column: str | None) -> tuple[dict[str, float], str]:
    """``{node: value}`` from a DataFrame with a "node" column (or indexed by node name)."""
    numeric = [c for c in df.select_dtypes("number").columns if c != "node"]
    if column is None and not numeric:
        raise ConfigError(
            f"metrics: the table has no numeric column (columns: {list(df.columns)}); add one, "
            f"or pass a mapping {{node_name: value}}"
        )
    column = numeric[0] if column is None else column
    if column not in df.columns:
        raise ConfigError(
            f"metric_column={column!r} is not a column of metrics; numeric columns: {numeric}"
        )
    names = df["node"] if "node" in df.columns else df.index
    values: dict[str, float] = {}
    for name, value in zip(names, df[column], strict=True):
        values[str(name)] = min(values.get(str(name), float(value)), float(value))
    return values, str(column)


def _metric_values(metrics: Any, column: str | None) -> tuple[dict[str, float], str]:
    """The metric per node name (the worst, lowest, where a name repeats) and its name, from a
    mapping ``{node_name: float}``, a DataFrame with a ``"node"`` column (or indexed by node
    name), or an object with such a ``.df``. Each op box shows its value, the legend a colour
    bar; names not in the graph are warned about and skipped."""
    if metrics is None:
        return {}, ""
    if callable(getattr(metrics, "graph_metric", None)):  # a record that says what to draw
        values, name = metrics.graph_metric()[:2]
        return {str(k): float(v) for k, v in values.items()}, name
    table = getattr(metrics, "df", metrics)
    if hasattr(table, "select_dtypes") and hasattr(table, "columns"):
        values, name = _table_values(table, column)
    elif hasattr(metrics, "items"):
        values, name = {}, column or ""
        for key, value in metrics.items():
            if not isinstance(value, numbers.Real) or isinstance(value, bool):
                raise ConfigError(
                    f"metrics[{key!r}] = {value!r} is not a number; give {{node_name: float}}"
                )
            values[str(key)] = float(value)
    else:
        raise ConfigError(
            f"metrics is a {type(metrics).__name__}: give a mapping {{node_name: float}}, a "
            f'pandas DataFrame with a "node" column (or indexed by node name), or a report '
            f"with .df"
        )
    return {k: v for k, v in values.items() if not math.isnan(v)}, name


def _with_metrics(view: GraphView, values: dict[str, float], name: str) -> GraphView:
    """``view`` with each named node's value set; unknown names are warned about."""
    known = {n.name for n in view.nodes}
    unknown = sorted(set(values) - known)
    if unknown:
        warnings.warn(
            f"metrics name {len(unknown)} node(s) not in the graph, not drawn: {unknown}; "
            f"use the graph's node names (g.view.nodes)",
            UserWarning,
            stacklevel=3,
        )
    nodes = tuple(
        replace(n, value=values[n.name]) if n.name in values and n.kind != "marker" else n
        for n in view.nodes
    )
    return replace(view, nodes=nodes, metric=name)


def _with_categories(
    view: GraphView, classes: dict[str, str], name: str, colours: dict[str, str]
) -> GraphView:
    """``view`` with each named node coloured by its class (``classes``: node -> class name,
    ``colours``: class name -> fill); the legend lists the classes present."""
    known = {n.name for n in view.nodes}
    nodes = tuple(
        replace(n, category=(classes[n.name], colours[classes[n.name]]))
        if n.name in classes and n.kind != "marker" else n
        for n in view.nodes
    )  # fmt: skip
    present = [c for c in colours if c in {classes[k] for k in classes if k in known}]
    return replace(view, nodes=nodes, metric=name,
                   categories=tuple((c, colours[c]) for c in present))  # fmt: skip


def _apply_metrics(
    view: GraphView,
    model: GraphModule,
    metrics: Any,
    column: str | None,
    span: Any,
    higher: Any,
    bands: Bands | None = None,
) -> GraphView:
    """``view`` coloured by ``metrics`` (see :func:`graph`); a record's own direction and scale
    (a lowering comparison: fewer steps is better, 0 to 4 steps) unless the caller's, or the
    caller's fixed ``bands``."""
    _check_bands(bands, span)
    if metrics is None:
        return view
    check_fingerprint(metrics, model, "graph(metrics=...)")  # another model's is refused
    classes = getattr(metrics, "graph_categories", None)
    if callable(classes) and column in getattr(metrics, "CATEGORY_COLUMNS", ()):
        return _with_categories(view, *classes(column))
    view = _with_metrics(view, *_metric_values(metrics, column))
    own = getattr(metrics, "graph_metric", None)
    _, _, own_higher, own_span = own() if callable(own) else (None, None, True, None)
    higher = own_higher if higher is None else higher
    span = _span(span) if span is not None else own_span
    return replace(view, metric_span=span, higher_is_better=bool(higher), metric_bands=bands)


def _check_bands(bands: Any, span: Any) -> None:
    if bands is not None and not isinstance(bands, Bands):
        raise ConfigError(
            f"metric_bands must be a qviz.display.bands.Bands (e.g. qviz.display.bands.SQNR), got "
            f"{type(bands).__name__}"
        )
    if bands is not None and span is not None:
        raise ConfigError(
            "give metric_range (a gradient from low to high) or metric_bands (fixed bands), "
            "not both"
        )


def _check_model(model: Any) -> None:
    if not isinstance(model, GraphModule):
        raise ConfigError(
            f"graph() draws a graph module, got {type(model).__name__}: pass "
            f"qviz.export(model, inputs), or the result of prepare_pt2e / convert_pt2e"
        )


def _with_partition(view: GraphView, model: GraphModule, lowered: Any) -> GraphView:
    """``view`` with each op a lowered program computes marked with its kernel: integer, or
    float with the backend's reason as tooltip."""
    if lowered is None:
        return view
    if not hasattr(lowered, "kernels") or not hasattr(lowered, "backend"):
        raise ConfigError(
            f"graph(lowered=...) takes what qviz.lower returned, got {type(lowered).__name__}"
        )
    check_fingerprint(lowered, model, "graph(lowered=...)", what="the lowered model")
    runs: dict[str, Any] = {}
    for record in lowered.kernels:
        if record.source and record.kernel in ("integer", "float"):
            # an op split over several kernels is only as integer as its float part
            if runs.get(record.source) is None or record.kernel == "float":
                runs[record.source] = record
    nodes = tuple(
        _marked(n, runs[n.name]) if n.name in runs and n.kind in ("op", "float") else n
        for n in view.nodes
    )
    return replace(view, nodes=nodes, partition=lowered.backend)


def _marked(node: Any, record: Any) -> Any:
    """``node`` with ``record``'s kernel; a float kernel's reason leads its tooltip."""
    tooltip = node.tooltip
    if record.reason:
        tooltip = f"{record.kernel} kernel {record.op}: {record.reason}\\n{tooltip or node.name}"
    return replace(node, kernel=record.kernel, kernel_op=record.op, tooltip=tooltip,
                   kernel_reason=record.reason or "")  # fmt: skip


def _span(metric_range: Any) -> tuple[float, float] | None:
    if metric_range is None:
        return None
    try:
        low, high = (float(v) for v in metric_range)
    except (TypeError, ValueError):
        raise ConfigError(
            f"metric_range must be (low, high) numbers, got {metric_range!r}"
        ) from None
    if not low < high:
        raise ConfigError(f"metric_range: low must be < high, got {metric_range!r}")
    return (low, high)


def graph(
    model: GraphModule,
    *,
    collapse: int | Sequence[str] | None = None,
    highlight: str | Sequence[str] | None = None,
    show_params: bool = False,
    metrics: Any = None,
    metric_column: str | None = None,
    metric_range: tuple[float, float] | None = None,
    higher_is_better: bool | None = None,
    lowered: Any = None,
    metric_bands: Bands | None = None,
    fold: bool | None = None,
) -> QGraph:
    """Draw ``model`` at its stage: captured float, annotated, observed (prepared), converted,
    or exported from a model of quant_nn layers (what each shows: ``qviz.viz.graph.graphs``).

    Args:
        model: a graph module from :func:`qviz.export`, :func:`qviz.prepare_pt2e` or
            :func:`qviz.convert_pt2e`, or exported from a quant_nn model.
        collapse: a module depth (``2``) or module paths (``["layer1"]``) to draw as one box
            each, labelled with the path and op count.
        highlight: node names or module paths drawn with a thick red outline (a name that is
            neither is refused, with the closest names).
        show_params: also draw parameters and constants (get_attr nodes).
        metrics: a value per node to colour op boxes by, low red to high green (e.g. per-layer
            SQNR): ``{node_name: float}``, a DataFrame with a ``"node"`` column, a report
            (``.df``), or a lowering comparison (steps from the reference, fewer is green); a
            collapsed box shows its lowest value; another model's record is refused.
        metric_column: the DataFrame column to draw (default: its first numeric column), a
            mapping's name; ``"cause"`` colours a diagnosis's poor layers by their causes.
        metric_range: ``(low, high)`` for the colour scale, so that several drawings compare
            (default: the values' min..max; values outside are clamped to the ends).
        higher_is_better: green for high values (SQNR, the default); False for errors (MSE).
        lowered: ``qviz.lower(model, ...)``: each op's border says whether the lowered program
            runs it on an integer kernel (blue) or a float one (orange, dashed; hover: why).
        metric_bands: fixed colour bands, the same in every drawing (``qviz.display.bands.SQNR``).
        fold: in a notebook, fold it (True), never (False), or past 2200 px tall (None, default).

    Returns:
        A :class:`QGraph`; it renders itself in Jupyter, ``.save("g.png")`` writes a file.

    Raises:
        ConfigError: not a graph module, or a bad ``collapse``, ``highlight``, ``metrics`` or
            ``metric_column``.
        MissingDependencyError: the graphviz package (or, to render, the dot program) is missing.

    Example:
        >>> import torch, qviz
        >>> gm = qviz.export(torch.nn.Sequential(torch.nn.Linear(2, 2)), (torch.ones(1, 2),))
        >>> [n.label for n in graph(gm, collapse=1).view.nodes if n.kind == "collapsed"]
        ['0']
        >>> "SQNR dB 31.5" in graph(gm, metrics={"linear": 31.5}, metric_column="SQNR dB").dot
        True
    """
    _check_model(model)
    marked = _highlight_names(highlight)
    view = read_graph(model, show_params=show_params)
    settings = (metric_column, metric_range, higher_is_better, metric_bands)
    view = _apply_metrics(view, model, metrics, *settings)
    view = _with_partition(view, model, lowered)
    marked = _highlight(marked, view)
    view = fold_long_edges(collapse_view(view, collapse, (n for n, _ in model.named_modules())))
    return QGraph(view, to_digraph(view, marked), InlineLayout(fold=fold))
