"""Random BackendConfig / BackendPatternConfig / DTypeConfig / QConfigMapping combinations,
valid and not, in qviz's classes or torch.ao's, through the whole flow on a tiny model: export,
BackendConfigQuantizer, prepare_pt2e, calibrate, convert_pt2e, a forward pass.

Every failure must be a QvizError (a mistake is named, never a stray TypeError or KeyError
from inside the engine), a success must give finite outputs of the float model's shape, and the
float model must come out of every example unchanged, bit for bit. The examples are fixed
(derandomized) and bounded, so the test is a reproducible few seconds.
"""

from __future__ import annotations

import operator
import warnings
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.ao.quantization import observer as ao_observer
from torch.nn import functional as F

import qviz
from qviz.engine import backend_config as qviz_api
from qviz.errors import QvizError
from tests.helpers.backend_config import tutorial_api

nni = torch.ao.nn.intrinsic


class Tiny(nn.Module):
    """conv -> bn -> relu -> flatten -> linear -> add -> sigmoid: a fusable chain, a folded
    BatchNorm, a function, a method-free flatten and a fixed-qparams candidate."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.bn = nn.BatchNorm2d(3)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(12, 4)
        self.act = nn.Sigmoid()

    def forward(self, x):
        y = self.relu(self.bn(self.conv(x)))
        return self.act(self.fc(torch.flatten(y, 1)) + 1.0)


# --- what the recipes draw from (valid and invalid alike) -------------------------------------


# Each pool is (valid choices, invalid ones). Half the recipes draw from the valid choices only,
# so they get through to calibration and convert; the other half from both.
DTYPES = (
    [None, torch.quint8, torch.qint8, torch.uint8, torch.int8, torch.float, torch.float16],
    [torch.int32, torch.bool, "quint8"],
)
BOUNDS = ([(None, None), (0, 255), (-128, 127), (0, 127), (None, 255)], [(255, 0), ("0", 255)])
SCALE_BOUNDS = ([None, 2**-12, 0.5], [-1.0])
BIASES = ([None, torch.float], [torch.qint32, torch.qint8])
DYNAMIC = ([None, False, True], ["yes"])
#: the tutorial's activation and weight dtypes, and its bias
GOOD = (("constrained", torch.quint8, 0, 255, 2**-12), ("plain", torch.qint8), torch.float)


_GOOD_CONFIG = (GOOD[0], GOOD[0], GOOD[1], GOOD[2], None)
ANCHORS = [
    (nn.Linear, "OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT", [_GOOD_CONFIG], None, None),
    (
        (nn.Conv2d, nn.BatchNorm2d, nn.ReLU),
        "OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT", [_GOOD_CONFIG], None, None,
    ),
]  # fmt: skip


def _conv_relu(is_qat, conv, relu):
    return nni.ConvReLU2d(conv, relu)


def _broken_fuser(is_qat, *modules):
    raise RuntimeError("this fuser method always fails")


PATTERNS = (  # Hypothesis favours the first: those this model has come first
    [
        nn.Linear, (nn.Conv2d, nn.BatchNorm2d, nn.ReLU), operator.add, torch.flatten,
        (nn.Conv2d, nn.BatchNorm2d), nn.Sigmoid, (nn.Linear, nn.Sigmoid), torch.add, F.relu,
        "relu", nn.ReLU, nn.Conv2d, nn.BatchNorm2d, (nn.Conv2d, nn.ReLU), nni.ConvReLU2d,
        nni.ConvBnReLU2d,
    ],
    ["instance", (nn.ReLU, (nn.BatchNorm2d, nn.Conv2d)), 42, "Conv2d", (nn.Conv2d,)],
)  # fmt: skip
OBSERVATION = (
    [
        "OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT", "OUTPUT_SHARE_OBSERVER_WITH_INPUT",
        "INPUT_OUTPUT_NOT_OBSERVED",
    ],
    ["SHARED"],
)  # fmt: skip
FUSERS = ([None, _conv_relu, _broken_fuser], [])
FUSED = ([None, nni.ConvReLU2d, nni.ConvBnReLU2d], [])

_W = ao_observer.MinMaxObserver.with_args(
    dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, eps=2**-12
)
QCONFIGS = {  # name: (activation, weight), or a non-QConfig
    "constrained": (
        ao_observer.MinMaxObserver.with_args(quant_min=0, quant_max=255, eps=2**-12),
        _W,
    ),
    # torch.ao ignores a quant_max without a quant_min (its default range); qviz refuses it
    "quant-max-only": (ao_observer.MinMaxObserver.with_args(quant_max=255, eps=2**-12), _W),
    "tutorial": (ao_observer.MinMaxObserver.with_args(quant_min=0, quant_max=127, eps=2**-12), _W),
    "x86-default": tuple(torch.ao.quantization.get_default_qconfig("x86")),
    "symmetric": (
        ao_observer.MinMaxObserver.with_args(qscheme=torch.per_tensor_symmetric, eps=2**-12),
        _W,
    ),
    "per-channel": (
        ao_observer.HistogramObserver.with_args(eps=2**-12),
        ao_observer.PerChannelMinMaxObserver.with_args(
            dtype=torch.qint8, qscheme=torch.per_channel_symmetric, eps=2**-12
        ),
    ),
    "dynamic": tuple(torch.ao.quantization.default_dynamic_qconfig),
    "float16": tuple(torch.ao.quantization.float16_static_qconfig),
    "fixed-qparams": (ao_observer.default_fixed_qparams_range_0to1_observer, None),
    "weight-only": tuple(torch.ao.quantization.qconfig.float_qparams_weight_only_qconfig),
    "range-without-zero": (ao_observer.MinMaxObserver.with_args(quant_min=3, quant_max=200), _W),
    "qint8-activation": (ao_observer.MinMaxObserver.with_args(dtype=torch.qint8, eps=2**-12), _W),
    "none": None,
    "observer-instance": "instance",
    "a-string": "default",
}
_INVALID_QCONFIGS = ("quant-max-only", "range-without-zero", "observer-instance", "a-string")
QCONFIG_NAMES = (
    [n for n in QCONFIGS if n not in _INVALID_QCONFIGS],
    list(_INVALID_QCONFIGS),
)
OBJECT_TYPES = ([nn.Linear, nn.Conv2d, nn.ReLU, torch.add, "relu"], ["Linear", 42])
MODULE_NAMES = (["conv", "fc", "act", "bn"], ["fcc"])
REGEXES = (["co.*", "f", r"\w+"], ["fcc", "["])
ORDER_TYPES = ([nn.Linear, nn.Conv2d, torch.add, operator.add], ["Linear"])
INDICES = ([0, 1], [-1, 2])


def recipes(strict: bool):
    """Recipes from the valid choices only (``strict``), or from all."""

    def pick(pool):
        valid, invalid = pool
        return st.sampled_from(valid if strict else valid + invalid)

    @st.composite
    def dtype_spec(draw):
        if draw(st.booleans()):
            return ("plain", draw(pick(DTYPES)))
        bounds = (*draw(pick(BOUNDS)), draw(pick(SCALE_BOUNDS)))
        return ("constrained", draw(pick(DTYPES)), *bounds)

    @st.composite
    def dtype_config(draw):
        if draw(st.integers(0, 3)) > (0 if strict else 2):  # the tutorial's: a working one
            activation, weight, bias = GOOD
            return (activation, activation, weight, bias, None)
        specs = (draw(dtype_spec()), draw(dtype_spec()), draw(dtype_spec()))
        return (*specs, draw(pick(BIASES)), draw(pick(DYNAMIC)))

    pattern_config = st.tuples(
        pick(PATTERNS),
        pick(OBSERVATION),
        st.lists(dtype_config(), min_size=0, max_size=2),
        pick(FUSERS),
        pick(FUSED),
    )
    qconfig = pick(QCONFIG_NAMES)
    setting = st.one_of(
        st.tuples(st.just("object_type"), pick(OBJECT_TYPES), qconfig),
        st.tuples(st.just("module_name"), pick(MODULE_NAMES), qconfig),
        st.tuples(st.just("regex"), pick(REGEXES), qconfig),
        st.tuples(st.just("order"), pick(ORDER_TYPES), pick(INDICES), qconfig),
    )
    return st.tuples(
        st.sampled_from(["qviz", "torch.ao"]),  # the library of the backend's classes
        st.sampled_from(["qviz", "torch.ao"]),  # the library of the mapping's classes
        # valid recipes: half start from the tutorial's Linear and conv-bn-relu configs, so
        # that calibration and convert run on what the random configs and mappings make of them
        st.tuples(
            st.booleans() if strict else st.just(False),
            st.lists(pattern_config, min_size=1, max_size=4),
        ).map(lambda drawn: [*ANCHORS * drawn[0], *drawn[1]]),
        # the global QConfig (None: not set); valid recipes mostly the two that fit GOOD
        st.one_of(*[st.sampled_from(["tutorial", "constrained"])] * strict, qconfig, st.none()),
        st.lists(setting, min_size=0, max_size=2),
    )


RECIPES = st.one_of(recipes(strict=True), recipes(strict=False))


# --- building the recipe in a library -----------------------------------------------------------


def _dtype(api, spec):
    if spec[0] == "plain":
        return spec[1]
    _, dtype, low, high, scale = spec
    return api.DTypeWithConstraints(
        dtype=dtype, quant_min_lower_bound=low, quant_max_upper_bound=high,
        scale_min_lower_bound=scale,
    )  # fmt: skip


def _backend(api, configs):
    backend = api.BackendConfig("fuzz")
    for pattern, observation, dtypes, fuser, fused in configs:
        if pattern == "instance":
            pattern = nn.Conv2d(1, 1, 1)
        config = api.BackendPatternConfig(pattern)
        observation_type = getattr(api.ObservationType, observation, observation)
        config.set_observation_type(observation_type)
        for inp, out, weight, bias, dynamic in dtypes:
            config.add_dtype_config(
                api.DTypeConfig(
                    _dtype(api, inp), _dtype(api, out), _dtype(api, weight), bias, dynamic
                )
            )
        if fuser is not None:
            config.set_fuser_method(fuser)
        if fused is not None:
            config.set_fused_module(fused)
        backend.set_backend_pattern_config(config)
    return backend


def _qconfig(api, name):
    value = QCONFIGS[name]
    if value == "instance":
        return api.QConfig(ao_observer.MinMaxObserver(), None)
    if not isinstance(value, tuple):
        return value
    return api.QConfig(*value)


def _mapping(api, global_, settings_):
    mapping = api.QConfigMapping()
    if global_ is not None:
        mapping.set_global(_qconfig(api, global_))
    for setting in settings_:
        kind, *args, name = setting
        qconfig = _qconfig(api, name)
        if kind == "object_type":
            mapping.set_object_type(args[0], qconfig)
        elif kind == "module_name":
            mapping.set_module_name(args[0], qconfig)
        elif kind == "regex":
            mapping.set_module_name_regex(args[0], qconfig)
        else:
            mapping.set_module_name_object_type_order("", args[0], args[1], qconfig)
    return mapping


def _in_torch_ao(build):
    """torch.ao's classes validate almost nothing; where they do refuse (an observer instance
    in QConfig), that is torch.ao's answer, not qviz's: None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return build()
    except Exception:
        return None


# --- the property ---------------------------------------------------------------------------


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_random_backend_configurations_fail_only_with_qviz_errors():
    torch.manual_seed(0)
    model = Tiny().eval()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.rand(2, 2, 4, 4, generator=g) * 2 - 0.5,) for _ in range(2)]
    state, expected = _state(model), model(*batches[0])
    counts: Counter[str] = Counter()

    @settings(
        max_examples=200,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(recipe=RECIPES)
    def run(recipe):
        backend_library, mapping_library, configs, global_, settings_ = recipe
        counts["examples"] += 1
        backend_api = qviz_api if backend_library == "qviz" else tutorial_api("torch.ao")
        mapping_api = qviz_api if mapping_library == "qviz" else tutorial_api("torch.ao")
        try:
            if backend_library == "qviz":
                backend = _backend(backend_api, configs)
            else:
                backend = _in_torch_ao(lambda: _backend(backend_api, configs))
            if mapping_library == "qviz":
                mapping = _mapping(mapping_api, global_, settings_)
            else:
                mapping = _in_torch_ao(lambda: _mapping(mapping_api, global_, settings_))
            if backend is None or mapping is None:
                counts["refused by torch.ao's own classes"] += 1
                return
            quantizer = qviz_api.BackendConfigQuantizer(backend, mapping)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                prepared = qviz.prepare_pt2e(qviz.export(model, batches[0]), quantizer)
                quantized = bool(prepared.plan.groups)
                if quantized:
                    qviz.calibrate(prepared, batches, progress=False)
                    out = qviz.convert_pt2e(prepared)(*batches[0])
                else:
                    out = prepared(*batches[0])
        except QvizError:
            counts["QvizError"] += 1
        except Exception:
            counts["other exception"] += 1
            raise
        else:
            counts["success"] += 1
            counts["quantized something"] += quantized
            assert out.shape == expected.shape and torch.isfinite(out).all()
        finally:  # whatever happened, the float model is as it was
            now = model.state_dict()
            assert all(torch.equal(now[k], v) for k, v in state.items())
            assert torch.equal(model(*batches[0]), expected)

    run()
    print("\nBackendConfig fuzzer:", dict(counts))
    assert counts["other exception"] == 0
    assert counts["QvizError"] > 0 and counts["quantized something"] > 0  # both ways exercised


@pytest.fixture(autouse=True)
def _deterministic():
    yield
