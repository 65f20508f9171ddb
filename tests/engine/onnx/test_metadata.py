"""export_onnx(report=...): the numeric suite's values as ONNX node metadata properties.

Read back with onnx (the file as Netron reads it: ``NodeProto.metadata_props``), and checked
against the report's rows and, for the scale, against the QuantizeLinear that reads each
node's output in the same file.
"""

from __future__ import annotations

import pytest
import torch

import qviz
import qviz.numeric
from qviz.errors import ConfigError
from qviz.numeric.compare.report import NumericReport
from tests.helpers.quantize import quantize

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytest.importorskip("pandas")

#: The ONNX operator each digits operator becomes (adaptive_avg_pool2d is decomposed to mean).
ONNX_OPS = {
    "conv2d": "Conv",
    "relu": "Relu",
    "add": "Add",
    "max_pool2d": "MaxPool",
    "adaptive_avg_pool2d": "ReduceMean",
    "flatten": "Reshape",
    "linear": "Gemm",
}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from qviz.data import digits_loaders, digits_model

    calib = [x for x, _ in digits_loaders(batch_size=60).calibration][:3]
    gm, _, quantized = quantize(digits_model(), calib, per_channel=True)
    report = qviz.numeric.compare(gm, quantized, calib[:2], progress=False)
    path = tmp_path_factory.mktemp("onnx") / "digits.onnx"
    result = qviz.export_onnx(quantized, (calib[0],), path, report=report)
    return {"quantized": quantized, "report": report, "x": calib[0], "result": result}


def _props(node):
    return {p.key: p.value for p in node.metadata_props if p.key.startswith("qviz.")}


def test_every_row_is_on_the_onnx_node_computing_it(digits):
    result, report = digits["result"], digits["report"]
    proto = onnx.load(str(result.path))
    by_name = {n.name: n for n in proto.graph.node}
    assert set(result.node_properties) == set(report.df["node"])
    for row in report.df.itertuples():
        (name,) = result.node_properties[row.node]
        node = by_name[name]
        assert node.op_type == ONNX_OPS[row.op]
        props = _props(node)
        assert props["qviz.node"] == row.node
        assert float(props["qviz.local_sqnr"]) == pytest.approx(row.local_sqnr, rel=1e-5)
        assert float(props["qviz.cumulative_sqnr"]) == pytest.approx(row.cumulative_sqnr, rel=1e-5)
        if row.clipped == row.clipped:  # not NaN: the operator's output is quantized
            assert float(props["qviz.clipped"]) == pytest.approx(row.clipped, rel=1e-5, abs=1e-12)
        else:
            assert "qviz.clipped" not in props
    carried = [n for n in proto.graph.node if _props(n)]
    assert len(carried) == len(report.df)  # nothing else is annotated


def test_scale_is_the_scale_of_the_quantize_linear_reading_the_output(digits):
    from onnx import numpy_helper

    proto = onnx.load(str(digits["result"].path))
    initializers = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    quantize_of = {n.input[0]: n for n in proto.graph.node if n.op_type == "QuantizeLinear"}
    checked = 0
    for node in proto.graph.node:
        props = _props(node)
        q = quantize_of.get(node.output[0])
        if q is None:
            assert "qviz.scale" not in props
            continue
        if props:
            scale = float(initializers[q.input[1]])
            assert float(props["qviz.scale"]) == pytest.approx(scale, rel=1e-5)
            checked += 1
    assert checked >= 10


def test_model_metadata_summarises_the_report(digits):
    proto = onnx.load(str(digits["result"].path))
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["qviz.numeric_report"] == digits["report"].summary()
    assert float(meta["qviz.output_sqnr"]) == pytest.approx(digits["report"].output_sqnr, 1e-5)
    assert proto.ir_version >= 10  # node metadata_props exist from IR version 10


def test_the_file_still_runs(digits):
    session = ort.InferenceSession(str(digits["result"].path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: digits["x"].numpy()})
    assert out.shape == (digits["x"].shape[0], 10)


def test_without_a_report_nothing_is_added(digits, tmp_path):
    result = qviz.export_onnx(digits["quantized"], (digits["x"],), tmp_path / "plain.onnx")
    proto = onnx.load(str(result.path))
    assert not any(_props(n) for n in proto.graph.node)
    assert not any(p.key.startswith("qviz.") for p in proto.metadata_props)
    assert result.node_properties == {}


def test_refuses_a_report_from_another_model(digits, tmp_path):
    other = NumericReport.from_table([{"node": "linear_9", "op": "linear", "local_sqnr": 3.0}])
    with pytest.raises(ConfigError, match=r"does not match this converted model.*linear_9"):
        qviz.export_onnx(digits["quantized"], (digits["x"],), tmp_path / "o.onnx", report=other)
    assert not (tmp_path / "o.onnx").exists()
    with pytest.raises(ConfigError, match="NumericReport"):
        qviz.export_onnx(digits["quantized"], (digits["x"],), tmp_path / "o.onnx", report=[1])


def test_refuses_a_report_for_a_tensor_quantizer_model(digits, tmp_path):
    from qviz.engine.tensor.tensor_quant import QuantDescriptor, TensorQuantizer

    model = torch.nn.Sequential(TensorQuantizer(QuantDescriptor(num_bits=8, amax=1.0)))
    with pytest.raises(ConfigError, match="convert_pt2e"):
        qviz.export_onnx(model, torch.randn(2, 3), tmp_path / "t.onnx", report=digits["report"])


def test_refuses_the_report_of_another_model_whose_names_coincide(tmp_path):
    """Every row of ``small``'s report (``linear``) names an operator of ``large``: only the
    fingerprint tells that the report measured another model (house rule 14)."""
    from tests.helpers.two_models import two_models

    models = two_models()
    large = models.large
    with pytest.raises(ConfigError, match=r"export_onnx\(report=...\).*\(1 operator\).*"
                       r"\(2 operators\).*qviz.numeric.compare on this model"):  # fmt: skip
        qviz.export_onnx(
            large.quantized, (large.x,), tmp_path / "o.onnx", report=models.small.report
        )
    assert not (tmp_path / "o.onnx").exists()
    import copy

    kept = qviz.export_onnx(copy.deepcopy(large.quantized), (large.x,), tmp_path / "k.onnx",
                            report=copy.deepcopy(large.report))  # fmt: skip
    assert sorted(kept.node_properties) == ["linear", "relu"]
