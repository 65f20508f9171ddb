"""MaxCalibrator: running max, per-axis shapes, tracked history, errors."""

import pytest
import torch

from qviz.engine.tensor.calib import MaxCalibrator
from qviz.errors import CalibrationError, ConfigError


def test_running_max_over_batches():
    calib = MaxCalibrator(8)
    for scale in (1.0, 3.0, 2.0):
        calib.collect(torch.tensor([-scale, scale / 2]))
    assert float(calib.compute_amax()) == 3.0
    assert calib.compute_amax().shape == ()
    assert calib.num_batches == 3 and calib.num_elements == 6


@pytest.mark.parametrize(
    ("shape", "axis", "amax_shape", "reduce"),
    [
        ((16, 3, 3, 3), 0, (16, 1, 1, 1), (1, 2, 3)),  # conv weight, per output channel
        ((10, 20), 0, (10, 1), (1,)),  # linear weight, per row
        ((8, 16, 5, 5), 1, (1, 16, 1, 1), (0, 2, 3)),  # activation, per channel
        ((8, 16, 5, 5), (0, 1), (8, 16, 1, 1), (2, 3)),
        ((8, 16, 5, 5), -3, (1, 16, 1, 1), (0, 2, 3)),
    ],
)
def test_per_axis_amax(shape, axis, amax_shape, reduce):
    x = torch.randn(shape)
    calib = MaxCalibrator(8, axis=axis)
    calib.collect(x)
    calib.collect(x * 0.5)
    amax = calib.compute_amax()
    assert amax.shape == amax_shape
    assert torch.equal(amax, x.abs().amax(dim=reduce, keepdim=True))


def test_track_amax_keeps_every_batch():
    calib = MaxCalibrator(8, track_amax=True)
    for v in (1.0, 4.0, 2.0):
        calib.collect(torch.tensor([v]))
    assert [float(a) for a in calib.amaxs] == [1.0, 4.0, 2.0]


def test_only_max_is_available():
    calib = MaxCalibrator(8)
    calib.collect(torch.randn(10))
    with pytest.raises(ConfigError, match="use HistogramCalibrator"):
        calib.compute_amax("percentile")


def test_no_data_and_bad_data():
    with pytest.raises(CalibrationError, match="collected no data"):
        MaxCalibrator(8).compute_amax()
    with pytest.raises(CalibrationError, match="NaN"):
        MaxCalibrator(8).collect(torch.tensor([float("nan")]))
    with pytest.raises(ConfigError, match="axis"):
        MaxCalibrator(8, axis=1.5)
