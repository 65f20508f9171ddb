"""Graph observers: bit-for-bit agreement with torchao's, properties of the arithmetic, errors.

The reference is ``torchao.quantization.pt2e.observer``: given the same batches, every qviz
observer must return a scale and zero_point with the same dtype, shape and values
(``torch.equal``); the HistogramObserver must also hold the same histogram and range.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qviz.engine import observers as qo
from qviz.engine.observers.binning import histc
from qviz.engine.observers.l2_search import l2_search, quantization_errors
from qviz.engine.tensor.calib import CalibMethod, HistogramCalibrator
from qviz.errors import CalibrationError, ConfigError, QvizError

ao = pytest.importorskip("torchao.quantization.pt2e.observer")
pytestmark = pytest.mark.filterwarnings("ignore")  # torchao's reduce_range deprecation warnings
CALIB_METHODS = qo.HISTOGRAM_METHODS[1:]


# -- data ---------------------------------------------------------------------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


_KINDS = {  # named batch sequences: ranges that grow and shrink, degenerate and one-sided data
    "randn": lambda n, u: [n(4, 8, 5, 5) for _ in range(3)],
    "grow_shrink": lambda n, u: [n(2000) * s for s in (1.0, 3.0, 0.5, 10.0, 0.1)],
    "shift": lambda n, u: [u(1500) + 3.0, u(1500) - 5.0, n(500)],  # left end grows, then right
    "zeros": lambda n, u: [torch.zeros(64), torch.zeros(3, 7)],
    "constant_then_wider": lambda n, u: [torch.full((100,), -0.75), n(800), torch.full((9,), 4.0)],
    "negative": lambda n, u: [-u(1000) - 0.5, -u(300) * 4.0],
    "relu": lambda n, u: [n(16, 32, 6, 6).relu(), n(16, 32, 6, 6).relu() * 2.0],
    "outlier": lambda n, u: [torch.cat([n(5000), torch.tensor([60.0])]), n(5000)],
    "tiny": lambda n, u: [n(1000) * 1e-6, n(1000) * 3e-7],
    "dtypes": lambda n, u: [n(1000).double(), (n(500) * 3).half(), torch.tensor([7.5])],
    "constant": lambda n, u: [torch.full((100,), 2.5), torch.full((40,), 2.5)],  # keep last
}
PER_TENSOR_KINDS = list(_KINDS)


def _batches(kind: str, seed: int = 0) -> list[torch.Tensor]:
    rand = functools.partial(torch.rand, generator=_gen(seed))
    return _KINDS[kind](functools.partial(torch.randn, generator=rand.keywords["generator"]), rand)


# (dtype, qscheme, extra kwargs): defaults, custom ranges, reduce_range, eps, int32
I8, U8, I32, AFF, SYM = torch.int8, torch.uint8, torch.int32, "affine", "symmetric"
R127, R0_127 = {"quant_min": -127, "quant_max": 127}, {"quant_min": 0, "quant_max": 127}
PER_TENSOR_CONFIGS = [(I8, AFF, {}), (I8, SYM, {}), (U8, AFF, {}), (U8, SYM, {}), (I8, SYM, R127)]
PER_TENSOR_CONFIGS += [(I8, AFF, R127), (U8, AFF, R0_127), (U8, SYM, R0_127), (I8, SYM, R0_127)]
PER_TENSOR_CONFIGS += [(I8, AFF, {"reduce_range": True}), (U8, AFF, {"reduce_range": True})]
PER_TENSOR_CONFIGS += [(I8, SYM, {"reduce_range": True, "eps": 2**-12})]
PER_TENSOR_CONFIGS += [(U8, AFF, {"quant_min": 0, "quant_max": 255, "eps": 0.05})]
PER_TENSOR_CONFIGS += [(I32, AFF, {}), (I32, SYM, {"eps": 1e-10})]


def _config_id(config) -> str:
    dtype, qscheme, extra = config
    return "-".join([str(dtype)[6:], qscheme, *(f"{k}={v}" for k, v in extra.items())])


def _kwargs(config, per: str = "tensor") -> dict:
    """Observer kwargs of a (dtype, scheme, extra) config: torch.per_{per}_{scheme}."""
    dtype, scheme, extra = config
    return {"dtype": dtype, "qscheme": getattr(torch, f"per_{per}_{scheme}"), **extra}


def _feed(observer, batches):
    for x in batches:
        assert observer(x) is x
    return observer


def assert_same_qparams(ours, ref) -> None:
    """Scale and zero_point identical: dtype, shape and every value."""
    for mine, theirs in zip(ours, ref, strict=True):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        assert torch.equal(mine, theirs), (ours, ref)


def _compare(name: str, kwargs: dict, batches) -> qo.ObserverBase:
    ours = _feed(getattr(qo, name)(**kwargs), batches)
    ref = _feed(getattr(ao, name)(**kwargs), batches)
    assert_same_qparams(ours.calculate_qparams(), ref.calculate_qparams())
    assert torch.equal(ours.min_val, ref.min_val) and torch.equal(ours.max_val, ref.max_val)
    return ours


# -- bit-for-bit: per-tensor min/max ---------------------------------------------------------------
@pytest.mark.parametrize("config", PER_TENSOR_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("name", ["MinMaxObserver", "MovingAverageMinMaxObserver"])
def test_minmax_observers_match_torchao(name, config):
    for kind in PER_TENSOR_KINDS:
        ours = _compare(name, _kwargs(config), _batches(kind))
        assert ours.num_batches == len(_batches(kind))


@pytest.mark.parametrize("constant", [0.01, 0.37, 1.0])
def test_moving_average_constants_and_activations_match_torchao(constant):
    kwargs, batches = {"averaging_constant": constant}, _batches("grow_shrink", 3)
    _compare("MovingAverageMinMaxObserver", kwargs, batches + _batches("shift", 4))
    g = _gen(5)  # per channel, on an activation (ch_axis=1)
    batches = [torch.randn(4, 16, 9, 9, generator=g) * s for s in (1.0, 2.0)]
    _compare("MovingAveragePerChannelMinMaxObserver", {"ch_axis": 1, **kwargs}, batches)
    _compare("PerChannelMinMaxObserver", {"ch_axis": 1, "dtype": torch.int8}, batches)


# -- bit-for-bit: per channel ------------------------------------------------------------------
PER_CHANNEL_CONFIGS = [(I8, SYM, {}), (I8, AFF, {}), (U8, AFF, {}), (U8, SYM, {}), (I8, SYM, R127)]
PER_CHANNEL_CONFIGS += [(U8, AFF, {**R0_127, "eps": 2**-12}), (I8, AFF, {"reduce_range": True})]
PER_CHANNEL_CONFIGS += [(U8, "affine_float_qparams", {}), (I32, SYM, {})]


def _weights(seed: int, ch_axis: int) -> list[torch.Tensor]:
    """6-channel weights along ch_axis; channel 0 is all zeros, 1 constant, 2 negative."""
    g, out = _gen(seed), []
    for scale in (1.0, 0.2, 4.0):
        w = torch.randn(6, 5, 3, 3, generator=g) * scale
        w[0], w[1], w[2] = 0.0, 0.3, -w[2].abs() - 0.1
        out.append(w.movedim(0, ch_axis))
    return out


@pytest.mark.parametrize("config", PER_CHANNEL_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("ch_axis", [0, 1, -3])
@pytest.mark.parametrize(
    "name", ["PerChannelMinMaxObserver", "MovingAveragePerChannelMinMaxObserver"]
)
def test_per_channel_observers_match_torchao(name, ch_axis, config):
    kwargs = {"ch_axis": ch_axis, **_kwargs(config, "channel")}
    assert _compare(name, kwargs, _weights(ch_axis + 10, ch_axis)).min_val.shape == (6,)


# -- bit-for-bit: HistogramObserver -------------------------------------------------------------
def _compare_histogram(kwargs: dict, batches) -> None:
    ours = _feed(qo.HistogramObserver(**kwargs), batches)
    ref = _feed(ao.HistogramObserver(**kwargs), batches)
    assert torch.equal(ours.histogram, ref.histogram)
    assert torch.equal(ours.min_val, ref.min_val) and torch.equal(ours.max_val, ref.max_val)
    assert_same_qparams(ours.calculate_qparams(), ref.calculate_qparams())


@pytest.mark.parametrize("config", PER_TENSOR_CONFIGS[:13], ids=_config_id)
def test_histogram_observer_matches_torchao(config):
    kinds = PER_TENSOR_KINDS if config == PER_TENSOR_CONFIGS[0] else PER_TENSOR_KINDS[:-1]
    for kind in kinds:  # torchao's search takes ~1 s on constant data: run that once
        _compare_histogram(_kwargs(config), _batches(kind))


@pytest.mark.parametrize(
    ("kwargs", "batches"),
    [
        ({"bins": 256, "dtype": torch.uint8}, _batches("grow_shrink", 1) + _batches("relu", 1)),
        ({"bins": 1000}, _batches("grow_shrink", 2) + _batches("negative", 2)),
        ({"bins": 2047, "qscheme": torch.per_tensor_symmetric}, _batches("shift", 3)),
        ({"dtype": torch.int32}, _batches("grow_shrink", 7)),
        # several blocks of the vectorized binning; a range that grows, then stays
        ({"eps": 2**-12}, [torch.randn(4, 64, 28, 28, generator=_gen(8)) * k for k in (0.5, 1)]),
    ],
    ids=["bins256", "bins1000", "bins2047", "int32", "large"],
)
def test_histogram_observer_variants_match_torchao(kwargs, batches):
    _compare_histogram(kwargs, batches)


def test_l2_search_matches_torchao_on_fractional_histograms():
    """Re-binned histograms hold fractional counts; the search must still agree exactly."""
    g = _gen(9)
    for trial in range(6):
        hist = torch.rand(2048, generator=g) * (torch.rand(2048, generator=g) < 0.6) * 50.0
        hist[: trial * 100] = 0.0
        ref = ao.HistogramObserver(dtype=torch.int8)
        ref.histogram.copy_(hist), ref.min_val.fill_(-1.5 - trial), ref.max_val.fill_(2 + trial)
        low, high = ref._non_linear_param_search()
        start, end = l2_search(hist, float(ref.min_val), float(ref.max_val), ref.dst_nbins)
        width = (ref.max_val - ref.min_val) / ref.bins
        assert torch.equal(ref.min_val + width * start, low)
        assert torch.equal(ref.min_val + width * (end + 1), high)


def test_quantization_errors_match_torchao_elementwise():
    g = _gen(10)
    ref = ao.HistogramObserver(dtype=torch.uint8)
    ref.histogram.copy_(torch.randint(0, 40, (2048,), generator=g).float())
    ref.min_val.fill_(-0.3), ref.max_val.fill_(1.7)
    starts = torch.randint(0, 900, (50,), generator=g).tolist()
    ends = torch.randint(1100, 2048, (50,), generator=g).tolist()
    width = (float(ref.max_val) - float(ref.min_val)) / ref.bins
    ours = quantization_errors(ref.histogram, width, ref.dst_nbins, starts, ends)
    want = [ref._compute_quantization_error(s, e) for s, e in zip(starts, ends, strict=True)]
    assert ours.tolist() == want


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=300),
    bins=st.sampled_from([2, 7, 256, 2048]),
    widen=st.floats(0.0, 10.0, width=32),
)
def test_histc_equals_torch_histc(values, bins, widen):
    x = torch.tensor(values, dtype=torch.float32)
    low, high = torch.aminmax(x)
    low = low - widen  # the observer passes ranges that cover the batch
    assert torch.equal(histc(x, bins, low, high), torch.histc(x, bins, min=low, max=high))


def test_histc_equals_torch_histc_on_bin_edges():
    """Values exactly on (and one ulp around) every bin edge, where rounding decides."""
    low, high = torch.tensor(-1.3), torch.tensor(2.9)
    e = torch.linspace(float(low), float(high), 2049)
    x = torch.cat([e, e.nextafter(e + 1), e.nextafter(e - 1)]).clamp(low, high)
    assert torch.equal(histc(x, 2048, low, high), torch.histc(x, 2048, min=low, max=high))
    assert torch.equal(histc(x, 1000, low, high), torch.histc(x, 1000, min=low, max=high))


@settings(max_examples=25, deadline=None)
@given(
    size=st.sampled_from([2**16 - 1, 2**16, 2**17 + 3, 2**21 + 5, 2 * 2**21 + 2**17 + 7]),
    kind=st.sampled_from(["relu", "normal", "edges", "constant tail"]),
    bins=st.sampled_from([7, 2048]),
    seed=st.integers(0, 2**16),
    threads=st.sampled_from([1, 2]),
)
def test_histc_equals_torch_histc_on_large_tensors(size, kind, bins, seed, threads):
    """Past the block, split and round sizes, counted on one or two threads: the same bits."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, generator=g) * 3
    if kind == "relu":
        x = x.relu_()  # half the values in the first bin, -0.0 among them
        x[::97] = -0.0
    elif kind == "edges":
        e = torch.linspace(-2.0, 5.0, bins + 1)
        x = e[torch.randint(0, bins + 1, (size,), generator=g)]
    elif kind == "constant tail":
        x[size // 3 :] = x[0]
    low, high = torch.aminmax(x)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ours = histc(x, bins, low, high)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(ours, torch.histc(x, bins, min=low, max=high))


# -- alternative HistogramObserver methods --------------------------------------------------------
@pytest.mark.parametrize("method", CALIB_METHODS)
def test_histogram_methods_use_the_calibrators_amax(method):
    batches = _batches("grow_shrink", seed=11)
    obs = _feed(
        qo.HistogramObserver(dtype=torch.int8, switchable=True, qscheme=torch.per_tensor_symmetric),
        batches,
    )
    calib = HistogramCalibrator(8, num_bins=2048)
    for x in batches:
        calib.collect(x)
    amax = calib.compute_amax(method)
    assert torch.equal(obs.calibrator.compute_amax(method), amax)
    scale, zero_point = obs.calculate_qparams(method=method)
    assert torch.equal(scale, torch.max(amax / 127.5, obs.eps)) and zero_point.tolist() == [0]


@pytest.mark.parametrize("method", CALIB_METHODS)
@pytest.mark.parametrize("qscheme", [torch.per_tensor_affine, torch.per_tensor_symmetric])
def test_histogram_methods_clip_the_observed_range(method, qscheme):
    batches = _batches("relu", seed=12) + _batches("negative", seed=13)
    obs = _feed(qo.HistogramObserver(dtype=torch.uint8, qscheme=qscheme, method=method), batches)
    amax = obs.calibrator.compute_amax(method)
    ref = qo.MinMaxObserver(dtype=torch.uint8, qscheme=qscheme)
    if qscheme == torch.per_tensor_symmetric:
        ref(torch.stack([-amax, amax]))
    else:
        ref(torch.stack([torch.max(obs.min_val, -amax), torch.min(obs.max_val, amax)]))
    assert_same_qparams(obs.calculate_qparams(), ref.calculate_qparams())
    if method == "max":  # max |x| clips nothing: exactly the MinMaxObserver's qparams
        plain = _feed(qo.MinMaxObserver(dtype=torch.uint8, qscheme=qscheme), batches)
        assert_same_qparams(obs.calculate_qparams(), plain.calculate_qparams())


def test_method_can_change_after_calibration():
    batches = _batches("outlier", seed=15)
    obs = _feed(qo.HistogramObserver(dtype=torch.int8, switchable=True), batches)
    results = {m: obs.calculate_qparams(method=m) for m in qo.HISTOGRAM_METHODS}
    assert obs.method == "l2"  # a per-call method does not change the observer
    for method in qo.HISTOGRAM_METHODS:
        obs.method = method.upper()
        assert obs.method == method
        assert_same_qparams(obs.calculate_qparams(), results[method])
    scale_99, _ = obs.calculate_qparams(method="percentile", percentile=99.0)
    assert float(scale_99) < float(results["percentile"][0])
    obs.method = "l2"  # the default method still matches torchao after all that
    ref = _feed(ao.HistogramObserver(dtype=torch.int8), batches)
    assert_same_qparams(obs.calculate_qparams(), ref.calculate_qparams())


def test_not_switchable_keeps_only_what_its_method_needs():
    batches = _batches("randn", seed=16)
    l2_only = _feed(qo.HistogramObserver(dtype=torch.int8, switchable=False), batches)
    assert l2_only.calibrator is None and not l2_only.switchable
    entropy_only = qo.HistogramObserver(dtype=torch.int8, method="entropy", switchable=False)
    _feed(entropy_only, batches)
    assert float(entropy_only.histogram.sum()) == 0.0  # the L2 histogram was not kept
    with pytest.raises(ConfigError, match="switchable=True"):
        l2_only.calculate_qparams(method="mse")
    with pytest.raises(ConfigError, match="switchable=True"):
        entropy_only.method = "l2"
    entropy_only.method = "mse"  # among calibrator methods switching stays possible
    assert entropy_only.calculate_qparams()[0].shape == (1,)
    wide = qo.HistogramObserver(dtype=torch.int32)  # l2 only: nothing else is kept
    assert wide.calibrator is None and not wide.switchable
    with pytest.raises(ConfigError, match="16 bits"):
        qo.HistogramObserver(dtype=torch.int32, method="entropy")
    assert qo.HistogramObserver(method=CalibMethod.ENTROPY).method == "entropy"
    both = _feed(qo.HistogramObserver(switchable=True), batches)
    for method, option in (("l2", {"percentile": 99.0}), ("mse", {"bins": 3})):
        with pytest.raises(ConfigError, match="do not apply"):
            both.calculate_qparams(method=method, **option)


# -- properties of the arithmetic ------------------------------------------------------------
_RANGES = [(torch.int8, None), (torch.uint8, None), (torch.int8, (-127, 127))]
_RANGES += [(torch.uint8, (0, 127)), (torch.int8, (-64, 63)), (torch.int32, None)]


@settings(max_examples=150, deadline=None)
@given(
    low=st.floats(-1e4, 1e4, allow_nan=False, width=32),
    span=st.floats(0.0, 1e4, allow_nan=False, width=32),
    dtype_range=st.sampled_from(_RANGES),
    symmetric=st.booleans(),
    eps=st.sampled_from([torch.finfo(torch.float32).eps, 2**-12]),
)
def test_qparams_properties(low, span, dtype_range, symmetric, eps):
    dtype, limits = dtype_range
    qscheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    kwargs = {} if limits is None else {"quant_min": limits[0], "quant_max": limits[1]}
    obs = qo.MinMaxObserver(dtype=dtype, qscheme=qscheme, eps=eps, **kwargs)
    x = torch.tensor([low, low + span], dtype=torch.float32)
    obs(x)
    scale, zero_point = obs.calculate_qparams()
    assert float(scale) > 0 and float(scale) >= float(obs.eps)
    assert obs.quant_min <= int(zero_point) <= obs.quant_max
    if symmetric:
        unsigned = dtype == torch.uint8
        midpoint = (obs.quant_min + obs.quant_max) // 2 if limits else 128
        assert int(zero_point) == (midpoint if unsigned else 0)
    if symmetric and dtype == torch.int8 and limits and limits[0] == 0:
        return  # torch's zero_point 0 on [0, 127]: negative values are clipped by design
    if dtype == torch.int32 and not symmetric and min(low, 0.0) / float(scale) < -(2**31):
        return  # torch's int32 zero_point overflows here (see the test below)
    # every observed value (and 0) is representable within one quantization step
    for value in (*x.tolist(), 0.0):
        q = min(max(round(value / float(scale)) + int(zero_point), obs.quant_min), obs.quant_max)
        step = float(scale) * (1 + 1e-5) + 1e-6 * abs(value)
        assert abs((q - int(zero_point)) * float(scale) - value) <= step


def test_int32_affine_zero_point_overflows_like_torchao():
    """A torch bug kept bit for bit: ``round(min / scale).to(int32)`` overflows below -2^31.

    For [-1000, 1] the exact zero_point is 2143192971, but round(-1000 / scale) = -4.29e9 becomes
    -2^31 and -2^31 - (-2^31) gives zero_point 0: -1000 then quantizes to -500."""
    x = torch.tensor([-1000.0, 1.0])
    scale, zero_point = _compare("MinMaxObserver", {"dtype": torch.int32}, [x]).calculate_qparams()
    exact = -(2**31) - round(-1000.0 / float(scale))
    assert exact == 2143192971 and int(zero_point) == 0


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.floats(-100, 100, allow_nan=False, width=32), min_size=1, max_size=50),
    name=st.sampled_from(["MinMaxObserver", "MovingAverageMinMaxObserver"]),
    qscheme=st.sampled_from([torch.per_tensor_affine, torch.per_tensor_symmetric]),
    dtype=st.sampled_from([torch.int8, torch.uint8]),
)
def test_random_batches_match_torchao(values, name, qscheme, dtype):
    x = torch.tensor(values, dtype=torch.float32)
    batches = [x, x[::2] * 3.0, -x]
    _compare(name, {"dtype": dtype, "qscheme": qscheme}, batches)


# -- FixedQParams, Placeholder, Derived --------------------------------------------------------
FIXED = [{"scale": 1.0 / 256.0, "zero_point": 0}, {"scale": 2 / 256, "zero_point": 128}]
FIXED += [{"scale": 0.1, "zero_point": -128, "dtype": I8, "quant_min": -128, "quant_max": 127}]


@pytest.mark.parametrize("kwargs", FIXED)
def test_fixed_qparams_match_torchao(kwargs):
    ours, ref = qo.FixedQParamsObserver(**kwargs), ao.FixedQParamsObserver(**kwargs)
    assert_same_qparams(ours.calculate_qparams(), ref.calculate_qparams())  # even with no data
    _feed(ours, [torch.rand(10)])
    ours.calculate_qparams()[0].fill_(5.0)  # callers cannot change the fixed qparams
    assert_same_qparams(ours.calculate_qparams(), ref.calculate_qparams())
    assert ours.num_batches == 1


def test_placeholder_carries_what_a_converter_needs_and_has_no_qparams():
    obs = _feed(qo.PlaceholderObserver(dtype=torch.uint8, is_dynamic=True), [torch.randn(3)])
    assert (obs.dtype, obs.is_dynamic, obs.quant_min, obs.quant_max) == (torch.uint8, True, 0, 255)
    assert obs.qscheme == torch.per_tensor_affine and obs.eps == torch.finfo(torch.float32).eps
    assert obs.num_batches == 1
    with pytest.raises(CalibrationError, match="run time"):
        obs.calculate_qparams()
    cast = qo.PlaceholderObserver(dtype=torch.float16)
    assert cast.quant_min is None and not cast.is_dynamic
    with pytest.raises(CalibrationError, match="cast to float16"):
        cast.calculate_qparams()
    custom = qo.PlaceholderObserver(dtype=torch.int8, quant_min=-127, quant_max=127, eps=2**-12)
    assert (custom.quant_min, custom.quant_max, custom.eps) == (-127, 127, 2**-12)


def _bias_qparams(observers):
    scale = observers[0].calculate_qparams()[0] * observers[1].calculate_qparams()[0]
    return scale, torch.zeros_like(scale, dtype=torch.int32)


def test_derived_qparams_match_torchao():
    from torchao.quantization.pt2e import DerivedObserverOrFakeQuantize

    act, weight = qo.MinMaxObserver(dtype=torch.int8), qo.PerChannelMinMaxObserver(dtype=torch.int8)
    _feed(act, [torch.randn(8, 4)])
    _feed(weight, [torch.randn(3, 4)])
    kwargs = {"dtype": torch.int32, "derive_qparams_fn": _bias_qparams, "quant_min": -(2**31)}
    kwargs.update(quant_max=2**31 - 1, qscheme=torch.per_channel_symmetric, ch_axis=0)
    ours = _feed(qo.DerivedQParamsObserver(obs_or_fqs=[act, weight], **kwargs), [torch.randn(3)])
    ref = DerivedObserverOrFakeQuantize(obs_or_fqs=[act, weight], **kwargs)
    assert_same_qparams(ours.calculate_qparams(), ref.calculate_qparams())
    assert ours.calculate_qparams()[0].shape == (3,) and ours.num_batches == 1
    assert not list(ours.children())  # the source observers are not re-registered here


# -- with_args -----------------------------------------------------------------------------
def test_with_args_binds_defaults_and_builds_fresh_observers():
    make = qo.HistogramObserver.with_args(eps=2**-12)
    first, second = make(), make()
    assert isinstance(first, qo.HistogramObserver) and first is not second
    assert float(first.eps) == 2**-12 and first.bins == 2048
    more = make.with_args(dtype=torch.int8, bins=512)
    assert more.p.func is qo.HistogramObserver and more.__name__ == "HistogramObserver"
    assert more.kwargs == {"eps": 2**-12, "dtype": torch.int8, "bins": 512}
    assert more(bins=128).bins == 128  # call-time arguments win
    assert make == qo.HistogramObserver.with_args(eps=2**-12) and make != more
    assert len({make, qo.HistogramObserver.with_args(eps=2**-12)}) == 1
    assert repr(make) == "HistogramObserver.with_args(eps=0.000244140625)"
    with pytest.raises(ConfigError, match="bns"):
        qo.HistogramObserver.with_args(bns=3)


@pytest.mark.parametrize(
    ("ctr", "qscheme"),
    [
        (qo.HistogramObserver.with_args(eps=2**-12), torch.per_tensor_affine),
        (qo.PerChannelMinMaxObserver.with_args(eps=2**-12), torch.per_channel_symmetric),
        (qo.MinMaxObserver, torch.per_tensor_symmetric),
    ],
)
def test_with_args_works_with_torchao_prepare_and_specs(ctr, qscheme):
    """torchao's prepare inspects ``.p.func.__name__`` and calls ``ctr.with_args(**spec)()``."""
    from torchao.quantization.pt2e.prepare import _create_obs_or_fq_from_qspec
    from torchao.quantization.pt2e.quantizer import QuantizationSpec

    spec = {"dtype": torch.int8, "quant_min": -127, "quant_max": 127, "qscheme": qscheme}
    qspec = QuantizationSpec(observer_or_fake_quant_ctr=ctr, ch_axis=0, **spec)
    obs = _create_obs_or_fq_from_qspec(qspec, {}, is_qat=False)
    assert isinstance(obs, qo.ObserverBase)
    assert all(getattr(obs, k) == v for k, v in spec.items())


# -- errors --------------------------------------------------------------------------------
NO_DATA = [qo.MinMaxObserver(), qo.MovingAverageMinMaxObserver(), qo.PerChannelMinMaxObserver()]
NO_DATA += [qo.MovingAveragePerChannelMinMaxObserver(), qo.HistogramObserver()]


@pytest.mark.parametrize("observer", NO_DATA, ids=lambda o: type(o).__name__)
def test_no_data_raises(observer):
    observer(torch.tensor([]))  # an empty tensor is nothing to observe
    with pytest.raises(CalibrationError, match=r"observed no data.*calibrat"):
        observer.calculate_qparams()
    assert observer.num_batches == 0


@pytest.mark.parametrize(
    "make",
    [qo.MinMaxObserver, qo.PerChannelMinMaxObserver, qo.HistogramObserver, qo.PlaceholderObserver],
)
def test_nan_and_inf_raise_counting_them(make):
    observer = make()
    x = torch.tensor([[float("nan"), float("inf"), 1.0], [float("inf"), float("-inf"), 2.0]])
    with pytest.raises(CalibrationError, match="1 NaN and 3 Inf"):
        observer(x)
    assert observer.num_batches == 0


_P, _MM, _PC = functools.partial, qo.MinMaxObserver, qo.PerChannelMinMaxObserver
_H, _SYM, _PC_AFF = qo.HistogramObserver, torch.per_tensor_symmetric, torch.per_channel_affine
_FIX, _D = qo.FixedQParamsObserver, functools.partial(qo.DerivedQParamsObserver, torch.int32)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (_P(_MM, qscheme=torch.per_channel_affine), "PerChannel observer"),
        (_P(_MM, qscheme="affine"), "per_tensor_affine, torch.per_tensor_sym"),
        (_P(_PC, qscheme=torch.per_tensor_affine), "per-tensor"),
        (_P(_MM, dtype=torch.float16), "no integer range"),
        (_P(_MM, quant_min=5, quant_max=1), "quant_min 5 must be < quant_max 1"),
        (_P(_MM, dtype=torch.int8, quant_min=0, quant_max=255), "fit torch.int8"),
        (_P(_MM, quant_min=3, quant_max=100), "include 0"),
        (_P(_MM, quant_min=-3), "both quant_min and quant_max"),
        (_P(_MM, quant_min=0.5, quant_max=10), "quant_min must be an int"),
        (_P(_MM, eps=0.0), "eps=0.0"),
        (_P(_MM, eps=1e-50), "representable in float32"),
        (_P(_MM, reduce_range=1), "reduce_range must be True or False"),
        (_P(_MM, dtype=torch.uint8, qscheme=_SYM, reduce_range=True), "zero_point 128 outside"),
        (_P(qo.MovingAverageMinMaxObserver, averaging_constant=0), "averaging_constant"),
        (_P(qo.MovingAverageMinMaxObserver, is_dynamic=True), "averaging_constant=1"),
        (_P(_PC, is_dynamic=True), "dynamic"),
        (_P(_PC, ch_axis=1.0), "ch_axis must be an int"),
        (_P(_H, is_dynamic=True), "dynamic"),
        (_P(_H, bins=1), "bins must be >= 2"),
        (_P(_H, factory_kwargs={"dtype": torch.float64}), "float32"),
        (_P(_H, method="kl"), "'l2', 'max', 'percentile', 'entropy', 'mse'"),
        (_P(_H, percentile=0), "percentile must be in"),
        (_P(_FIX, scale=-1.0, zero_point=0), "scale must be a positive"),
        (_P(_FIX, scale=0.1, zero_point=300), r"outside \[0, 255\]"),
        (_P(_FIX, 0.1, 0, dtype=torch.int8), "fit torch.int8"),
        (_P(qo.PlaceholderObserver, dtype=torch.half, quant_min=0, quant_max=1), "integer"),
        (_P(qo.PlaceholderObserver, compute_dtype=torch.float32), "is_dynamic=True"),
        (_P(_D, [], _bias_qparams), "non-empty list"),
        (_P(_D, [_MM()], 3), "callable"),
        (_P(_D, [_MM()], _bias_qparams, qscheme=_PC_AFF), "needs ch_axis"),
    ],
)
def test_bad_arguments_raise_config_error(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_data_errors_name_the_problem():
    with pytest.raises(ConfigError, match=r"ch_axis=3.*shape \(2, 3\)"):
        qo.PerChannelMinMaxObserver(ch_axis=3)(torch.randn(2, 3))
    per_channel = _feed(qo.PerChannelMinMaxObserver(), [torch.randn(4, 2)])
    with pytest.raises(CalibrationError, match="4 channels"):
        per_channel(torch.randn(5, 2))
    with pytest.raises(CalibrationError, match="observes tensors"):
        qo.MinMaxObserver()([1.0, 2.0])
    bad = qo.DerivedQParamsObserver(torch.int32, [qo.MinMaxObserver()], lambda obs: 1.0)
    with pytest.raises(ConfigError, match=r"\(scale, zero_point\)"):
        bad.calculate_qparams()
    with pytest.raises(ValueError, match="use one of"):  # ConfigError is a ValueError
        qo.HistogramObserver().calculate_qparams(method="minmax")
    assert issubclass(CalibrationError, QvizError)


# -- bookkeeping, state and reprs -------------------------------------------------------------
def test_reset_forgets_everything():
    obs = _feed(qo.HistogramObserver(dtype=torch.int8, switchable=True), _batches("randn"))
    obs.reset()
    assert obs.num_batches == obs.num_elements == 0
    assert float(obs.histogram.sum()) == 0.0 and obs.calibrator.num_batches == 0
    with pytest.raises(CalibrationError):
        obs.calculate_qparams()
    _feed(obs, _batches("grow_shrink"))  # usable again, and still torchao's result
    ref = _feed(ao.HistogramObserver(dtype=torch.int8), _batches("grow_shrink"))
    assert torch.equal(obs.histogram, ref.histogram)
    assert_same_qparams(obs.calculate_qparams(), ref.calculate_qparams())
    per_channel = _feed(qo.PerChannelMinMaxObserver(), _weights(0, 0))
    per_channel.reset_min_max_vals()
    assert per_channel.min_val.numel() == 0
    per_channel(torch.randn(2, 3))  # a new channel count is fine after a reset
    assert per_channel.min_val.shape == (2,)


def test_reprs_are_short_and_tensor_free():
    obs = qo.MinMaxObserver(dtype=torch.int8)
    assert repr(obs) == "MinMaxObserver(int8 per_tensor_affine [-128, 127] batches=0)"
    obs(torch.tensor([-1.25, 3.5]))
    assert repr(obs).endswith("[-128, 127] batches=1 min=-1.25 max=3.5)")
    per_channel = _feed(qo.PerChannelMinMaxObserver(ch_axis=1), [torch.ones(2, 3)])
    assert "uint8 per_channel_affine [0, 255] ch_axis=1 channels=3 batches=1" in repr(per_channel)
    dynamic = repr(qo.PlaceholderObserver(dtype=torch.uint8, is_dynamic=True))
    assert dynamic == "PlaceholderObserver(uint8 per_tensor_affine [0, 255] dynamic batches=0)"
    for text in (repr(obs), repr(per_channel), repr(qo.HistogramObserver())):
        assert "tensor(" not in text


def test_state_dict_round_trip_and_deepcopy():
    trained = _feed(qo.PerChannelMinMaxObserver(dtype=torch.int8), _weights(1, 0))
    fresh = qo.PerChannelMinMaxObserver(dtype=torch.int8)
    fresh.load_state_dict(trained.state_dict())  # empty buffers grow to the saved channels
    assert_same_qparams(fresh.calculate_qparams(), trained.calculate_qparams())
    hist = _feed(qo.HistogramObserver(dtype=torch.int8, switchable=True), _batches("randn"))
    loaded = qo.HistogramObserver(dtype=torch.int8, switchable=True)
    loaded.load_state_dict(hist.state_dict())
    assert_same_qparams(loaded.calculate_qparams(), hist.calculate_qparams())
    with pytest.raises(CalibrationError, match="state_dict"):
        loaded.calculate_qparams(method="entropy")  # the |x| histogram is not in the state dict
    clone = copy.deepcopy(hist)
    assert_same_qparams(clone.calculate_qparams(method="mse"), hist.calculate_qparams(method="mse"))


def test_conveniences():
    """Identity without grad; qscheme=None is the default; factory_kwargs; integer inputs."""
    x = torch.randn(3, 4, requires_grad=True)
    for obs in (qo.MinMaxObserver(), qo.HistogramObserver(), qo.PerChannelMinMaxObserver()):
        _feed(obs, [x])
        assert all(not b.requires_grad for b in obs.buffers())
        assert obs.num_batches == 1 and obs.num_elements == 12
    assert qo.MinMaxObserver(qscheme=None).qscheme == torch.per_tensor_affine
    assert qo.PerChannelMinMaxObserver(qscheme=None).qscheme == torch.per_channel_affine
    obs = qo.MinMaxObserver(factory_kwargs={"device": "cpu"})
    assert obs.min_val.device.type == obs.eps.device.type == "cpu"
    _compare("MinMaxObserver", {"dtype": torch.int8}, [torch.arange(-5, 11)])
    hist = _feed(qo.HistogramObserver(dtype=torch.int8), [torch.arange(-5, 11)])
    assert float(hist.min_val) == -5.0 and float(hist.max_val) == 10.0


def test_every_public_name_is_exported():
    names = "MinMax MovingAverageMinMax PerChannelMinMax MovingAveragePerChannelMinMax Histogram"
    names = [f"{n}Observer" for n in names.split() + "FixedQParams Placeholder".split()]
    names.append("DerivedQParamsObserver")
    assert {*names, "ObserverBase"} <= set(qo.__all__)
    assert all(issubclass(getattr(qo, name), qo.ObserverBase) for name in names)


def test_default_histogram_observer_keeps_one_histogram():
    """The default costs one histogram per batch; switching methods later is opt-in."""
    default = _feed(qo.HistogramObserver(dtype=torch.int8), _batches("randn", seed=3))
    assert default.calibrator is None and not default.switchable
    with pytest.raises(ConfigError, match="switchable=True"):
        default.calculate_qparams(method="entropy")
