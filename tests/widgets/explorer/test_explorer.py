"""CalibrationExplorer without a kernel: drive the Python equivalents and the controls."""

import re

import pytest
import torch

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.widgets import CalibrationExplorer


@pytest.fixture
def explorer(calibrated_digits):
    return CalibrationExplorer(calibrated_digits())


def _line_x(svg, method):
    return float(re.search(rf'data-gid="method:{method}" data-x="([^"]+)"', svg).group(1))


def test_opens_on_the_first_histogram_observer(explorer):
    assert len(explorer.observers) == 8 and explorer.state.observer == explorer.observers[0]
    assert explorer.state.method == "l2" and explorer.state.num_bits == 8
    assert [r["method"] for r in explorer.rows] == ["max", "percentile", "entropy", "mse", "l2"]
    assert explorer.view.graph is not None and explorer.view.graph.svg.startswith("<svg")
    # the histogram scrolls sideways in a narrow panel rather than shrink its text under 10 px
    shown = explorer.view.histogram.value
    assert shown.startswith('<div class="qviz-scroll">') and "min-width:510px" in shown


def test_select_by_tensor_and_lines_match_the_calibrator(explorer):
    explorer.select("relu_2")
    group = explorer.model.plan.group_of("relu_2")
    assert explorer.state.observer == group.observer
    calib = explorer.model.get_submodule(group.observer).calibrator
    for method in ("max", "entropy", "mse"):
        expected = float(calib.compute_amax(method))
        assert _line_x(explorer.svg, method) == pytest.approx(expected, rel=1e-5), method


def test_percentile_slider_moves_the_percentile_range(explorer):
    explorer.select("relu_2").set(method="percentile", percentile=99.0)
    low = next(r for r in explorer.rows if r["method"] == "percentile")["high"]
    explorer.set(percentile=99.999)
    high = next(r for r in explorer.rows if r["method"] == "percentile")["high"]
    assert high > low
    assert "font-weight:bold" in explorer.view.table.value  # the considered row is highlighted


def test_fewer_bits_pick_coarser_grids(explorer):
    eight = {r["method"]: r["scale"] for r in explorer.rows}
    four = {r["method"]: r["scale"] for r in explorer.set(num_bits=4).rows}
    assert all(four[m] > eight[m] for m in ("max", "entropy", "mse"))


def test_use_this_range_reaches_the_plan_and_convert(explorer):
    explorer.select("relu_2").set(method="entropy")
    obs = explorer.model.get_submodule(explorer.state.observer)
    expected = obs.calculate_qparams(method="entropy")
    record = explorer.use_range()
    assert record.choice == "entropy" and explorer.choices == {explorer.state.observer: "entropy"}
    assert "★" in explorer.view.table.value
    assert [r["method"] for r in explorer.rows][-1] == "l2"  # still offered after a choice
    qp = qviz.convert_pt2e(explorer.model).plan.group_of("relu_2").qparams
    assert (qp.scale, qp.zero_point) == (float(expected[0]), int(expected[1]))


def test_apply_to_all(explorer):
    explorer.set(method="mse")
    records = explorer.apply_to_all()
    assert len(records) == 8 and set(explorer.choices.values()) == {"mse"}


def test_refusals_keep_the_state_and_say_why(explorer):
    before = explorer.state
    explorer.set(method="median")
    assert explorer.state == before and "method 'median'" in explorer.error
    assert "⚠" in explorer.view.status.value
    explorer.set(num_bits=4)
    assert explorer.use_range() is None and "only explores" in explorer.error
    assert explorer.choices == {}
    explorer.select("activation_post_process_1")  # a weight's PerChannelMinMaxObserver
    assert "only HistogramObservers" in explorer.error or "neither" in explorer.error
    explorer.set(num_bits=8)
    assert explorer.error is None


def _button(widget, description):
    """The Button labelled ``description`` anywhere inside ``widget``."""
    if getattr(widget, "description", None) == description and hasattr(widget, "click"):
        return widget
    for child in getattr(widget, "children", ()):
        found = _button(child, description)
        if found is not None:
            return found
    return None


def test_controls_call_the_python_equivalents(explorer):
    explorer.view.method.value = "mse"
    assert explorer.state.method == "mse"
    explorer.view.observer.value = explorer.observers[3]
    assert explorer.state.observer == explorer.observers[3]
    explorer.view.graph.selected = "relu_2"  # a click on the graph
    assert explorer.state.observer == explorer.model.plan.group_of("relu_2").observer
    explorer.view.method.value = "entropy"
    _button(explorer.widget, "Use this range").click()
    assert explorer.choices == {explorer.state.observer: "entropy"}


def test_observers_without_switchable_statistics_show_their_own_method(calibrated_digits):
    ex = CalibrationExplorer(calibrated_digits(switchable=False), graph=False)
    assert [r["method"] for r in ex.rows] == ["l2"]
    assert "switchable=True" in ex.view.status.value
    ex.set(method="entropy")
    assert ex.use_range() is None and "switchable=True" in ex.error


def test_rejects_models_without_histograms():
    from qviz.errors import ConfigError

    with pytest.raises(ConfigError, match="prepare_pt2e"):
        CalibrationExplorer(torch.nn.ReLU())


def test_choices_travel_as_overrides(explorer):
    from qviz.engine.quantizers import OverrideQuantizer

    explorer.select("relu_2").set(method="percentile", percentile=99.9).use_range()
    explorer.select("relu").set(method="mse").use_range()
    overrides = explorer.overrides
    assert overrides["relu_2"] == {
        "observer": "HistogramObserver",
        "method": "percentile",
        "percentile": 99.9,
    }
    assert overrides["relu -> add"] == {"observer": "HistogramObserver", "method": "mse"}
    base = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, switchable=True)
    )
    gm = explorer.model  # any prepared copy carries the graph; re-prepare from its float twin
    again = qviz.prepare_pt2e(_float_graph(), OverrideQuantizer(base, overrides))
    assert [g.members for g in again.plan.groups] == [g.members for g in gm.plan.groups]
    observer = again.get_submodule(again.plan.group_of("relu_2").observer)
    assert (observer.method, observer.percentile) == ("percentile", 99.9)


def _float_graph():
    calib = [x for x, _ in digits_loaders(batch_size=90).calibration]
    return qviz.export(digits_model(), (calib[0],), dynamic_batch=True)


def test_module_clicks_fold_the_graph(explorer):
    explorer.view.graph.module_click = {"path": "block", "n": 1}
    assert "module/block" in explorer.view.graph.svg
    explorer.view.graph.module_click = {"path": "block", "n": 2}
    assert "module/block" not in explorer.view.graph.svg


def test_a_converted_model_is_refused_naming_what_to_pass(calibrated_digits):
    """Issue 25: it said only "no HistogramObserver"."""
    from qviz.errors import ConfigError

    converted = qviz.convert_pt2e(calibrated_digits())
    with pytest.raises(ConfigError, match=r"calibrated_model.*converted.*before qviz.convert_pt2e"):
        CalibrationExplorer(converted, graph=False)
