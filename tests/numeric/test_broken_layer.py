"""Find the broken layer: a conv whose weights hold one huge outlier that per-tensor weight
quantization turns into noise. compare, sensitivity, fallback and compare_configs must all
point at it, and falling it back must repair the model."""

import pytest
import torch

import qviz
from qviz.engine.quantizers import get_symmetric_quantization_config
from qviz.numeric import compare, compare_configs, fallback, sensitivity
from tests.helpers.quantize import quantize, xnnpack


@pytest.fixture(scope="module")
def broken(make_broken_model):
    model = make_broken_model()
    data = [torch.randn(8, 3, 16, 16) for _ in range(4)]
    quantizer = xnnpack(per_channel=False)
    gm, _, quantized = quantize(model, data, quantizer, dynamic_batch=True)
    return model, gm, quantizer, data, quantized, compare(gm, quantized, data, progress=False)


def test_the_broken_conv_has_the_worst_local_sqnr(broken):
    *_, report = broken
    df = report.df.set_index("node")
    assert report.worst(1)["node"].tolist() == ["conv2d_1"]
    assert df.loc["conv2d_1", "module"] == "conv2"
    assert df.loc["conv2d_1", "local_sqnr"] < 3.0  # its weights are mostly rounded to zero
    others = df.drop(index="conv2d_1")["local_sqnr"]
    assert (others > 40.0).all()  # every other operator adds only rounding noise


def test_downstream_layers_inherit_the_error_but_make_none(broken):
    *_, report = broken
    df = report.df.set_index("node")
    for node in ("relu_1", "conv2d_2", "relu_2", "mean"):
        assert df.loc[node, "cumulative_sqnr"] < 10.0, (
            node
        )  # cumulative: the broken input propagates
        assert df.loc[node, "local_sqnr"] > 40.0, node  # local: fed float inputs, they are fine
    assert df.loc["relu", "cumulative_sqnr"] > 35.0  # upstream of the broken conv nothing is wrong
    assert report.output_sqnr < 25.0


def test_sensitivity_ranks_the_broken_conv_first_both_ways(broken):
    _, gm, quantizer, data, *_ = broken
    fb = sensitivity(gm, quantizer, data, progress=False)
    assert fb.loc[0, "node"] == "conv2d_1" and fb.loc[0, "rank"] == 1
    assert fb.loc[0, "delta_sqnr"] > 20.0  # keeping it in float recovers >20 dB
    assert (fb.loc[1:, "delta_sqnr"].abs() < 2.0).all()
    solo = sensitivity(gm, quantizer, data, mode="solo", progress=False)
    assert solo.loc[0, "node"] == "conv2d_1"  # quantized alone it already costs the most
    assert solo.loc[0, "output_sqnr"] < 25.0 < solo.loc[1, "output_sqnr"]
    assert fb.attrs["quantized_output_sqnr"] == pytest.approx(broken[-1].output_sqnr, abs=1e-6)


def test_falling_back_the_layer_restores_the_output(broken):
    _, gm, quantizer, data, _, report = broken
    q = fallback(quantizer, ["conv2"])  # the module path works as well as the node name
    prepared = qviz.calibrate(qviz.prepare_pt2e(gm, q), data, progress=False)
    assert [(f.node, f.reason.value) for f in prepared.plan.float_nodes] == [
        ("conv2d_1", "user fallback")
    ]
    repaired = compare(gm, qviz.convert_pt2e(prepared), data, progress=False)
    assert repaired.output_sqnr > report.output_sqnr + 20.0
    assert "conv2d_1" not in set(repaired.df["node"])  # no longer a quantized operator


def test_compare_configs_shows_per_channel_weights_rescue_the_layer(broken):
    _, gm, _, data, *_ = broken
    configs = {
        "per-tensor": get_symmetric_quantization_config(),
        "per-channel": get_symmetric_quantization_config(is_per_channel=True),
    }
    df = compare_configs(gm, configs, data, progress=False).set_index("node")
    row = df.loc["conv2d_1"]
    assert row["best"] == "per-channel" and row["per-channel"] > row["per-tensor"] + 8.0
    assert df.loc["relu", "best"] == "per-tensor = per-channel"  # no weights: the same
    assert set(df.attrs["output_sqnr"]) == set(configs)


def test_the_float_model_is_not_changed(broken):
    model, gm, quantizer, data, quantized, _ = broken
    before = {k: v.clone() for k, v in model.state_dict().items()}
    graph_before = str(gm.graph)
    compare(model, quantized, data[:1], progress=False)  # an nn.Module: exported inside
    sensitivity(gm, quantizer, data[:1], progress=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert str(gm.graph) == graph_before
    assert not any("quantization_annotation" in n.meta for n in gm.graph.nodes)
