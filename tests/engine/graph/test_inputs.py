"""Bad inputs get a QvizError naming the batch, the input and the fix, and change nothing.

Each case is what a new user tried: integer images, a wrong image size, a converted or never
prepared model handed to calibrate, a prepared model handed to prepare again.
"""

import copy

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.graph.inputs import check_inputs
from qviz.engine.graph.stage import Stage, model_stage
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import CalibrationError, ConfigError


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)

    def forward(self, image, extra):
        return self.fc(self.conv(image).mean((2, 3)) + extra)


def _quantizer():
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config())


@pytest.fixture
def flow():
    """(exported, prepared and calibrated, converted) for a conv model with a dynamic batch."""
    gm = qviz.export(
        TwoInputs().eval(), (torch.randn(2, 3, 8, 8), torch.randn(2, 4)), dynamic_batch=True
    )
    prepared = qviz.prepare_pt2e(gm, _quantizer())
    qviz.calibrate(prepared, [(torch.randn(5, 3, 8, 8), torch.randn(5, 4))], progress=False)
    return gm, prepared, qviz.convert_pt2e(prepared)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(before, model):
    after = model.state_dict()
    return before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_integer_images_name_the_batch_input_and_dtype(flow):
    _, prepared, _ = flow
    before = _state(prepared)
    bad = [(torch.randn(2, 3, 8, 8), torch.randn(2, 4)), (torch.randint(0, 5, (2, 3, 8, 8)),)]
    with pytest.raises(CalibrationError) as info:
        qviz.calibrate(prepared, [(b[0], torch.randn(2, 4)) for b in bad], progress=False)
    text = str(info.value)
    assert "calibration batch 1: input 0 ('image') is torch.int64" in text
    assert "exported with torch.float32" in text and "x.to(torch.float32)" in text
    # batch 0 ran before batch 1 failed; nothing of batch 1 reached an observer
    assert sum(int(m.num_batches) for m in prepared.modules() if hasattr(m, "num_batches")) > 0
    assert not _same(before, prepared)  # batch 0 counted, as a partial calibration does


def test_a_wrong_image_size_names_the_dimension_pattern(flow):
    _, prepared, _ = flow
    before = _state(prepared)
    with pytest.raises(CalibrationError, match=r"input 0 \('image'\) has shape \(2, 3, 9, 8\)"):
        qviz.calibrate(prepared, [(torch.randn(2, 3, 9, 8), torch.randn(2, 4))], progress=False)
    assert _same(before, prepared)  # checked before the model ran: no observer saw it
    with pytest.raises(CalibrationError, match=r"\(\*, 3, 8, 8\)"):
        qviz.calibrate(prepared, [(torch.randn(2, 3, 9, 8), torch.randn(2, 4))], progress=False)


def test_too_few_inputs_are_named():
    gm = qviz.export(TwoInputs().eval(), (torch.randn(2, 3, 8, 8), torch.randn(2, 4)))
    with pytest.raises(
        ConfigError, match=r"1 inputs for a model that takes 2 \['image', 'extra'\]"
    ):
        check_inputs(gm, (torch.randn(2, 3, 8, 8),), where="batch 0")
    with pytest.raises(ConfigError, match=r"input 1 \('extra'\) is a list"):
        check_inputs(gm, (torch.randn(2, 3, 8, 8), [1.0]), where="batch 0")


def test_a_static_batch_size_suggests_dynamic_batch_or_drop_last():
    gm = qviz.export(nn.Linear(4, 2).eval(), (torch.randn(8, 4),))
    with pytest.raises(ConfigError, match=r"dynamic_batch=True.*drop_last=True"):
        check_inputs(gm, (torch.randn(3, 4),), where="batch 2")


@pytest.mark.parametrize("which", ["converted", "exported", "eager"])
def test_calibrate_refuses_a_model_without_observers(flow, which):
    gm, _, converted = flow
    model = {"converted": converted, "exported": gm, "eager": TwoInputs().eval()}[which]
    before = copy.deepcopy(model.state_dict())
    expected = "already converted|converted model" if which == "converted" else "never prepared"
    with pytest.raises(CalibrationError, match=expected):
        qviz.calibrate(model, [(torch.randn(2, 3, 8, 8), torch.randn(2, 4))], progress=False)
    assert _same(before, model)


def test_stages(flow):
    assert [model_stage(m) for m in flow] == [Stage.FLOAT, Stage.PREPARED, Stage.CONVERTED]
    assert model_stage(TwoInputs()) is Stage.FLOAT


def test_prepare_refuses_a_prepared_model_and_says_what_to_pass(flow):
    gm, prepared, _ = flow
    for entry in (qviz.prepare_pt2e, qviz.annotate_pt2e):
        with pytest.raises(ConfigError, match=r"already prepared.*pass the float graph module"):
            entry(prepared, _quantizer())
    assert qviz.prepare_pt2e(gm, _quantizer()).plan.groups  # the float graph still prepares


def test_convert_says_which_stage_it_got(flow):
    gm, _, converted = flow
    with pytest.raises(ConfigError, match="already converted"):
        qviz.convert_pt2e(converted)
    with pytest.raises(ConfigError, match="never prepared"):
        qviz.convert_pt2e(gm)
