"""compare_calibrators on the embedded model, checked against independent computations."""

import pytest
import torch

from qviz.data import digits_loaders, digits_model
from qviz.engine.tensor.tensor_quant import fake_tensor_quant
from qviz.numeric import compare_calibrators, layer_tensors, sqnr


@pytest.fixture(scope="module")
def batch() -> torch.Tensor:
    return next(iter(digits_loaders(batch_size=32).calibration))[0]


def test_one_row_per_tensor_and_method(batch):
    model = digits_model()
    df = compare_calibrators(model, batch)
    layers = [
        n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)
    ]
    assert len(df) == len(layers) * 2 * 4
    assert list(df["tensor"].unique()) == [f"{n}.{k}" for n in layers for k in ("input", "weight")]
    assert df.groupby("tensor")["best"].sum().min() >= 1


def test_values_match_an_independent_computation(batch):
    model = digits_model()
    df = compare_calibrators(model, batch).set_index(["tensor", "method"])
    tensors = {name: t for name, _, t in layer_tensors(model, batch)}
    # the first conv sees the images themselves, and the fc sees the pooled features
    assert torch.equal(tensors["stem.0.input"], batch)
    for name, t in tensors.items():
        row = df.loc[(name, "max")]
        assert row["amax"] == pytest.approx(float(t.abs().max()))
        assert row["scale"] == pytest.approx(float(t.abs().max()) / 127)
        assert row["clipped"] == 0.0
        assert row["sqnr_db"] == pytest.approx(sqnr(t, fake_tensor_quant(t, t.abs().max())))


def test_the_model_is_left_untouched(batch):
    model = digits_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    compare_calibrators(model, batch)
    assert not model.training
    assert not model._forward_pre_hooks and all(not m._forward_pre_hooks for m in model.modules())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
