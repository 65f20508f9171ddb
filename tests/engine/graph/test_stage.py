"""THE stage check: which stage a model is at, and the error an entry point raises for another."""

import pytest
import torch
from torch import nn

from qviz.engine import quant_nn
from qviz.engine.graph.stage import Stage, check_stage, model_stage
from qviz.errors import ConfigError
from tests.helpers.quantize import quantize


@pytest.fixture(scope="module")
def stages():
    x = torch.randn(8, 4)
    gm, prepared, converted = quantize(nn.Linear(4, 2), [x], per_channel=False)
    return {
        "eager": nn.Linear(4, 2), "exported": gm, "prepared": prepared, "converted": converted,
        "quant_nn": nn.Sequential(quant_nn.QuantLinear(4, 2)),
    }  # fmt: skip


def test_every_stage_is_told_apart(stages):
    assert {name: model_stage(m).value for name, m in stages.items()} == {
        "eager": "float", "exported": "float", "prepared": "prepared", "converted": "converted",
        "quant_nn": "quant_nn",
    }  # fmt: skip


def test_check_stage_returns_the_stage_or_names_it_and_the_fix(stages):
    assert check_stage(stages["quant_nn"], Stage.QUANT_NN, where="fine_tune") is Stage.QUANT_NN
    with pytest.raises(
        ConfigError,
        match=r"^compare takes the model qviz\.convert_pt2e returned as quantized_model, but got "
        r"a prepared GraphModule \(it holds observers.*\); calibrate and convert it first",
    ):
        check_stage(stages["prepared"], Stage.CONVERTED, where="compare", arg="quantized_model")
    with pytest.raises(ConfigError, match=r"got a converted GraphModule.*nothing left to calib"):
        check_stage(stages["converted"], Stage.PREPARED, where="calibrate")
    with pytest.raises(ConfigError, match=r"graph module qviz\.export returns.*got a Linear"):
        check_stage(stages["eager"], Stage.FLOAT, where="sensitivity", exported=True)
    with pytest.raises(ConfigError, match=r"evaluate takes .* as model, got a str"):
        check_stage("model.pt", [Stage.FLOAT, Stage.CONVERTED], where="evaluate")
