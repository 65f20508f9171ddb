"""OrderFreeHistogramObserver: the histogram is a function of the values seen, bit for bit.

The reference is direct binning in float64 of every value seen at once, on the final range
(``floor(x * bins / R) + bins`` with ``R`` the power of two above the largest ``|x|``, from
``math.frexp``), independent of the observer's growing-and-merging code.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qviz
from qviz.engine.distributed.merge_rules import REDUCE, Shape, rule_for
from qviz.engine.observers import HistogramObserver, OrderFreeHistogramObserver
from qviz.errors import CalibrationError, ConfigError

BINS = 16


def _reference(values: list[float], bins: int) -> tuple[list[int], float]:
    amax = max(abs(v) for v in values)
    hist_range = 0.0 if amax == 0 else math.ldexp(1.0, math.frexp(amax)[1])
    counts = [0] * (2 * bins)
    for v in values:
        counts[bins if hist_range == 0 else math.floor(v * bins / hist_range) + bins] += 1
    return counts, hist_range


def _observe(batches, bins: int = BINS, **kwargs) -> OrderFreeHistogramObserver:
    obs = OrderFreeHistogramObserver(bins=bins, **kwargs)
    for batch in batches:
        obs(batch)
    return obs


def _state(obs: OrderFreeHistogramObserver) -> tuple:
    return (obs.counts.tolist(), float(obs.hist_range), float(obs.min_val), float(obs.max_val))


_VALUE = st.one_of(
    st.floats(-1e4, 1e4, width=32),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -4.0, 1e-40, -3e-42, 2.0**-126]),
)
_BATCHES = st.lists(st.lists(_VALUE, min_size=1, max_size=20), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(_BATCHES, st.randoms(use_true_random=False), st.sampled_from([2, 8, 64]))
def test_histogram_is_the_same_for_any_order_and_split_of_the_batches(batches, rng, bins):
    """Permuted, re-split and one-batch: the same counts, range and qparams, bit for bit, and
    the same as binning every value directly on the final range."""
    tensors = [torch.tensor(b, dtype=torch.float32) for b in batches]
    values = torch.cat(tensors)
    shuffled = values[torch.randperm(len(values), generator=torch.Generator().manual_seed(7))]
    cuts = sorted(rng.sample(range(1, len(values)), min(3, len(values) - 1)))
    pieces = torch.tensor_split(shuffled, cuts)
    order = rng.sample(range(len(tensors)), len(tensors))
    ways = [tensors, [tensors[i] for i in order], list(pieces), [values]]
    observed = [_observe(way, bins) for way in ways]
    counts, hist_range = _reference(values.double().tolist(), bins)
    assert _state(observed[0])[:2] == (counts, hist_range)
    qparams = observed[0].calculate_qparams()
    for obs in observed[1:]:
        assert _state(obs) == _state(observed[0])
        assert all(map(torch.equal, obs.calculate_qparams(), qparams))


def test_growing_moves_each_side_outward_from_zero_and_keeps_zeros_in_place():
    obs = _observe([torch.zeros(3), torch.tensor([-0.75, 0.3])], bins=2)
    assert (obs.counts.tolist(), float(obs.hist_range)) == ([1, 0, 4, 0], 1.0)
    obs(torch.tensor([-3.0]))  # range 1 -> 4: everything seen so far is within one bin of 0
    assert (obs.counts.tolist(), float(obs.hist_range)) == ([1, 1, 4, 0], 4.0)


@pytest.mark.parametrize(
    "batches",
    [
        [torch.full((5,), 2.0**-140), torch.tensor([-1e-41, 3e-43])],  # subnormal: float64 path
        [torch.randn(1000, dtype=torch.float64) * 1e-200, torch.tensor([1e-190])],
        [torch.randn(300).half(), torch.randn(200).bfloat16() * 8, torch.tensor([3e38])],
    ],
    ids=["subnormal", "float64", "half_bfloat16_huge"],
)
def test_extreme_magnitudes_and_dtypes_stay_exact(batches):
    values = torch.cat([b.double() for b in batches]).tolist()
    one = _observe(batches, bins=2048)
    other = _observe(batches[::-1], bins=2048)
    assert _state(one)[:2] == _reference(values, 2048)
    assert _state(one) == _state(other)


def _merged(parts: list[OrderFreeHistogramObserver]) -> OrderFreeHistogramObserver:
    """The distributed merge rule, with the reductions done here (what the collectives do)."""
    rule, shape = rule_for(parts[0]), Shape(None, ())

    def reduce(contributions):
        return {
            key: _fold(op, [c[key][1] for c in contributions])
            for key, (op, _) in contributions[0].items()
        }

    r1 = reduce([rule.round1(o, shape) for o in parts])
    r2 = reduce([rule.round2(o, r1, shape) for o in parts])
    target = copy.deepcopy(parts[0])
    rule.apply(target, r1, r2, shape)
    return target


def _fold(op, tensors):
    out = tensors[0]
    for t in tensors[1:]:
        out = REDUCE[op](out, t)
    return out


def test_the_merge_rule_gives_one_process_s_histogram_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(500, generator=g) * s for s in (0.1, 3.0, 0.5, 40.0, 1.0)]
    shards = [batches[:3], [], batches[3:]]
    merged = _merged([_observe(shard) for shard in shards])
    single = _observe(batches)
    assert _state(merged) == _state(single)
    assert merged.num_batches == 5 and merged.num_elements == 2500
    assert all(map(torch.equal, merged.calculate_qparams(), single.calculate_qparams()))


def test_qparams_are_close_to_torch_s_histogram_observer():
    """The same L2 search on a differently gridded histogram: nearly the same range."""
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(20_000, generator=g) * s for s in (1.0, 1.5)]
    ours = _observe(batches, bins=2048, dtype=torch.int8).calculate_qparams()
    torchs = HistogramObserver(dtype=torch.int8)
    for b in batches:
        torchs(b)
    scale, zero_point = torchs.calculate_qparams()
    assert abs(float(ours[0]) / float(scale) - 1) < 0.02
    assert abs(int(ours[1]) - int(zero_point)) <= 1


def test_in_a_quantization_spec_any_batch_order_gives_the_same_model():
    from dataclasses import replace

    from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    data = [torch.randn(4, 8) * s for s in (0.5, 2.0, 1.0, 7.0)]
    gm = qviz.export(model.eval(), (data[0],))
    config = get_symmetric_quantization_config()
    spec = replace(
        config.input_activation, observer_or_fake_quant_ctr=OrderFreeHistogramObserver.with_args(
            eps=2**-12
        ),
    )  # fmt: skip
    quantizer = XNNPACKQuantizer().set_global(
        replace(config, input_activation=spec, output_activation=spec)
    )
    outs = []
    for order in (data, data[::-1]):
        prepared = qviz.calibrate(qviz.prepare_pt2e(gm, quantizer), order, progress=False)
        with torch.no_grad():
            outs.append(qviz.convert_pt2e(prepared)(data[0]))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"bins": 1000}, "bins must be a power of two"),
        ({"bins": 1}, "bins must be a power of two"),
        ({"bins": True}, "bins must be an int"),
        ({"is_dynamic": True}, "does not support dynamic"),
        ({"qscheme": torch.per_channel_affine}, "qscheme"),
    ],
)
def test_bad_arguments_raise_config_error_naming_the_fix(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        OrderFreeHistogramObserver(**kwargs)


def test_no_data_and_non_finite_values_raise_calibration_error():
    obs = OrderFreeHistogramObserver()
    with pytest.raises(CalibrationError, match="observed no data"):
        obs.calculate_qparams()
    with pytest.raises(CalibrationError, match="1 NaN"):
        obs(torch.tensor([1.0, float("nan")]))


def test_reset_state_dict_and_empty_batches():
    obs = _observe([torch.tensor([-1.0, 2.5]), torch.empty(0)])
    assert obs.num_batches == 1
    other = OrderFreeHistogramObserver(bins=BINS)
    other.load_state_dict(obs.state_dict())
    assert _state(other) == _state(obs)
    assert all(map(torch.equal, other.calculate_qparams(), obs.calculate_qparams()))
    obs.reset()
    assert _state(obs) == ([0] * 2 * BINS, 0.0, math.inf, -math.inf) and obs.num_batches == 0


def test_all_zeros_give_the_smallest_scale():
    obs = _observe([torch.zeros(4)], eps=2**-12)
    assert float(obs.hist_range) == 0.0
    assert float(obs.calculate_qparams()[0]) == 2**-12
