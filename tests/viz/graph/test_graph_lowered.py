"""qviz.viz.graph on a lowered model: the partition (integer / float kernel) drawn on the
converted graph from the lowered program's own records, and the graph coloured by lowering
error (steps from the reference) from compare_lowered."""

import html

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import ConfigError
from qviz.numeric import compare_lowered
from qviz.viz import graph

pytest.importorskip("graphviz")
pytest.importorskip("onnxruntime")


class Net(nn.Module):
    """conv -> relu -> linear, and a second linear the quantizer leaves in float."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(64, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.fc(torch.relu(self.conv(x)).flatten(1)))


@pytest.fixture(scope="module")
def lowered():
    torch.manual_seed(0)
    x = torch.randn(16, 1, 4, 4)
    gm = qviz.export(Net().eval(), (x,))
    config = get_symmetric_quantization_config(is_per_channel=True)
    quantizer = XNNPACKQuantizer().set_global(config).set_module_name("head", None)
    prepared = qviz.prepare_pt2e(gm, quantizer)
    qviz.calibrate(prepared, x, progress=False)
    converted = qviz.convert_pt2e(prepared)
    return converted, x, qviz.lower(converted, (x,), backend="onnxruntime")


def _box(g, name):
    return next(n for n in g.view.nodes if n.name == name)


def test_the_partition_is_drawn_from_the_lowered_programs_records(lowered):
    converted, _, low = lowered
    g = graph(converted, lowered=low)
    by_source = {r.source: r for r in low.kernels if r.kernel in ("integer", "float")}
    conv, fc, head = _box(g, "conv2d"), _box(g, "linear"), _box(g, "linear_1")
    assert (
        (conv.kernel, conv.kernel_op)
        == ("integer", by_source["conv2d"].op)
        == (
            "integer",
            "QLinearConv",
        )
    )
    assert fc.kernel == "integer"
    # the head the quantizer left in float runs on a float kernel, and says why on hover
    assert head.kernel == "float" and by_source["linear_1"].reason in head.tooltip
    assert "integer kernel: QLinearConv" in g.dot and 'style="dashed"' in g.dot
    assert "runs on an integer kernel (onnxruntime)" in g.dot  # the legend


def test_the_graph_is_coloured_by_steps_from_the_reference(lowered):
    converted, x, low = lowered
    comparison = compare_lowered(converted, low, x)
    g = graph(converted, metrics=comparison, lowered=low)
    steps = {r["op"]: r["max_steps"] for r in comparison.rows}
    assert _box(g, "relu").value == steps["relu"] and _box(g, "linear").value == steps["linear"]
    assert g.view.metric == "steps from reference" and not g.view.higher_is_better
    assert g.view.metric_span == (0.0, 4.0)  # a fixed scale: drawings of two models compare
    assert "steps from reference" in g.dot


def test_another_models_lowering_is_refused(lowered):
    converted, x, low = lowered
    other = qviz.export(nn.Sequential(nn.Linear(16, 2)).eval(), (x.flatten(1),))
    with pytest.raises(ConfigError, match=r"graph\(lowered=\.\.\.\)"):
        graph(other, lowered=low)
    with pytest.raises(ConfigError, match=r"takes what qviz\.lower returned"):
        graph(converted, lowered=object())


def test_the_report_shows_the_lowered_program_beside_the_quantization_error(lowered, tmp_path):
    from qviz.viz import report

    converted, x, low = lowered
    comparison = compare_lowered(converted, low, x)
    page = report(converted, tmp_path / "r.html", lowered=low, lowering=comparison).read_text()
    section = page[page.index("On real kernels (onnxruntime)") :]
    assert low.summary().splitlines()[0] in section and "integer kernel: QLinearConv" in section
    # the machine it ran on and the integer format chosen for it, with the reason
    assert html.escape(f"machine: {low.machine}") in section
    assert html.escape(f"format: {low.int_format.name}: {low.int_format.why}") in section
    head = next(r for r in low.float_fallbacks() if r.source == "linear_1")
    assert "left it in float" in head.reason  # not "onnxruntime did not fuse it"
    assert "why float" in section and head.reason in html.unescape(section)
    assert "steps from reference" in section and comparison.df["tensor"].iloc[-1] in section
    other = qviz.lower(converted, (x,), backend="onnxruntime")
    stale = compare_lowered(converted, other, x)
    object.__setattr__(stale, "fingerprint", qviz.engine.graph.fingerprint.fingerprint(nn.ReLU()))
    with pytest.raises(ConfigError, match=r"report\(lowering=\.\.\.\)"):
        report(converted, tmp_path / "s.html", lowered=low, lowering=stale)


def test_a_collapsed_box_keeps_the_partition_and_the_worst_steps(lowered):
    converted, x, low = lowered
    comparison = compare_lowered(converted, low, x)
    g = graph(converted, lowered=low, metrics=comparison, collapse=1)
    boxes = {n.label: n for n in g.view.nodes if n.kind == "collapsed"}
    assert (boxes["conv"].kernel, boxes["fc"].kernel, boxes["head"].kernel) == (
        "integer",
        "integer",
        "float",
    )
    assert "linear_1" in boxes["head"].tooltip  # which op of the box runs in float
    steps = {r["op"]: r["max_steps"] for r in comparison.rows}
    assert boxes["fc"].value == steps["linear"] and boxes["conv"].value is None  # relu: outside
    assert boxes["conv"].kernel_op == "1 op"
