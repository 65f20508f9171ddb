"""``report``: one self-contained HTML file with every view of a prepared or converted model.

The page reads the model's records and the other views: a summary (ops by kind, observers,
sharing groups, nodes left in float and why, from ``model.plan``), the graph
(:func:`qviz.viz.graph`, inline SVG, collapsed by module when it is big), the range overview
(:func:`qviz.viz.ranges`) and one histogram per HistogramObserver group (inline SVG drawn from
:func:`qviz.viz.ranges.histograms.histogram_data`, the numbers :func:`qviz.viz.histogram` draws,
with each method's table) for a prepared model, the plan's group table, and optionally a
numeric-suite table.

It reads on its own: a "How to read this report" section first, and under each table a legend of
its columns (:mod:`qviz.viz.report.guide`). SQNR is coloured by fixed dB bands, in the graph's
boxes and in the tables alike (≤ 10 dB red to > 40 dB green, :mod:`qviz.display.bands`, the bands
the Model Explorer export uses), so a colour means the same in every report. The graph and the
tables are shown whole, the graph scaled to the page's width: only the page scrolls.
Everything is inline: no scripts, stylesheets, images or fonts are fetched, so the file can be
mailed or attached to an issue as is.

Example:
    >>> import tempfile, torch, qviz
    >>> from pathlib import Path
    >>> from torch import nn
    >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
    >>> from qviz.viz.report.html_report import report
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    >>> gm = qviz.export(model, (torch.randn(2, 4),))
    >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    >>> prepared = qviz.prepare_pt2e(gm, q)
    >>> prepared = qviz.calibrate(prepared, [torch.randn(2, 4)], progress=False)
    >>> out = report(prepared, Path(tempfile.mkdtemp()) / "r.html", title="tiny")
    >>> text = out.read_text()
    >>> "<svg" in text and "data:image/png;base64," in text and "<script" not in text
    True
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections import Counter
from pathlib import Path
from typing import Any

from qviz.display.bands import bands_for
from qviz.engine.graph.fingerprint import check_fingerprint
from qviz.engine.pt2e.plan import plan_of
from qviz.errors import CalibrationError, ConfigError, MissingDependencyError
from qviz.viz.report.tables import COLUMN_GROUPS, frame_tables, table

#: Graphs with more drawn nodes than this are redrawn collapsed to module depth ``_COLLAPSE``.
_BIG_GRAPH = 150
_COLLAPSE = 2
#: The graph shrinks to the page's width no further than its smallest text stays this big (px).
_MIN_TEXT_PX = 10.0
#: At most this many per-observer histograms; the rest are counted in a note.
_MAX_HISTOGRAMS = 40

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1300px; padding: 16px 24px; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc;
       padding-bottom: 4px; margin-top: 1.6em; } .sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top;
       overflow-wrap: anywhere; }
th { background: #f3f3f3; position: sticky; top: 0; } tr:nth-child(even) td { background: #fafafa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.graph { border: 1px solid #eee; text-align: center; }
.graph svg { max-width: 100%; height: auto; }
h3 { margin: 1.2em 0 0.2em; } .guide { background: #f7f9fc; padding: 4px 16px 8px; }
.bands { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 13px; margin: 6px 0; }
.swatch { display: inline-block; width: 14px; height: 14px; margin-right: 5px;
       vertical-align: -2px; border: 1px solid #888; }
dl.terms { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px;
       font-size: 13px; margin: 4px 0 12px; } dl.terms dt { font-family: monospace; }
dl.terms dd { margin: 0; color: #444; }
figure { margin: 12px 0 20px; } figure img { max-width: 100%; height: auto; }
figcaption { font-size: 13px; color: #444; word-break: break-word; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 6px 10px; margin: 8px 0; }
.stats { display: flex; flex-wrap: wrap; gap: 12px; } .stat { background: #f3f6fa;
       border-radius: 6px; padding: 8px 14px; } .stat b { font-size: 1.4em; display: block; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 8px; }
"""


def report(
    model: Any,
    path: str | os.PathLike[str],
    *,
    ns: Any = None,
    title: str | None = None,
    lowered: Any = None,
    lowering: Any = None,
) -> Path:
    """Write one self-contained HTML page with the summary, graph, ranges, histograms and plan.

    Args:
        model: a model from ``qviz.prepare_pt2e`` (best after ``qviz.calibrate``) or from
            ``qviz.convert_pt2e``; it must carry ``.plan``. A converted model has no observers,
            so the page shows its graph and plan tables but no ranges or histograms.
        path: the ``.html`` file to write; its folder must exist.
        ns: optional numeric-suite results: a pandas DataFrame, or an object with a ``.df``
            DataFrame (e.g. the result of ``qviz.numeric.compare``), shown as a table.
        title: the page heading (default ``"qviz report"``).
        lowered: ``qviz.lower(model, ...)`` of a converted ``model``: a section with its kernels
            (integer / float, and why), size and the graph with the partition drawn;
            ``lowering``, ``qviz.numeric.compare_lowered(...)`` of it, colours that graph by
            steps from the reference (the first graph keeps the quantization error).

    Returns:
        The path written, as a :class:`pathlib.Path`.

    Raises:
        ConfigError: ``model`` has no ``.plan``, the folder of ``path`` does not exist,
            ``ns`` is not a DataFrame, or ``ns``, ``lowered`` or ``lowering`` measured another
            model.

    Example:
        >>> import tempfile, torch, qviz
        >>> from pathlib import Path
        >>> from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
        >>> gm = qviz.export(torch.nn.Linear(3, 2).eval(), (torch.randn(1, 3),))
        >>> q = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        >>> prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), [torch.randn(1, 3)],
        ...                           progress=False)
        >>> report(prepared, Path(tempfile.mkdtemp()) / "p.html").suffix
        '.html'
    """
    plan = _plan_of(model)
    out = _check_path(path)
    frame = _frame_of(ns) if ns is not None else None
    check_fingerprint(ns, model, "report(ns=...)")  # a report of another model: refused
    from qviz.viz.graph.read_graph import stage_of

    stage = stage_of(model)
    heading = "qviz report" if title is None else str(title)
    sections = _sections(model, plan, stage, ns, frame)
    if lowered is not None:
        sections.append(_lowered_section(model, lowered, lowering))
    sections.insert(0, _guide_section(frame, lowered is not None))
    out.write_text(_page(heading, stage, sections), encoding="utf-8")
    return out


def _guide_section(frame: Any, lowered: bool) -> str:
    from qviz.viz.report.guide import guide

    text = guide(numeric=frame is not None, coloured=_has_local_sqnr(frame), lowered=lowered)
    body = f'<div class="guide">{text}</div>'
    return _section("How to read this report", body)


def _sections(model: Any, plan: Any, stage: str, ns: Any, frame: Any) -> list[str]:
    from qviz.display.bands import SQNR

    coloured = {"metric_column": "local_sqnr", "metric_bands": SQNR}  # fixed dB bands
    sections = [
        _summary_section(model, plan, stage),
        _transforms_section(plan),
        _graph_section(model, ns, **coloured) if _has_local_sqnr(frame) else _graph_section(model),
        _ranges_section(model, stage),
        _histogram_section(model, plan, stage),
        _groups_section(plan),
    ]
    sections = [s for s in sections if s]
    if frame is not None:
        sections.append(_numeric_section(ns, frame))
    return sections


def _plan_of(model: Any) -> Any:
    plan = plan_of(model)
    if plan is None:
        raise ConfigError(
            f"report() reads the QuantPlan of a quantized model, got {type(model).__name__} "
            f"without .plan: pass a model from qviz.prepare_pt2e (after qviz.calibrate) or "
            f"qviz.convert_pt2e"
        )
    return plan


def _check_path(path: str | os.PathLike[str]) -> Path:
    try:
        out = Path(path)
    except TypeError as exc:
        raise ConfigError(f"path must be a file path, got {type(path).__name__}") from exc
    if not out.parent.is_dir():
        raise ConfigError(
            f"cannot write the report to {out}: folder {out.parent} does not exist; create it "
            f"first (Path({str(out.parent)!r}).mkdir(parents=True)) or pass another path"
        )
    if out.is_dir():
        raise ConfigError(f"{out} is a folder: pass a file path such as {out / 'report.html'}")
    return out


def _frame_of(ns: Any) -> Any:
    frame = getattr(ns, "df", ns)
    if not callable(getattr(frame, "to_html", None)):
        raise ConfigError(
            f"ns must be a pandas DataFrame or an object with a .df DataFrame (the result of "
            f"qviz.numeric.compare), got {type(ns).__name__}"
        )
    return frame


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _section(heading: str, body: str) -> str:
    return f"<section>\n<h2>{_esc(heading)}</h2>\n{body}\n</section>"


def _note(text: str) -> str:
    return f'<p class="note">{_esc(text)}</p>'


def _op_counts(model: Any, observers: set[str]) -> Counter:
    """Ops by kind: call_function targets and non-observer modules (torch.export guards
    skipped); observers are counted from the plan instead."""
    counts: Counter = Counter()
    for node in model.graph.nodes:
        if node.op == "call_function":
            name = getattr(node.target, "__name__", str(node.target))
            counts[name.removesuffix(".default")] += 1
        elif node.op == "call_module":
            target = str(node.target)
            if target not in observers and not target.startswith("_guards"):
                counts[type(model.get_submodule(target)).__name__] += 1
    return counts


def _summary_section(model: Any, plan: Any, stage: str) -> str:
    counts = _op_counts(model, plan.observer_names())
    shared = [g for g in plan.groups if len(g.members) > 1]
    stats = [
        ("stage", stage),
        ("ops", sum(counts.values())),
        ("observer groups" if stage == "observed" else "groups in the plan", len(plan.groups)),
        ("observed tensors", len(plan.tensors)),
        ("groups shared by several tensors", len(shared)),
        ("nodes left in float", len(plan.float_nodes)),
    ]
    cards = "".join(f'<div class="stat"><b>{_esc(v)}</b>{_esc(k)}</div>' for k, v in stats)
    ops = table(["op", "count"], counts.most_common())
    parts = [f'<div class="stats">{cards}</div>', "<h3>Ops by kind</h3>", ops]
    parts.append("<h3>Nodes left in float</h3>")
    if plan.float_nodes:
        rows = [(f.node, f.op, str(f.reason), f.detail) for f in plan.float_nodes]
        parts.append(table(["node", "op", "reason", "detail"], rows))
    else:
        parts.append("<p>None: every quantizable op is annotated.</p>")
    return _section("Summary", "\n".join(parts))


def _has_local_sqnr(frame: Any) -> bool:
    return frame is not None and "local_sqnr" in getattr(frame, "columns", ())


def _numeric_section(ns: Any, frame: Any) -> str:
    """The numeric suite's summary, its SQNR bars (for a NumericReport) and its table, split
    by what the columns tell (error, output grid, slices), SQNR and clipped cells coloured by
    the fixed bands, each part with its columns' legend."""
    from qviz.display.bands import SQNR
    from qviz.numeric.compare.report import NumericReport
    from qviz.viz.report.guide import band_legend

    parts = []
    if isinstance(ns, NumericReport):
        parts.append(f"<p>{_esc(ns.summary())}</p>")
        parts.append(_figure(ns.plot(), "local (own) and cumulative SQNR per operator, dB"))
    if any(bands_for(c) is SQNR for c in frame.columns):
        parts.append(f"<p>SQNR cells, by the fixed bands:</p>{band_legend(SQNR)}")
    parts.append(frame_tables(frame, COLUMN_GROUPS))
    return _section("Numeric suite", "".join(parts))


def _graph_section(model: Any, metrics: Any = None, heading: str = "Graph", **kw: Any) -> str:
    """The graph as inline SVG (collapsed by module when big); ``kw`` goes to ``graph``."""
    return _section(heading, _graph_body(model, metrics, **kw))


def _graph_body(model: Any, metrics: Any = None, **kw: Any) -> str:
    from qviz.viz.graph.graphs import graph

    try:
        drawn = graph(model, metrics=metrics, **kw)
        note = ""
        if len(drawn) > _BIG_GRAPH:
            note = (
                f"The graph has {len(drawn)} nodes; modules are collapsed to depth {_COLLAPSE} "
                f"(draw it whole with qviz.viz.graph(model))."
            )
            drawn = graph(model, collapse=_COLLAPSE, metrics=metrics, **kw)
        svg = _page_svg(drawn.svg(), "lowered-" if "lowered" in kw else "graph-")
    except MissingDependencyError as exc:
        return _note(f"The graph could not be drawn: {exc}")
    return (_note(note) if note else "") + f'<div class="graph">{svg}</div>'


def _page_svg(svg: str, prefix: str) -> str:
    """A Graphviz document as an element of the page (:mod:`qviz.viz.graph.inline_svg`): no prolog,
    tooltips that show on hover, ids unique on the page, and scaled to the page's width
    (``.graph svg`` in the CSS) no further than its smallest text stays 10 px; a graph too
    wide for that makes the page, not a box of its own, scroll sideways."""
    from qviz.viz.graph.inline_svg import (
        strip_prolog,
        svg_size,
        text_px,
        title_tooltips,
        unique_ids,
    )

    body = title_tooltips(unique_ids(strip_prolog(svg), prefix))
    width, text = svg_size(body)[0], text_px(body)
    smallest = width * min(1.0, _MIN_TEXT_PX / text) if text else 0.0
    return body.replace("<svg", f'<svg style="min-width:{smallest:.0f}px"', 1)


def _lowered_section(model: Any, lowered: Any, lowering: Any) -> str:
    """The lowered program: summary (with the machine, the integer format chosen for it and
    any speed measured), float kernels and why, the graph with the partition drawn
    (coloured by steps from the reference when ``lowering`` is given) and that table."""
    for record, where in ((lowered, "lowered"), (lowering, "lowering")):
        check_fingerprint(record, model, f"report({where}=...)", what=f"the {where} record")
    head = [
        line.strip() for line in lowered.summary().splitlines() if not line.startswith("  float:")
    ]
    parts = ["<p>" + "<br>".join(_esc(line) for line in head) + "</p>"]
    fallbacks = lowered.float_fallbacks()
    if fallbacks:
        rows = [(r.source or r.node, r.op, r.where, r.reason) for r in fallbacks]
        parts.append(table(("node", "kernel", "runs on", "why float"), rows))
    parts.append(_graph_body(model, lowering, lowered=lowered))
    if lowering is not None:
        from qviz.viz.report.guide import LOWERING_TERMS

        parts.append(f"<p>{_esc(repr(lowering))}</p>")
        parts.append(frame_tables(lowering.df, terms=LOWERING_TERMS))
    return _section(f"On real kernels ({lowered.backend})", "".join(parts))


def _figure(fig: Any, caption: str) -> str:
    """``fig`` as an inline base64 PNG in a <figure>; the figure is cleared to free memory."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=100)
    finally:
        fig.clf()
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    img = f'<img alt="{_esc(caption)}" src="data:image/png;base64,{data}">'
    return f"<figure>{img}<figcaption>{_esc(caption)}</figcaption></figure>"


def _histogram_figure(data: Any, caption: str) -> str:
    """One observer's histogram as inline SVG (log counts), its methods' table and a caption."""
    from qviz.viz.ranges.histogram_svg import histogram_svg, rows_html

    own = next((r["method"] for r in data.rows if r.get("current")), None)
    note = f"<div class='sub'>{_esc(data.note)}</div>" if data.note else ""
    svg = histogram_svg(data, log=True, width=560, height=240, highlight=own)
    table = rows_html(data.rows, highlight=own)
    return f"<figure>{svg}{table}{note}<figcaption>{_esc(caption)}</figcaption></figure>"


def _ranges_section(model: Any, stage: str) -> str:
    if stage != "observed":
        return _section("Ranges and histograms", _note(_NO_OBSERVERS.format(stage=stage)))
    from qviz.viz.ranges.range_view import ranges

    try:
        fig = ranges(model)
    except CalibrationError as exc:
        return _section("Ranges", _note(f"No range overview: {exc}"))
    caption = "Observed range (thin line) and quantization range (bar) of every observer group"
    return _section("Ranges", _figure(fig, caption))


_NO_OBSERVERS = (
    "This model is {stage}: it has no observers, so there are no ranges or histograms to draw. "
    "The plan's qparams are in the group table; run report() on the calibrated model from "
    "qviz.prepare_pt2e to see them."
)


def _histogram_section(model: Any, plan: Any, stage: str) -> str:
    if stage != "observed":
        return ""
    from qviz.engine.observers import HistogramObserver, OrderFreeHistogramObserver
    from qviz.viz.ranges.histograms import histogram_data

    kinds = (HistogramObserver, OrderFreeHistogramObserver)
    groups = [g for g in plan.groups if isinstance(_submodule(model, g.observer), kinds)]
    if not groups:
        return _section("Histograms", "<p>No group uses a HistogramObserver.</p>")
    figures, empty = [], []
    for g in groups[:_MAX_HISTOGRAMS]:
        try:
            data = histogram_data(model.get_submodule(g.observer))
        except CalibrationError:
            empty.append(g.observer)
            continue
        members = ", ".join(str(m) for m in g.members)
        figures.append(_histogram_figure(data, f"group {g.group} ({g.observer}): {members}"))
    notes = []
    others = len(plan.groups) - len(groups)
    if others:
        notes.append(
            f"<p>{others} groups use other observers (e.g. per-channel min/max for "
            f"weights); their ranges are in the overview above.</p>"
        )
    if empty:
        notes.append(_note(f"Saw no data (run qviz.calibrate first): {', '.join(empty)}"))
    if len(groups) > _MAX_HISTOGRAMS:
        left = len(groups) - _MAX_HISTOGRAMS
        notes.append(
            _note(
                f"{left} more HistogramObserver groups are left out (the first "
                f"{_MAX_HISTOGRAMS} are shown); draw one with "
                f"qviz.viz.histogram(model.get_submodule(name))."
            )
        )
    from qviz.viz.report.guide import HISTOGRAM_TERMS, glossary

    legend = (
        "<p>Each histogram: the values the observer saw (count axis logarithmic), a dashed line "
        "at the range each calibration method would pick, dotted at the observer's own. Its "
        "table:</p>" + glossary(HISTOGRAM_TERMS, HISTOGRAM_TERMS)
    )
    body = legend + "".join(notes) + f'<div class="grid">{"".join(figures)}</div>'
    heading = f"Histograms ({len(groups)} HistogramObserver groups, counts on a log axis)"
    return _section(heading, body)


def _submodule(model: Any, name: str) -> Any:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def _spec_range(spec: dict[str, Any]) -> str:
    if spec.get("quant_min") is None:
        return ""
    return f"[{spec['quant_min']}, {spec['quant_max']}]"


def _qparams_text(qparams: dict[str, Any] | None) -> str:
    if not qparams:
        return ""
    scale, zero_point = qparams["scale"], qparams["zero_point"]
    if isinstance(scale, list | tuple):
        zps = sorted(set(zero_point))
        zp = str(zps[0]) if len(zps) == 1 else f"{min(zps)}..{max(zps)}"
        return f"scale {min(scale):.4g}..{max(scale):.4g} ({len(scale)} channels), zp {zp}"
    return f"scale {scale:.4g}, zp {zero_point}"


def _member_text(member: dict[str, Any]) -> str:
    consumer = member.get("consumer")
    return member["producer"] if consumer is None else f"{member['producer']} -> {consumer}"


def _groups_section(plan: Any) -> str:
    records = plan.to_records("groups")
    converted = any(r.get("qparams") for r in records)
    headers = ["group", "observer", "members", "kind", "dtype", "range", "qscheme", "ch_axis"]
    rows = []
    for r in records:
        spec = r["spec"]
        members = "\n".join(_member_text(m) for m in r["members"])
        row = [r["group"], r["observer"], members, spec["kind"], spec.get("dtype") or ""]
        row += [_spec_range(spec), spec.get("qscheme") or "", spec.get("ch_axis")]
        if converted:
            row.append(_qparams_text(r.get("qparams")))
        rows.append(row)
    if converted:
        headers.append("qparams")
    from qviz.viz.report.guide import PLAN_TERMS, glossary

    body = table(headers, rows) + glossary(headers, PLAN_TERMS)
    return _section(f"Plan: {len(records)} observer groups", body)


def _transforms_section(plan: Any) -> str:
    """The repair transforms applied to the model, in order (``plan.transforms``)."""
    records = getattr(plan, "transforms", ())
    if not records:
        return ""
    rows = [
        (r.kind, ", ".join(r.nodes), r.detail, ", ".join(f"{k}={v:.4g}" if isinstance(v, float)
         else f"{k}={v}" for k, v in r.params))
        for r in records
    ]  # fmt: skip
    body = table(("transform", "nodes", "what and why", "numbers"), rows)
    return _section(f"Repair transforms: {len(records)}", body)


def _page(heading: str, stage: str, sections: list[str]) -> str:
    import torch

    sub = f"stage: {stage} · torch {torch.__version__} · written by qviz.viz.report"
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_esc(heading)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f'<h1>{_esc(heading)}</h1>\n<p class="sub">{_esc(sub)}</p>\n'
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )
