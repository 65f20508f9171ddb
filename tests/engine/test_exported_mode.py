"""train() / eval() on prepared and converted models refuse, as on torch.export's own modules
(the reference does the same): they would not switch the recorded dropout / batch-norm ops."""

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import ExportedModeError


def _stages():
    model = nn.Sequential(nn.Conv2d(3, 3, 3), nn.BatchNorm2d(3), nn.Dropout(0.5), nn.ReLU())
    x = torch.rand(2, 3, 5, 5)
    gm = qviz.export(model.eval(), (x,))
    prepared = qviz.prepare_pt2e(
        gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    )
    qviz.calibrate(prepared, [x], progress=False)
    return x, {"exported": gm, "prepared": prepared, "converted": qviz.convert_pt2e(prepared)}


@pytest.mark.parametrize("call", ["train", "eval"])
def test_switching_mode_refuses_at_every_stage_and_says_what_to_do(call):
    x, stages = _stages()
    for stage, gm in stages.items():
        with pytest.raises(NotImplementedError):
            getattr(gm, call)()
        if stage != "exported":
            with pytest.raises(ExportedModeError, match=r"model\.eval\(\) before qviz\.export"):
                getattr(gm, call)()
    # the models still run, in the mode they were exported in: dropout stays off
    converted = stages["converted"]
    assert torch.equal(converted(x), converted(x))
