"""choose_range: a user's calibration choice reaches the plan and convert."""

import pytest
import torch

import qviz
from qviz.engine.pt2e.range_choice import choose_range
from qviz.errors import ConfigError


@pytest.fixture
def prepared(calibrated_digits):
    return calibrated_digits()


def test_one_observer_choice_is_recorded_and_converted(prepared):
    group = prepared.plan.group_of("relu_2")
    expected = prepared.get_submodule(group.observer).calculate_qparams(method="entropy")
    (record,) = choose_range(prepared, "entropy", observers=group.observer)
    assert record.choice == "entropy" and record.group == group.group
    assert f"({group.observer}):" in str(prepared.plan) and "[user choice: entropy]" in str(
        prepared.plan
    )
    converted = qviz.convert_pt2e(prepared)
    qp = converted.plan.group_of("relu_2").qparams
    assert (qp.scale, qp.zero_point) == (float(expected[0]), int(expected[1]))
    assert converted.plan.group_of("relu_2").choice == "entropy"
    others = [g for g in converted.plan.groups if g.group != group.group]
    assert all(g.choice is None for g in others)


def test_apply_to_all_and_percentile(prepared):
    records = choose_range(prepared, "percentile", percentile=99.9)
    histogram = [g for g in prepared.plan.groups if g.spec.observer == "HistogramObserver"]
    assert len(records) == len(histogram) == 8
    assert {r.choice for r in records} == {"percentile 99.9"}
    assert all(prepared.get_submodule(r.observer).percentile == 99.9 for r in records)


def test_refusals_change_nothing(calibrated_digits):
    prepared = calibrated_digits(switchable=False)
    with pytest.raises(ConfigError, match="switchable=True"):
        choose_range(prepared, "entropy")
    assert all(g.choice is None for g in prepared.plan.groups)
    assert {prepared.get_submodule(g.observer).method for g in prepared.plan.groups[:1]} == {"l2"}
    with pytest.raises(ConfigError, match="not HistogramObserver groups"):
        choose_range(
            prepared, "l2", observers=["activation_post_process_1"]
        )  # a weight's MinMax observer
    with pytest.raises(ConfigError, match="method"):
        choose_range(prepared, "median")
    with pytest.raises(ConfigError, match="prepared model"):
        choose_range(torch.nn.ReLU(), "l2")
