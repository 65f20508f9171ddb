"""Bad inputs get a QvizError naming the batch, the input and the fix, and change nothing.

Each case is what a new user tried: integer images, a wrong image size, a converted or never
prepared model handed to calibrate, a prepared model handed to prepare again.
"""

import copy

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.graph.inputs import batches_of, bind_batch, call_model, check_inputs
from qviz.engine.graph.stage import Stage, model_stage
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.errors import ConfigError
from tests.helpers.quantize import quantize


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
    model, example = TwoInputs(), (torch.randn(2, 3, 8, 8), torch.randn(2, 4))
    data = [(torch.randn(5, 3, 8, 8), torch.randn(5, 4))]
    return quantize(model, data, _quantizer(), example=example, dynamic_batch=True)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(before, model):
    after = model.state_dict()
    return before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_integer_images_name_the_batch_input_and_dtype(flow):
    _, prepared, _ = flow
    before = _state(prepared)
    bad = [(torch.randn(2, 3, 8, 8), torch.randn(2, 4)), (torch.randint(0, 5, (2, 3, 8, 8)),)]
    with pytest.raises(ConfigError) as info:
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
    with pytest.raises(ConfigError, match=r"input 0 \('image'\) has shape \(2, 3, 9, 8\)"):
        qviz.calibrate(prepared, [(torch.randn(2, 3, 9, 8), torch.randn(2, 4))], progress=False)
    assert _same(before, prepared)  # checked before the model ran: no observer saw it
    with pytest.raises(ConfigError, match=r"\(\*, 3, 8, 8\)"):
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
    with pytest.raises(ConfigError, match=expected):
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


# -- binding a batch to a model: the one rule (qviz.engine.graph.inputs) -----------------------
class HFLike(nn.Module):
    """A Hugging Face model's forward: one required input, optional ones after it."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        h = self.fc(input_ids)
        return self.head(h if attention_mask is None else h * attention_mask)


def test_a_pair_binds_to_the_required_parameters_and_the_rest_is_the_target():
    ids, labels = torch.randn(8, 4), torch.randint(2, 5, (8,))
    bound = bind_batch(HFLike(), (ids, labels), "compare: batch 0")
    assert bound.args == (ids,) and bound.kwargs == {} and bound.target is labels
    assert bind_batch(HFLike(), ids, "b").args == (ids,)
    assert bind_batch(HFLike(), [ids], "b").target is None
    extra = bind_batch(HFLike(), (ids, labels, labels), "b")
    assert isinstance(extra.target, tuple) and len(extra.target) == 2


def test_a_dict_binds_by_name_and_its_labels_are_the_target():
    ids, mask, labels = torch.randn(8, 4), torch.ones(8, 8), torch.zeros(8)
    bound = bind_batch(HFLike(), {"input_ids": ids, "attention_mask": mask, "labels": labels}, "b")
    assert bound.args == () and set(bound.kwargs) == {"input_ids", "attention_mask", "labels"}
    assert bound.target is labels  # the model takes `labels` too: passed and the target
    with pytest.raises(ConfigError, match=r"batch 3 has key\(s\) \['mask'\].*input_ids"):
        bind_batch(HFLike(), {"input_ids": ids, "mask": mask}, "batch 3")
    with pytest.raises(ConfigError, match=r"batch 4 lacks \['input_ids'\], required by HFLike"):
        bind_batch(HFLike(), {"attention_mask": mask}, "batch 4")
    linear = nn.Linear(4, 2)  # forward(input): `target` is the target, not an input
    assert bind_batch(linear, {"input": ids, "target": labels}, "b").target is labels


def test_a_batch_that_cannot_bind_names_the_batch_the_parameters_and_the_fix():
    class TwoRequired(nn.Module):
        def forward(self, image, extra, scale=None):
            return image

    with pytest.raises(ConfigError, match=r"batch 2 has 1 item\(s\) but .*\['image', 'extra'\]"):
        bind_batch(TwoRequired(), (torch.ones(1),), "batch 2")
    with pytest.raises(ConfigError, match=r"batch 5 is a str; give a tensor, a tuple"):
        bind_batch(TwoRequired(), "x", "batch 5")
    with pytest.raises(ConfigError, match="DataLoader, an iterable of batches, or one batch"):
        batches_of(3, "compare")


def test_a_graph_binds_by_counting_its_inputs(flow):
    gm, _, converted = flow
    image, extra, labels = torch.randn(2, 3, 8, 8), torch.randn(2, 4), torch.zeros(2)
    for model in (gm, converted):
        bound = bind_batch(model, (image, extra, labels), "b")
        assert bound.args == (image, extra) and bound.target is labels
        by_name = bind_batch(model, {"extra": extra, "image": image, "labels": labels}, "b")
        assert by_name.args == (image, extra) and by_name.target is labels
        assert torch.equal(call_model(model, by_name, "b"), call_model(model, bound, "b"))
    with pytest.raises(ConfigError, match=r"batch 1 lacks \['extra'\], required by the exported"):
        bind_batch(gm, {"image": image}, "batch 1")


def test_every_entry_point_has_one_batch_error_class(flow):
    """calibrate raised CalibrationError for the batch compare refused with a ConfigError."""
    gm, prepared, converted = flow
    bad = [(torch.randn(2, 3, 9, 8), torch.randn(2, 4))]
    for call in (
        lambda: qviz.calibrate(prepared, bad, progress=False),
        lambda: qviz.numeric.compare(gm, converted, bad, progress=False),
    ):
        with pytest.raises(ConfigError, match=r"batch 0: input 0 \('image'\) has shape"):
            call()


def test_a_graph_exported_with_keyword_inputs_runs_on_a_dict_batch():
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x, mask=None):
            return self.fc(x) * mask

    x, mask = torch.randn(3, 4), torch.ones(3, 2)
    gm = qviz.export(Masked().eval(), (x,), example_kwargs={"mask": mask})
    for batch in ({"x": x, "mask": mask}, (x, mask)):
        out = call_model(gm, bind_batch(gm, batch, "b"), "b")
        assert torch.equal(out, gm(x, mask=mask))
