"""Long edges drawn as reference boxes: nothing lost, small graphs untouched, dot lays them out
where they belong. Structure and DOT text, not pixels, and no timing (benchmarks/viz.py times)."""

import re
import shutil
import subprocess

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.viz import graph
from qviz.viz.graph.dot import to_digraph
from qviz.viz.graph.graph_records import GraphView, ViewEdge, ViewNode
from qviz.viz.graph.long_edges import fold_long_edges, ranks, virtual_nodes
from qviz.viz.graph.read_graph import read_graph
from qviz.widgets.kit.graph_widget import marker_refs

pytest.importorskip("graphviz")
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="needs graphviz's dot")


class DenseBlock(nn.Module):
    """DenseNet's pattern: every layer reads the concatenation of all earlier outputs."""

    def __init__(self, layers: int = 40, growth: int = 2) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, growth, 1)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Conv2d(growth * (i + 1), growth, 1), nn.ReLU()) for i in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return torch.cat(features, 1).mean((2, 3))


@pytest.fixture(scope="module")
def dense_prepared():
    torch.manual_seed(0)
    gm = qviz.export(DenseBlock().eval(), (torch.randn(1, 1, 2, 2),))
    return qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config()))


def _pairs(view: GraphView) -> set[tuple[str, str]]:
    return {(e.src, e.dst) for e in view.edges}


def _chain_with_skip(n: int) -> GraphView:
    nodes = tuple(
        ViewNode(name=f"n{i}", kind="op", label="relu", module=f"m.{i // 4}") for i in range(n)
    )
    edges = [ViewEdge(f"n{i}", f"n{i + 1}") for i in range(n - 1)]
    return GraphView(
        stage="float", nodes=nodes, edges=(*edges, ViewEdge("n0", f"n{n - 1}", "int8", "tip"))
    )


def test_ranks_are_longest_paths_with_sources_pulled_down_to_their_consumer():
    view = GraphView(
        stage="float",
        nodes=tuple(ViewNode(name=x, kind="op", label=x) for x in ("x", "a", "b", "c", "w")),
        edges=(ViewEdge("x", "a"), ViewEdge("a", "b"), ViewEdge("b", "c"), ViewEdge("x", "c"),
         ViewEdge("w", "c")),
    )  # fmt: skip
    assert ranks(view) == {"x": 0, "a": 1, "b": 2, "c": 3, "w": 2}
    assert virtual_nodes(view) == 2  # x -> c spans 3 ranks


def test_a_node_drawn_in_its_consumers_cluster_is_ranked_just_above_the_consumer():
    # a converted graph's dequantize carries the module of the op it feeds, so dot draws it in
    # that op's cluster, far from the quantize it reads: the long edge is quantize -> dequantize
    chain = [ViewNode(name=f"op{i}", kind="op", label="relu", module="body") for i in range(5)]
    q = ViewNode(name="q", kind="quantize", label="quantize", module="stem")
    dq = ViewNode(name="dq", kind="dequantize", label="dequantize", module="head")
    cat = ViewNode(name="cat", kind="op", label="cat", module="head")
    edges = [ViewEdge("q", "op0"), *(ViewEdge(f"op{i}", f"op{i + 1}") for i in range(4))]
    view = GraphView(
        stage="converted",
        nodes=(q, *chain, dq, cat),
        edges=(*edges, ViewEdge("q", "dq"), ViewEdge("dq", "cat"), ViewEdge("op4", "cat")),
    )
    rank = ranks(view)
    assert (rank["q"], rank["dq"], rank["cat"]) == (0, 5, 6)
    folded = fold_long_edges(view, budget=0, min_span=2)
    assert [n.refs for n in folded.nodes if n.kind == "ref"] == [("q -> dq",)]


def test_a_graph_within_budget_is_returned_unchanged():
    view = _chain_with_skip(12)
    assert fold_long_edges(view) is view
    assert fold_long_edges(view, budget=0, min_span=20) is view


def test_a_folded_edge_becomes_a_reference_box_above_its_consumer_naming_the_source():
    view = _chain_with_skip(12)
    folded = fold_long_edges(view, budget=0, min_span=2)
    assert ("n0", "n11") not in _pairs(folded)
    ref = next(n for n in folded.nodes if n.kind == "ref")
    assert (ref.name, ref.label, ref.refs, ref.module) == ("ref/n11", "from n0", ("n0 -> n11",),
                                                            "m.2")  # fmt: skip
    assert "n0 -> n11: tip" in ref.tooltip  # the edge's own text survives in the tooltip
    assert ViewEdge("ref/n11", "n11", style="ref") in folded.edges
    assert virtual_nodes(folded) == 0


def test_folding_a_dense_block_keeps_every_edge_drawn_or_named(dense_prepared):
    view = read_graph(dense_prepared)
    folded = fold_long_edges(view)
    refs = [n for n in folded.nodes if n.kind == "ref"]
    assert refs, "a 40-layer dense block is over the budget"
    listed = "\n".join(n.tooltip.replace("\\n", "\n") for n in refs)
    named = set(re.findall(r"^  (\S+) -> (\S+)$", listed, re.M))
    drawn = {p for p in _pairs(folded) if not p[0].startswith("ref/")}
    assert drawn | named == _pairs(view) and not drawn & named
    assert virtual_nodes(folded) < virtual_nodes(view)
    for ref in refs:  # each box sits in its consumer's module and names markers by producer
        consumer = next(n for n in folded.nodes if n.name == ref.name.removeprefix("ref/"))
        assert ref.module == consumer.module
        assert all(r.endswith(f" -> {consumer.name}") and "obs/" not in r for r in ref.refs)
        assert re.fullmatch(r"from .+ \(g\d+\)(, .+)*", ref.label.replace("\\n", ", "))


def test_graph_folds_only_over_budget_and_the_widget_can_select_what_a_box_names(dense_prepared):
    small = qviz.export(nn.Sequential(nn.Linear(2, 2), nn.ReLU()).eval(), (torch.randn(1, 2),))
    assert "ref/" not in graph(small).dot
    g = graph(dense_prepared)
    refs = {n.name: list(n.refs) for n in g.view.nodes if n.kind == "ref"}
    assert refs and all(marker_refs(g)[name] == edges for name, edges in refs.items())
    assert "from ...: inputs whose edges are too long to draw" in g.dot  # the legend says so
    assert len(re.findall(r'"ref/\w+" -> \w+ \[color="#9e9e9e" style=dotted\]', g.dot)) == len(refs)


@needs_dot
def test_dot_draws_each_reference_box_one_rank_above_its_consumer(dense_prepared):
    view = fold_long_edges(read_graph(dense_prepared))
    plain = subprocess.run(
        ["dot", "-Tplain"], input=to_digraph(view).source, capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    assert "Warning" not in plain
    y = {m[1]: float(m[2]) for m in re.finditer(r'^node "?([^" ]+)"? [\d.]+ ([\d.]+)', plain, re.M)}
    rows = sorted(set(y.values()), reverse=True)
    for ref in (n for n in view.nodes if n.kind == "ref"):
        consumer = ref.name.removeprefix("ref/")
        assert rows.index(y[consumer]) - rows.index(y[ref.name]) == 1, ref.name
