"""CalibrationExplorer on a calibrated quant_nn model, without a kernel (the TensorQuantizer
source); the PT2E source is covered by test_explorer.py."""

import copy
import re

import pytest
import torch

from qviz.data import digits_model
from qviz.engine.tensor.calib import HistogramCalibrator, MaxCalibrator
from qviz.engine.tensor.quant_modules import quantize_model
from qviz.engine.tensor.records import QuantizerRecord
from qviz.errors import ConfigError
from qviz.widgets import CalibrationExplorer

X = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def calibrated(calibrated_quant_nn_digits):
    """Inputs calibrated with entropy (histograms), weights with max; pool's quantizer off."""
    return calibrated_quant_nn_digits("pool._input_quantizer")


@pytest.fixture
def model(calibrated):
    return copy.deepcopy(calibrated)  # every test may load other ranges


@pytest.fixture
def explorer(model):
    return CalibrationExplorer(model, graph=False)


def _line_x(svg, gid):
    return float(re.search(rf'data-gid="{gid}" data-x="([^"]+)"', svg).group(1))


def test_lists_the_calibrated_quantizers_and_opens_on_the_first(explorer, model):
    expected = [
        n
        for n, m in model.named_modules()
        if n.endswith("_quantizer") and not m._disabled and m.calibrator.num_batches
    ]
    assert explorer.observers == expected and len(expected) == 13
    assert "pool._input_quantizer" not in explorer.observers
    state = explorer.state
    assert (state.observer, state.method) == ("stem.0._input_quantizer", "entropy")
    assert explorer.view.method.options == ("max", "percentile", "entropy", "mse")  # no l2
    assert explorer.view.observer.options[1] == (
        "stem.0._weight_quantizer (max)",
        "stem.0._weight_quantizer",
    )


def test_a_histogram_quantizer_shows_every_method_and_its_loaded_amax(explorer, model):
    explorer.select("conv2.0._input_quantizer")
    tq = model.conv2[0]._input_quantizer
    assert isinstance(tq.calibrator, HistogramCalibrator)
    assert [r["method"] for r in explorer.rows] == ["max", "percentile", "entropy", "mse"]
    for method in ("max", "entropy", "mse"):
        expected = float(tq.calibrator.compute_amax(method))
        assert _line_x(explorer.svg, f"method:{method}") == pytest.approx(expected, rel=1e-5)
    assert _line_x(explorer.svg, "observer:range") == pytest.approx(float(tq.amax), rel=1e-5)
    assert "conv2.0._input_quantizer: |x| of" in explorer.svg
    assert "amax from: <b>entropy</b>" in explorer.view.status.value
    assert "entropy ★" in explorer.view.table.value


def test_a_max_quantizer_shows_its_max_and_refuses_other_methods(explorer, model):
    explorer.select("conv1.0._weight_quantizer")
    tq = model.conv1[0]._weight_quantizer
    assert isinstance(tq.calibrator, MaxCalibrator) and explorer.state.method == "max"
    (row,) = explorer.rows
    largest = float(tq.calibrator.compute_amax().max())
    assert row["method"] == "max" and row["amax"] == pytest.approx(largest)
    assert row["scale"] == pytest.approx(largest / 127)
    assert "MaxCalibrator keeps only the running max" in explorer.view.status.value
    assert "64 channels" in explorer.view.status.value
    assert explorer.set(method="entropy").use_range() is None
    assert "MaxCalibrator" in explorer.error and "calibrate_quantizers" in explorer.error


def test_use_this_range_loads_the_amax_and_the_choice_reads_back(explorer, model):
    explorer.select("tq/block.conv1._input_quantizer").set(method="percentile", percentile=99.9)
    tq = model.block.conv1._input_quantizer
    record = explorer.use_range()
    assert isinstance(record, QuantizerRecord) and record.method == "percentile 99.9"
    expected = float(tq.calibrator.compute_amax("percentile", percentile=99.9))
    assert float(tq.amax) == pytest.approx(expected) and record.amax == pytest.approx((expected,))
    assert explorer.choices["block.conv1._input_quantizer"] == "percentile 99.9"
    assert "percentile ★" in explorer.view.table.value


def test_apply_to_all_reaches_every_histogram_quantizer(explorer, model):
    records = explorer.set(method="mse").apply_to_all()
    inputs = [n for n in explorer.observers if n.endswith("_input_quantizer")]
    assert sorted(r.name for r in records) == sorted(inputs)
    assert {explorer.choices[n] for n in inputs} == {"mse"}
    assert model.fc._weight_quantizer.amax_method == "max"  # max calibrators stay as they are


def test_fewer_bits_only_explore(explorer):
    explorer.select("fc._input_quantizer")
    eight = {r["method"]: r["scale"] for r in explorer.rows}
    four = {r["method"]: r["scale"] for r in explorer.set(num_bits=4).rows}
    assert all(four[m] > eight[m] for m in ("max", "mse"))
    assert explorer.use_range() is None and "only explores" in explorer.error


def test_refusals_say_why(explorer):
    before = explorer.state
    explorer.set(method="l2")
    assert explorer.state == before and "method 'l2'" in explorer.error
    explorer.select("pool._input_quantizer")
    assert "is disabled" in explorer.error and explorer.state == before
    explorer.select("conv9._input_quantizer")
    assert "not a calibrated TensorQuantizer" in explorer.error
    with pytest.raises(ConfigError, match="state_dict"):
        _ = explorer.overrides


def test_an_uncalibrated_model_is_refused():
    with pytest.raises(ConfigError, match="calibrate_quantizers"):
        CalibrationExplorer(quantize_model(digits_model()), graph=False)


def test_the_graph_needs_example_inputs_and_clicks_pick_quantizers(model):
    without = CalibrationExplorer(model)
    assert without.view.graph is None and "example_inputs" in without.view.status.value
    ex = CalibrationExplorer(model, example_inputs=(X,))
    assert "tq/fc._input_quantizer" in ex.view.graph.svg
    ex.view.graph.selected = "tq/fc._input_quantizer"  # a click on its marker
    assert ex.state.observer == "fc._input_quantizer"
    ex.set(method="max").use_range()
    amax = float(model.fc._input_quantizer.amax)
    assert f"int8 amax={amax:.3g} scale={amax / 127:.3g} max" in ex.view.graph.svg  # drawn afresh
