"""to_model_explorer: node data keyed by the ids Model Explorer's PyTorch adapter gives.

Two references, independent of qviz:

* the adapter itself (``ai-edge-model-explorer``, a test extra; those tests are skipped when it
  is absent): ``PytorchExportedProgramAdapterImpl(program).convert()`` gives the graph id and
  node ids, and ``node_data_builder`` the JSON the app reads;
* the format as the adapter's source documents it (one graph, id ``"graph"``; a node's id is its
  FX node's name; ``ModelNodeData = {graph id: GraphNodeData}``; thresholds take the first band
  whose ``value`` is at least the node's value), checked without the package against the
  ExportedProgram's own node names and the report's own rows.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import qviz
import qviz.numeric
from qviz.display.bands import GREEN, RED, YELLOW
from qviz.engine.compat import quantized_decomposed
from qviz.errors import ConfigError
from qviz.numeric.compare.report import NumericReport
from qviz.viz import to_model_explorer
from qviz.viz.model_explorer import GRAPH_ID, SQNR_CAP, node_data

pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def digits():
    """The digits model: float graph module, converted model, report, the two programs."""
    from qviz.data import digits_loaders, digits_model
    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    loaders = digits_loaders(batch_size=60)
    calib = [x for x, _ in loaders.calibration][:3]
    model = digits_model()
    gm = qviz.export(model, (calib[0],))
    config = get_symmetric_quantization_config(is_per_channel=True)
    prepared = qviz.prepare_pt2e(gm, XNNPACKQuantizer().set_global(config))
    quantized = qviz.convert_pt2e(qviz.calibrate(prepared, calib, progress=False))
    report = qviz.numeric.compare(gm, quantized, calib[:2], progress=False)
    return {
        "gm": gm,
        "quantized": quantized,
        "report": report,
        "float_program": torch.export.export(model, (calib[0],)),
        "quantized_program": torch.export.export(quantized, (calib[0],)),
    }


def _read(data, column):
    return json.loads(
        data.files[column].read_text(), parse_constant=lambda c: pytest.fail(f"JSON has {c}")
    )


def _results(data, column):
    return {k: v["value"] for k, v in _read(data, column)[GRAPH_ID]["results"].items()}


def _report(report, column):
    return {
        r.node: getattr(r, column)
        for r in report.df.itertuples()
        if not math.isnan(getattr(r, column))
    }


def _me_colour(value, graph):
    """Model Explorer's getBgColor over thresholds (its web app: first band with value <= v)."""
    return next((t["bgColor"] for t in graph["thresholds"] if value <= t["value"]), None)


# -- the documented format, without the package ---------------------------------------------------
def test_float_program_ids_are_its_node_names_and_values_the_reports(digits, tmp_path):
    program, report = digits["float_program"], digits["report"]
    data = to_model_explorer(program, report, path=tmp_path)
    assert sorted(data.files) == ["clipped", "cumulative_sqnr", "local_sqnr"]  # float: no scales
    names = {n.name for n in program.graph.nodes}
    for column in data.files:
        results = _results(data, column)
        assert set(results) <= names
        assert results == pytest.approx(_report(report, column))
        assert data.nodes[column] == len(results)
    # the conv with its BatchNorm folded in carries the pair's figures; the BatchNorm none
    local = _results(data, "local_sqnr")
    assert "conv2d" in local and "batch_norm" not in local


def test_quantized_program_ids_follow_re_export(digits, tmp_path):
    program, report, quantized = digits["quantized_program"], digits["report"], digits["quantized"]
    data = to_model_explorer(program, report, path=tmp_path)
    assert list(data.files) == ["local_sqnr", "cumulative_sqnr", "clipped", "scale"]
    names = {n.name for n in program.graph.nodes}
    # re-export renames the quantize / dequantize nodes: the ids are the program's, not the
    # converted graph module's
    renamed = {n.name for n in quantized.graph.nodes} - names
    assert any(name.startswith("quantize_per_tensor_default") for name in renamed)
    local = _results(data, "local_sqnr")
    assert set(local) <= names and local == pytest.approx(_report(report, "local_sqnr"))
    # scales: each operator's output quantize in the converted graph, read independently
    quantize = quantized_decomposed().quantize_per_tensor.default
    expected = {
        n.name: float(u.args[1])
        for n in quantized.graph.nodes
        if n.op == "call_function" and n.target is not quantize
        for u in n.users
        if u.target is quantize
    }
    scales = _results(data, "scale")
    operators = {k: v for k, v in scales.items() if k in expected}
    assert operators == pytest.approx(expected) and len(operators) >= 10
    assert set(scales) <= names


def test_float_graph_module_gives_the_float_programs_ids(digits, tmp_path):
    from_program = to_model_explorer(digits["float_program"], digits["report"], path=tmp_path / "a")
    from_gm = to_model_explorer(digits["gm"], digits["report"], path=tmp_path / "b")
    for column in from_program.files:
        assert _read(from_gm, column) == _read(from_program, column)


def test_schema_is_model_node_data_with_ascending_bands(digits, tmp_path):
    data = to_model_explorer(digits["quantized_program"], digits["report"], path=tmp_path)
    for column in data.files:
        top = _read(data, column)
        assert list(top) == [GRAPH_ID]
        graph = top[GRAPH_ID]
        assert graph["name"] == f"qviz {column}"
        for result in graph["results"].values():
            assert list(result) == ["value"] and math.isfinite(result["value"])
        if "thresholds" in graph:
            values = [t["value"] for t in graph["thresholds"]]
            assert values == sorted(values)
            assert all(t["bgColor"].startswith("#") for t in graph["thresholds"])
        else:
            assert [g["stop"] for g in graph["gradient"]] == [0, 1]
    assert set(data.node_data_paths.split(",")) == {str(p) for p in data.files.values()}
    assert [d["node_data_path"] for d in data.node_data] == [str(p) for p in data.files.values()]


def test_sqnr_colours_low_red_high_green_and_infinity_capped():
    graph = node_data("local_sqnr", {"a": 5.0, "b": 25.0, "c": 45.0, "d": math.inf})[GRAPH_ID]
    assert graph["results"]["d"] == {"value": SQNR_CAP}
    colours = {k: _me_colour(v["value"], graph) for k, v in graph["results"].items()}
    assert colours == {"a": RED, "b": YELLOW, "c": GREEN, "d": GREEN}  # qviz.display.bands
    clipped = node_data("clipped", {"none": 0.0, "much": 0.05})[GRAPH_ID]
    assert _me_colour(0.0, clipped) == GREEN and _me_colour(0.05, clipped) == RED
    single = node_data("scale", {"a": 0.5})[GRAPH_ID]  # a gradient over one value colours nothing
    assert "gradient" not in single and _me_colour(0.5, single) is not None


def test_report_none_writes_the_scales_of_a_quantized_program(digits, tmp_path):
    data = to_model_explorer(digits["quantized_program"], path=tmp_path)
    assert list(data.files) == ["scale"] and data.nodes["scale"] > 10


def test_columns_choose_what_is_written(digits, tmp_path):
    data = to_model_explorer(
        digits["float_program"], digits["report"], path=tmp_path, columns=["weight_sqnr"]
    )
    assert list(data.files) == ["weight_sqnr"]
    assert _results(data, "weight_sqnr") == pytest.approx(_report(digits["report"], "weight_sqnr"))


def test_model_and_report_are_not_changed(digits, tmp_path):
    program = digits["quantized_program"]
    before = [(n.name, n.op, str(n.target), sorted(n.meta)) for n in program.graph.nodes]
    df = digits["report"].df.copy()
    to_model_explorer(program, digits["report"], path=tmp_path)
    assert [(n.name, n.op, str(n.target), sorted(n.meta)) for n in program.graph.nodes] == before
    assert digits["report"].df.equals(df)


# -- refusals -------------------------------------------------------------------------------------
def test_refuses_what_is_not_an_exported_graph(digits, tmp_path):
    from qviz.data import digits_model

    with pytest.raises(ConfigError, match=r"torch.export.export\(model, example_inputs\)"):
        to_model_explorer(digits_model(), digits["report"], path=tmp_path)
    with pytest.raises(ConfigError, match=r"torch.export.export\(quantized, example_inputs\)"):
        to_model_explorer(digits["quantized"], digits["report"], path=tmp_path)


def test_refuses_a_report_from_another_model(digits, tmp_path):
    other = NumericReport.from_table([{"node": "linear_7", "op": "linear", "local_sqnr": 20.0}])
    with pytest.raises(ConfigError, match=r"does not match this ExportedProgram.*linear_7"):
        to_model_explorer(digits["float_program"], other, path=tmp_path)
    wrong_op = NumericReport.from_table([{"node": "conv2d", "op": "linear", "local_sqnr": 1.0}])
    with pytest.raises(ConfigError, match="does not match"):
        to_model_explorer(digits["float_program"], wrong_op, path=tmp_path)
    with pytest.raises(ConfigError, match="NumericReport"):
        to_model_explorer(digits["float_program"], {"node": ["conv2d"]}, path=tmp_path)


def test_refuses_bad_columns_and_nothing_to_write(digits, tmp_path):
    with pytest.raises(ConfigError, match=r"local_sqrn.*closest"):
        to_model_explorer(
            digits["float_program"], digits["report"], path=tmp_path, columns=["local_sqrn"]
        )
    with pytest.raises(ConfigError, match="'scale' needs a quantized model"):
        to_model_explorer(
            digits["float_program"], digits["report"], path=tmp_path, columns=["scale"]
        )
    with pytest.raises(ConfigError, match="nothing to write"):
        to_model_explorer(digits["float_program"], path=tmp_path)


def test_refuses_a_path_that_cannot_be_written(digits, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    for path in (blocker, blocker / "sub"):
        with pytest.raises(ConfigError, match="folder as path="):
            to_model_explorer(digits["quantized_program"], path=path)
    with pytest.raises(ConfigError, match="folder path"):
        to_model_explorer(digits["quantized_program"], path=None)


# -- Model Explorer's own adapter and node data builder ------------------------------------------
def _adapter_graph(program):
    impl = pytest.importorskip("model_explorer.pytorch_exported_program_adapter_impl")
    from model_explorer.consts import DEFAULT_SETTINGS

    graphs = impl.PytorchExportedProgramAdapterImpl(program, dict(DEFAULT_SETTINGS)).convert()
    (graph,) = graphs["graphs"]
    return graph


@pytest.mark.parametrize("which", ["float_program", "quantized_program"])
def test_ids_are_the_adapters(digits, tmp_path, which):
    program, report = digits[which], digits["report"]
    graph = _adapter_graph(program)
    assert graph.id == GRAPH_ID
    nodes = {n.id: n for n in graph.nodes}
    data = to_model_explorer(program, report, path=tmp_path)
    for column in data.files:
        assert set(_results(data, column)) <= set(nodes)
    # every report row lands on one adapter node, which shows the row's operator
    local = _results(data, "local_sqnr")
    rows = report.df[report.df["local_sqnr"].notna()]
    assert sorted(nodes[i].label for i in local) == sorted(f"aten.{op}" for op in rows["op"])
    assert sorted(local.values()) == pytest.approx(sorted(rows["local_sqnr"]))


def test_ids_survive_save_and_load(digits, tmp_path):
    """The Model Explorer app opens a .pt2 file with torch.export.load."""
    program = digits["float_program"]
    torch.export.save(program, tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2")
    graph = _adapter_graph(loaded)
    data = to_model_explorer(program, digits["report"], path=tmp_path / "me")
    assert set(_results(data, "local_sqnr")) <= {n.id for n in graph.nodes}


def test_json_is_what_node_data_builder_writes(digits, tmp_path):
    ndb = pytest.importorskip("model_explorer.node_data_builder")
    data = to_model_explorer(digits["quantized_program"], digits["report"], path=tmp_path)
    for column in data.files:
        graph = _read(data, column)[GRAPH_ID]
        built = ndb.ModelNodeData(
            graphsData={
                GRAPH_ID: ndb.GraphNodeData(
                    name=graph["name"],
                    results={k: ndb.NodeDataResult(**v) for k, v in graph["results"].items()},
                    thresholds=[ndb.ThresholdItem(**t) for t in graph.get("thresholds", [])],
                    gradient=[ndb.GradientItem(**g) for g in graph.get("gradient", [])],
                )
            }
        )
        theirs = json.loads(built.to_json_string())[GRAPH_ID]
        # the builder writes its defaults too; every field qviz writes has the builder's value
        assert {k: theirs[k] for k in graph} == graph


def test_refuses_the_report_of_another_model_whose_names_coincide(tmp_path):
    """Every row of ``small``'s report names an operator of ``large``; the report's
    fingerprint still says it measured another model (rule 14)."""
    import copy

    from tests.helpers.two_models import two_models

    models = two_models()
    large = models.large
    program = torch.export.export(large.quantized, (large.x,))
    with pytest.raises(ConfigError, match=r"to_model_explorer.*another model.*"
                       r"qviz.numeric.compare on this model"):  # fmt: skip
        to_model_explorer(program, models.small.report, path=tmp_path / "no")
    assert not (tmp_path / "no").exists()
    float_program = torch.export.export(copy.deepcopy(large.float), (large.x,))
    for model in (program, float_program):  # the quantized and the float model it measured
        data = to_model_explorer(model, copy.deepcopy(large.report), path=tmp_path / "yes")
        assert data.nodes["local_sqnr"] == 2
