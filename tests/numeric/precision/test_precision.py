"""search_precision: the front is exact for its estimate, the confirmation finds the cheapest
point that meets the target, the answer reproduces from its quantizer alone, and what each
unit's precision means in the plan."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.quantizers.override import OverrideQuantizer
from qviz.errors import ConfigError
from qviz.numeric import search_precision
from qviz.numeric.measure.metrics import sqnr
from qviz.numeric.precision.front import next_probe, pareto_front
from qviz.numeric.precision.units import Precision, assignment_overrides, find_units
from tests.helpers.fork import fork_data

# -- the arithmetic -----------------------------------------------------------------------------
options_st = st.lists(
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=3),
    min_size=1,
    max_size=4,
)


@given(options_st)
@settings(max_examples=150, deadline=None)
def test_the_front_is_every_assignment_no_other_beats(options):
    sums = [
        (sum(options[u][o][0] for u, o in enumerate(c)), sum(options[u][o][1] for u, o in
         enumerate(c)), c) for c in itertools.product(*(range(len(u)) for u in options))
    ]  # fmt: skip
    best = {}
    for cost, pen, _ in sums:  # the best penalty at each cost, then the non-dominated ones
        best[cost] = min(best.get(cost, math.inf), pen)
    expected, floor = [], math.inf
    for cost in sorted(best):
        if best[cost] < floor:
            expected.append((cost, best[cost]))
            floor = best[cost]
    front = pareto_front(options)
    assert [(c, p) for c, p, _ in front] == expected
    for cost, pen, choice in front:  # each point's choice adds up to its figures
        assert sum(options[u][o][0] for u, o in enumerate(choice)) == cost
        assert sum(options[u][o][1] for u, o in enumerate(choice)) == pen


@given(
    st.lists(st.floats(0.01, 100), min_size=1, max_size=40).map(sorted).map(lambda v: v[::-1]),
    st.floats(0.01, 100),
    st.floats(0.3, 3.0),
)
@settings(max_examples=150, deadline=None)
def test_confirming_finds_the_cheapest_point_that_truly_meets(estimates, target, error):
    """Measured = estimate * a constant error: the probes end on the cheapest point whose
    measured penalty meets the target, each probe inside the bracket, in few probes."""
    measured = [e * error for e in estimates]
    passed, failed, probes = {}, {}, 0
    while (i := next_probe(estimates, target, passed, failed)) is not None:
        lo, hi = max(failed, default=-1), min(passed, default=len(estimates))
        assert lo < i < hi
        (passed if measured[i] <= target else failed)[i] = measured[i]
        probes += 1
        assert probes <= len(estimates)
    truth = [i for i, m in enumerate(measured) if m <= target]
    if truth:
        assert min(passed) == truth[0]
        assert probes <= 3  # the first probe measures the error; the rest follow from it
    else:
        assert not passed and len(estimates) - 1 in failed and probes <= 2  # the best one fails


def test_the_front_thins_evenly_and_keeps_both_ends():
    options = [[(i, 10 - i) for i in range(10)]] * 4
    full = pareto_front(options)
    thin = pareto_front(options, max_points=5)
    assert len(thin) == 5 and thin[0][:2] == full[0][:2] and thin[-1][:2] == full[-1][:2]


# -- units --------------------------------------------------------------------------------------
def _quantizer():
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


@pytest.fixture(scope="module")
def fork():
    """Two convs read one ReLU: one activation group, so one unit; then a linear head."""
    model, data = fork_data()
    return qviz.export(model, (data[0],), dynamic_batch=True), data


def test_layers_fed_by_one_observer_are_one_unit(fork):
    gm, _ = fork
    units = find_units(gm, qviz.prepare_pt2e(gm, _quantizer()).plan)
    assert [u.layers for u in units] == [("conv2d",), ("conv2d_1", "conv2d_2"), ("linear",)]


def test_a_precision_is_what_the_plan_observes(fork):
    """w4a16 on the fork: 4-bit weights on both convs, every tensor of the ReLU's group in
    int16 (no int8 rounding before it); float keeps the head in float, with the reason."""
    gm, _ = fork
    units = find_units(gm, qviz.prepare_pt2e(gm, _quantizer()).plan)
    choice = [Precision(8, 8), Precision(4, 16), Precision(None, None)]
    overrides = assignment_overrides(units, choice)
    prepared = qviz.prepare_pt2e(gm, OverrideQuantizer(_quantizer(), overrides))
    plan = prepared.plan
    for layer in ("conv2d_1", "conv2d_2"):
        weight = next(g for g in plan.groups if any(m.consumer == layer and "weight" in
                      m.producer for m in g.members))  # fmt: skip
        assert (weight.spec.quant_min, weight.spec.quant_max) == (-8, 7)
    relu = plan.group_of("relu")
    assert relu.spec.dtype == "int16" and {m.consumer for m in relu.members} >= {
        "conv2d_1", "conv2d_2"}  # fmt: skip
    assert plan.group_of("x -> conv2d").spec.dtype == "int8"  # the stem stays w8a8
    assert "linear" in {f.node for f in plan.float_nodes}


def test_precision_names_are_checked():
    assert Precision.parse("W8A16") == Precision(8, 16)
    for bad in ("w9a8", "w4a4", "int8", "w4"):
        with pytest.raises(ConfigError):
            Precision.parse(bad)


# -- the search ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def searched(fork):
    gm, data = fork
    before = {k: v.clone() for k, v in gm.state_dict().items()}
    result = search_precision(gm, _quantizer(), data, min_sqnr=40.0, progress=False)
    after = gm.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the float model unchanged
    return gm, data, result


def test_the_answer_meets_the_target_and_reproduces_from_its_quantizer(searched):
    """A fresh prepare / calibrate / convert with result.quantizer() (no copies) gives the
    output SQNR the search measured, bit for bit, and it meets the target."""
    gm, data, result = searched
    assert result.met
    prepared = qviz.prepare_pt2e(gm, result.quantizer())
    qviz.calibrate(prepared, data, progress=False)
    fresh = qviz.convert_pt2e(prepared)
    with torch.no_grad():
        ref = torch.cat([gm(x) for x in data])
        ours = torch.cat([fresh(x) for x in data])
    confirmed = [e for e in result.evaluations if e.point == result.chosen][-1]
    assert all(torch.equal(result.model(x), fresh(x)) for x in data)
    assert sqnr(ref, ours) == pytest.approx(confirmed.output_sqnr, rel=1e-6)
    assert confirmed.output_sqnr >= 40.0
    assert len(set(result.assignment().values())) > 1  # a mix: 4 bits where they do not hurt


def test_the_answer_is_the_cheapest_confirmed_and_its_cheaper_neighbour_failed(searched):
    _, _, result = searched
    full = [e for e in result.evaluations if e.point is not None]
    assert len(full) <= 8
    passing = [e for e in full if e.meets]
    assert result.chosen == min(e.point for e in passing)
    if result.chosen > 0:  # the point just cheaper failed, measured or by its estimate
        below = [e for e in full if e.point == result.chosen - 1]
        assert (
            below[0].output_sqnr < 40.0
            if below
            else result.front[result.chosen - 1].estimate < 40.0
        )
    costs = [p.cost for p in result.front]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)


def test_it_is_no_dearer_than_the_cheapest_uniform_precision_that_meets(searched):
    gm, data, result = searched
    for name in ("w4a8", "w8a8", "w8a16"):
        choice = [Precision.parse(name)] * len(result.units)
        uniform = OverrideQuantizer(_quantizer(), assignment_overrides(list(result.units), choice))
        prepared = qviz.prepare_pt2e(gm, uniform)
        qviz.calibrate(prepared, data, progress=False)
        model = qviz.convert_pt2e(prepared)
        with torch.no_grad():
            db = sqnr(torch.cat([gm(x) for x in data]), torch.cat([model(x) for x in data]))
        if db >= 40.0:
            cost = sum(s.cost for s in result.screened if s.precision == name)
            assert result.front[result.chosen].cost <= cost
            return
    pytest.fail("no uniform precision met 40 dB: the test model needs another target")


def test_the_result_draws_on_the_graph_and_lists_each_layer(searched):
    gm, _, result = searched
    from qviz.viz import graph

    dot = graph(gm, metrics=result, metric_column="precision").dot
    for precision in set(result.assignment().values()):
        assert f"precision: {precision}" in dot
    table = result.table()
    assert table["node"].tolist() == ["conv2d", "conv2d_1", "conv2d_2", "linear"]
    assert table["precision"].tolist() == [result.assignment()[n] for n in table["node"]]
    assert {"screened w4a8", "screened float"} <= set(table.columns)
    assert result.summary() in repr(result) and "<table" in result._repr_html_()
    fig = result.plot()
    assert fig.axes[0].get_ylabel() == "output SQNR (dB)"


def _accuracy(float_out, quant_out, target):
    return float((quant_out.argmax(1) == float_out.argmax(1)).float().mean())


def test_a_metric_target_with_its_own_screening_data_and_cost(fork):
    """max_drop on an agreement metric; screening on one batch, confirming on all; weight
    storage as the cost, or the user's function."""
    gm, data = fork
    seen = []

    def cost(layer, precision):
        seen.append((layer, precision.name))
        return precision.bits[0]

    result = search_precision(gm, _quantizer(), data, metric=_accuracy, max_drop=0.05,
                              screening_data=data[:1], cost=cost, progress=False)  # fmt: skip
    assert result.met and result.target == "metric" and result.float_metric == 1.0
    confirmed = [e for e in result.evaluations if e.point == result.chosen][-1]
    assert confirmed.metric >= 0.95
    assert {layer for layer, _ in seen} == {"conv2d", "conv2d_1", "conv2d_2", "linear"}
    assert result.cost_unit == "cost"
    size = search_precision(gm, _quantizer(), data, min_sqnr=20.0, cost="size",
                            candidates=["w8a8"], progress=False)  # fmt: skip
    w8 = 8 * 3 * 3 * 3 + 8 * 8 * 3 * 3 + 8 * 8 + 8 * 4  # weight elements, one byte each
    assert size.cost_unit == "KiB" and size.front[0].cost == pytest.approx(w8 / 1024)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give one target"),
        ({"min_sqnr": 30.0, "max_drop": 0.01}, "give one target"),
        ({"max_drop": 0.01}, "a drop of what"),
        ({"min_sqnr": 30.0, "candidates": ["w4a4"]}, "activation_bits must be 8 or 16"),
        ({"min_sqnr": 30.0, "cost": "latency"}, "cost='latency'"),
        ({"min_sqnr": 30.0, "layers": ["relu"]}, "'relu' is not an operator with an observed"),
        ({"min_sqnr": 30.0, "max_evaluations": 0}, "max_evaluations=0"),
        ({"min_sqnr": "high"}, "min_sqnr='high'"),
    ],
)
def test_bad_arguments_are_named(fork, kwargs, message):
    gm, data = fork
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        search_precision(gm, _quantizer(), data, progress=False, **kwargs)


def test_a_quantized_model_is_refused(fork):
    gm, data = fork
    prepared = qviz.prepare_pt2e(gm, _quantizer())
    with pytest.raises(ConfigError, match="search_precision"):
        search_precision(prepared, _quantizer(), data, min_sqnr=30.0, progress=False)


def test_an_unmet_target_says_so(fork):
    gm, data = fork
    result = search_precision(gm, _quantizer(), data, min_sqnr=200.0,
                              candidates=["w4a8", "w8a8"], progress=False)  # fmt: skip
    assert not result.met and result.model is None
    assert result.summary().startswith("no assignment met output SQNR >= 200 dB")
    with pytest.raises(ConfigError, match="no assignment met the target"):
        result.quantizer()
    assert isinstance(result.quantizer(point=-1), OverrideQuantizer)  # any point, on request


def test_when_the_cheapest_assignment_meets_the_target_nothing_is_screened(fork):
    gm, data = fork
    result = search_precision(gm, _quantizer(), data, min_sqnr=20.0, progress=False)
    assert result.met and not result.screened and len(result.front) == 1
    assert set(result.assignment().values()) == {"w4a8"}
    assert [(e.point, e.screening) for e in result.evaluations] == [(0, False)]
    assert result.evaluations[0].output_sqnr >= 20.0
    from qviz.viz import graph

    assert "precision: w4a8" in graph(gm, metrics=result, metric_column="precision").dot
