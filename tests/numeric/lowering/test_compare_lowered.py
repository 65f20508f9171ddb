"""compare_lowered: the reference's integers against the lowered program's, tensor by tensor.

On the digits model (calibration split) onnxruntime's kernels stay within one step of the
reference up to the residual block's second conv, whose QLinearConv requantizes 1 % of its
values one step away; on the add's finer grid that becomes up to 3 steps, and it stays within
2 after. A scale planted in the lowered artifact (never in the reference) is named as the first
departure, and nothing before it departs.
"""

from __future__ import annotations

import copy

import onnx
import pytest
import torch
from onnx import numpy_helper

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import ConfigError
from qviz.numeric import compare_lowered
from tests.helpers.quantize import quantize


@pytest.fixture(scope="module")
def digits():
    batches = [x for x, _ in digits_loaders(batch_size=36).calibration]
    converted = quantize(digits_model(), batches, per_channel=True, dynamic_batch=True).converted
    return converted, batches, qviz.lower(converted, (batches[0],), backend="onnxruntime")


def test_every_quantized_tensor_is_within_one_step_on_onnxruntime(digits):
    converted, batches, lowered = digits
    result = compare_lowered(converted, lowered, batches)
    df = result.df
    quantizes = [n for n in converted.graph.nodes if "quantize_per_tensor" in str(n.target)
                 and "dequantize" not in str(n.target)]  # fmt: skip
    assert len(df) == len(quantizes) and result.granularity == "per tensor"
    # which values round the other way depends on the CPU's kernels: bounds, not bits
    assert int(df["max_steps"].iloc[0]) <= 1  # the input: QuantizeLinear alone
    assert int(df["max_steps"].max()) <= 3
    assert compare_lowered(converted, lowered, batches, tolerance=3).first_departure is None
    assert int(df["elements"].iloc[0]) == sum(x.numel() for x in batches)  # the input's grid
    assert (df["share"] < 0.25).all()  # measured: at most 8 % of a tensor's values
    assert repr(result).startswith("LoweringComparison(onnxruntime, 11 tensors per tensor")


def _plant(lowered, index: int, factor: float):
    """A copy of ``lowered`` whose ``index``-th QuantizeLinear has its scale times ``factor``
    (a new initializer: the reference is untouched)."""
    model = onnx.load_from_string(lowered.artifact)
    node = [n for n in model.graph.node if n.op_type == "QuantizeLinear"][index]
    old = next(i for i in model.graph.initializer if i.name == node.input[1])
    value = numpy_helper.to_array(old) * factor
    model.graph.initializer.append(numpy_helper.from_array(value, name="planted_scale"))
    node.input[1] = "planted_scale"
    planted = copy.copy(lowered)
    planted.artifact = model.SerializeToString()
    return planted, node.output[0]


@pytest.mark.parametrize("index", [2, 5])
def test_a_scale_planted_in_the_lowered_program_is_the_first_departure(digits, index):
    converted, batches, lowered = digits
    planted, _ = _plant(lowered, index, 1.5)
    result = compare_lowered(converted, planted, batches[:2], tolerance=3)
    first = result.first_departure
    assert first is not None and first["tensor"] == result.df["tensor"].iloc[index]
    assert (result.df["max_steps"].iloc[:index] <= 3).all()  # nothing departs before it
    assert first["max_steps"] > 1 and first["op"] in repr(result)


def test_xnnpack_compares_the_model_outputs(digits):
    converted, batches, _ = digits
    lowered = qviz.lower(converted, (batches[0],), backend="xnnpack")
    result = compare_lowered(converted, lowered, batches)
    assert result.granularity == "model outputs" and len(result.rows) == 1
    assert result.rows[0]["max_steps"] <= 1


def test_a_lowered_model_of_another_model_is_refused(digits):
    converted, batches, lowered = digits
    x = torch.randn(8, 4)
    prepared = qviz.prepare_pt2e(
        qviz.export(torch.nn.Linear(4, 2).eval(), (x,)),
        XNNPACKQuantizer().set_global(get_symmetric_quantization_config()),
    )
    qviz.calibrate(prepared, x, progress=False)
    with pytest.raises(
        ConfigError, match=r"lowered program was made from another model .*: other op"
    ):
        compare_lowered(qviz.convert_pt2e(prepared), lowered, x)
    with pytest.raises(ConfigError, match=r"needs what qviz\.lower returned"):
        compare_lowered(converted, converted, batches)


def test_float_to_reference_to_kernels_in_one_table(digits):
    """With the float model, each row holds its op's quantization error (the numeric suite's
    local and cumulative SQNR on the same batches) beside its lowering error."""
    from qviz.numeric import compare

    converted, batches, lowered = digits
    float_gm = qviz.export(digits_model().eval(), (batches[0],), dynamic_batch=True)
    three = compare_lowered(converted, lowered, batches, max_batches=2, float_model=float_gm)
    report = compare(float_gm, converted, batches[:2], progress=False).df.set_index("node")
    df = three.df.set_index("op")
    assert {"local_sqnr", "cumulative_sqnr", "max_steps", "share"} <= set(df.columns)
    for op in ("relu", "conv2d_2", "relu_2", "max_pool2d", "linear"):
        assert df.loc[op, "local_sqnr"] == pytest.approx(report.loc[op, "local_sqnr"])
        assert df.loc[op, "cumulative_sqnr"] == pytest.approx(report.loc[op, "cumulative_sqnr"])
    plain = compare_lowered(converted, lowered, batches, max_batches=2)
    assert three.df["max_steps"].tolist() == plain.df["max_steps"].tolist()  # the same pass
    assert int(three.df["elements"].iloc[0]) == sum(x.numel() for x in batches[:2])
