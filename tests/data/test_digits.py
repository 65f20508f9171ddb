"""The embedded default: fixed splits, the committed checkpoint, reproducible training."""

import shutil

import pytest
import torch

from qviz.data import (
    DigitsNet,
    digits_loaders,
    digits_metadata,
    digits_model,
    digits_tensors,
    evaluate,
    save_digits_checkpoint,
    train_digits_model,
)
from qviz.data.checkpoint import CHECKPOINT_NAME, data_dir
from qviz.errors import QvizError


def test_splits_are_fixed_disjoint_and_cover_every_class():
    a, b = digits_tensors(), digits_tensors()
    sizes = {name: len(y) for name, (_, y) in a.items()}
    assert sizes == {"train": 1257, "calibration": 180, "test": 360}
    for name in a:
        assert torch.equal(a[name][0], b[name][0]) and torch.equal(a[name][1], b[name][1])
        assert set(a[name][1].tolist()) == set(range(10))
        assert float(a[name][0].min()) >= -1.0 and float(a[name][0].max()) <= 1.0
    # together the splits are exactly scikit-learn's 1,797 images, each used once
    from sklearn.datasets import load_digits

    full = torch.from_numpy(load_digits().images).float().flatten(1) / 8 - 1
    ours = torch.cat([x.flatten(1) for x, _ in a.values()])
    key = lambda t: sorted(map(tuple, t.tolist()))  # noqa: E731
    assert key(ours) == key(full)


def test_loaders_yield_the_splits():
    loaders = digits_loaders(batch_size=50)
    images, labels = next(iter(loaders.test))
    assert images.shape == (50, 1, 8, 8) and labels.shape == (50,)
    assert sum(len(y) for _, y in loaders.calibration) == 180


def test_committed_checkpoint_reaches_its_recorded_accuracy():
    model = digits_model()
    assert isinstance(model, DigitsNet) and not model.training
    meta = digits_metadata()
    assert meta["parameters"] == sum(p.numel() for p in model.parameters())
    assert 50_000 <= meta["parameters"] <= 100_000
    accuracy = evaluate(model, digits_loaders().test)
    assert accuracy == meta["float_test_accuracy"]
    assert accuracy > 0.97
    assert (data_dir() / f"{CHECKPOINT_NAME}.pt").stat().st_size < 500_000


def test_each_call_returns_a_fresh_model():
    a, b = digits_model(), digits_model()
    with torch.no_grad():
        a.fc.weight.zero_()
    assert not torch.equal(a.fc.weight, b.fc.weight)


def test_evaluate_restores_training_mode():
    model = digits_model().train()
    evaluate(model, digits_loaders().calibration)
    assert model.training


@pytest.mark.slow
def test_retraining_reproduces_the_committed_checkpoint(tmp_path):
    model, accuracy = train_digits_model()
    committed = digits_model()
    assert accuracy == digits_metadata()["float_test_accuracy"]
    theirs = committed.state_dict()
    for name, ours in model.state_dict().items():
        assert torch.equal(ours, theirs[name]), f"{name} differs from the committed checkpoint"
    # and saving it again gives the same bytes (same sha256 as recorded)
    save_digits_checkpoint(model, {"float_test_accuracy": accuracy}, tmp_path)
    assert digits_metadata(tmp_path)["sha256"] == digits_metadata()["sha256"]


def test_missing_or_damaged_checkpoint_says_how_to_fix_it(tmp_path, monkeypatch):
    real = data_dir()
    monkeypatch.setenv("QVIZ_DATA_DIR", str(tmp_path))
    with pytest.raises(QvizError, match="qviz train-digits"):
        digits_model()
    for suffix in (".pt", ".json"):
        shutil.copy(real / f"{CHECKPOINT_NAME}{suffix}", tmp_path)
    digits_model()  # a faithful copy loads
    (tmp_path / f"{CHECKPOINT_NAME}.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(QvizError, match="sha256"):
        digits_model()


def test_evaluate_accepts_exported_and_reloaded_programs(tmp_path):
    import qviz

    loaders = digits_loaders(batch_size=60)
    model = digits_model()
    gm = qviz.export(model, (next(iter(loaders.test))[0],), dynamic_batch=True)
    path = tmp_path / "digits.pt2"
    torch.export.save(torch.export.export(gm, (torch.randn(60, 1, 8, 8),)), path)
    expected = evaluate(model, loaders.test)
    assert evaluate(gm, loaders.test) == expected
    assert evaluate(torch.export.load(path).module(), loaders.test) == expected
