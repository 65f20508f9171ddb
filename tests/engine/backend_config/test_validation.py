"""Configuration mistakes that used to give silently wrong results, and messages that pointed
the wrong way: each is now a ConfigError, at construction or at prepare, that names the
argument and the fix."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch import nn
from torch.ao.quantization import backend_config as ao_backend
from torch.ao.quantization import get_default_qconfig
from torch.ao.quantization import observer as ao_observer

import qviz
from qviz.engine import backend_config as qviz_api
from qviz.engine.backend_config import (
    BackendConfig,
    BackendConfigQuantizer,
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    QConfig,
    QConfigMapping,
)
from qviz.errors import ConfigError
from tests.helpers.backend_config import MyModel, constrained_qconfig, tutorial_backend

_QCONFIG = constrained_qconfig(QConfig)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: BackendPatternConfig(nn.Conv2d(1, 1, 1)),
            r"Conv2d\(\.\.\.\) is a module instance; give its class, torch.nn.Conv2d",
        ),
        (
            lambda: BackendPatternConfig((nn.Conv2d, nn.ReLU())),
            r"ReLU\(\.\.\.\) is a module instance; give its class, torch.nn.ReLU",
        ),
        (
            lambda: QConfigMapping().set_object_type("Linear", None),
            r"set_object_type\('Linear', \.\.\.\).*torch.nn.Linear, not 'Linear'",
        ),
        (
            lambda: QConfigMapping().set_object_type(42, None),
            r"set_object_type\(42, \.\.\.\): 42 is not a module class .* or a Tensor method",
        ),
        (
            lambda: QConfigMapping().set_object_type(nn.Linear(2, 2), None),
            r"module instance; give its class, torch.nn.Linear",
        ),
        (
            lambda: QConfigMapping().set_module_name(nn.Linear, None),
            r"set_module_name\(<class .*\): a module name is a string",
        ),
        (
            lambda: QConfigMapping().set_module_name_regex(re.compile("fc"), None),
            r"give the regex as a string",
        ),
        (
            lambda: QConfigMapping().set_module_name_object_type_order("", nn.Linear, -1, None),
            r"\('', Linear, -1, \.\.\.\): the index counts .* give an int >= 0",
        ),
        (
            lambda: QConfigMapping().set_module_name_object_type_order("", nn.Linear, "0", None),
            r"give an int >= 0",
        ),
        (
            lambda: QConfigMapping().set_module_name_object_type_order("", "Linear", 0, None),
            r"torch.nn.Linear, not 'Linear'",
        ),
        (
            lambda: QConfigMapping().set_global(QConfig(ao_observer.MinMaxObserver(), None)),
            r"activation is MinMaxObserver.*pass its class or MinMaxObserver.with_args",
        ),
        (lambda: DTypeConfig(torch.quint8, is_dynamic="yes"), r"is_dynamic='yes'.*True"),
        (
            lambda: DTypeConfig(input_dtype=torch.int32, output_dtype=torch.bool),
            r"input_dtype=torch.int32\): a 32-bit integer is a bias / accumulator dtype",
        ),
        (
            lambda: DTypeConfig(input_dtype=torch.quint8, output_dtype=torch.bool),
            r"output_dtype=torch.bool\): no observer quantizes to it; give torch.quint8",
        ),
        (
            lambda: DTypeConfig(torch.quint8, torch.quint8, torch.float, torch.qint8),
            r"bias_dtype=torch.qint8\): a bias stays float .* qint8 is neither",
        ),
        (
            lambda: DTypeConfig(torch.quint8, torch.quint8, torch.float, torch.qint32),
            r"bias_dtype=torch.qint32, weight_dtype=float32\): a quantized bias .* both must",
        ),
        (
            lambda: DTypeWithConstraints(dtype=torch.quint8, quant_min_lower_bound="0"),
            r"quant_min_lower_bound='0'\): give a number",
        ),
        (
            lambda: DTypeWithConstraints(dtype=torch.quint8, scale_exact_match=1 / 256),
            r"fixed qparams need both",
        ),
        (lambda: BackendConfig(3), r"BackendConfig\(name=3\): the name is a string"),
        (
            lambda: BackendPatternConfig(nn.Linear).set_dtype_configs(DTypeConfig(torch.quint8)),
            r"set_dtype_configs\(DTypeConfig.*\): pass a list of DTypeConfigs, e.g\. "
            r"set_dtype_configs\(\[config\]\); to add one DTypeConfig use add_dtype_config",
        ),
        (
            lambda: BackendConfig().set_backend_pattern_configs(BackendPatternConfig(nn.Linear)),
            r"pass a list of BackendPatternConfigs.*set_backend_pattern_config\(config\)",
        ),
    ],
)
def test_a_configuration_that_would_be_silently_wrong_is_a_config_error(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_what_torch_aos_shipped_configs_use_is_still_accepted():
    ok = [
        DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float),
        DTypeConfig(torch.quint8, torch.float, torch.qint8, torch.float, is_dynamic=True),
        DTypeConfig(torch.float16, torch.float, torch.float16, torch.float, is_dynamic=True),
        DTypeConfig(torch.float, torch.float, torch.quint4x2),
        DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.qint32),  # int32 bias
    ]
    assert len(ok) == 5
    mapping = QConfigMapping().set_object_type("relu_", None).set_object_type(torch.add, None)
    assert list(mapping.object_type_qconfigs) == ["relu_", torch.add]


# --- caught at prepare: settings that would apply to nothing in this model ---------------------


def _prepare(mapping, model=None):
    model = model or MyModel(False).eval()
    gm = qviz.export(model, (torch.rand(1, 3, 10, 10),))
    return qviz.prepare_pt2e(gm, BackendConfigQuantizer(tutorial_backend(qviz_api), mapping))


def test_a_module_name_regex_that_matches_no_module_is_a_config_error():
    mapping = QConfigMapping().set_global(_QCONFIG).set_module_name_regex("fcc", None)
    with pytest.raises(ConfigError, match=r"set_module_name_regex\('fcc', \.\.\.\): the regex "):
        _prepare(mapping)
    # a regex matching from the start of a name applies, as in FX (re.match)
    plan = _prepare(QConfigMapping().set_global(_QCONFIG).set_module_name_regex("lin", None)).plan
    assert "linear" in {f.node for f in plan.float_nodes}


def test_a_call_index_past_the_calls_a_module_makes_is_a_config_error():
    mapping = (
        QConfigMapping()
        .set_global(_QCONFIG)
        .set_module_name_object_type_order("", nn.Linear, 7, None)
    )
    with pytest.raises(
        ConfigError, match=r"module '\(the top level\)' calls Linear 1 time\(s\) .*\(indices 0..0\)"
    ):
        _prepare(mapping)
    # the one call there is, index 0, applies
    mapping = (
        QConfigMapping()
        .set_global(_QCONFIG)
        .set_module_name_object_type_order("", nn.Linear, 0, None)
    )
    assert "linear" in {f.node for f in _prepare(mapping).plan.float_nodes}


def test_torch_aos_mapping_with_a_class_name_string_is_refused_when_read():
    """torch.ao's QConfigMapping takes ``set_object_type("Linear", None)`` and FX ignores it;
    qviz refuses it where it reads the mapping."""
    from torch.ao.quantization import QConfig as AoQConfig
    from torch.ao.quantization import QConfigMapping as AoMapping

    mapping = AoMapping().set_global(constrained_qconfig(AoQConfig))
    mapping.set_object_type("Linear", None)
    with pytest.raises(ConfigError, match=r"torch.nn.Linear, not 'Linear'"):
        BackendConfigQuantizer(tutorial_backend(qviz_api), mapping)


def test_a_mistake_inside_torch_aos_backend_is_named_with_its_pattern():
    """torch.ao's classes take any dtype; where qviz reads them, the refusal says which
    pattern's config holds the mistake."""
    dtypes = ao_backend.DTypeConfig(torch.quint8, torch.quint8, torch.float, torch.qint8)
    theirs = ao_backend.BackendConfig("mine").set_backend_pattern_config(
        ao_backend.BackendPatternConfig(nn.Linear).add_dtype_config(dtypes)
    )
    with pytest.raises(
        ConfigError,
        match=r"backend_config=\.\.\.\): torch.ao's BackendPatternConfig for Linear: "
        r"DTypeConfig\(bias_dtype=torch.qint8\)",
    ):
        BackendConfigQuantizer(theirs, QConfigMapping())


# --- messages that say what to pass ---------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            lambda b, m, q: ("x86", m),
            r"backend_config=\.\.\.\): 'x86' is not a BackendConfig; .* not its name: .*"
            r"x86.get_x86_backend_config\(\)",
        ),
        (
            lambda b, m, q: (None, m),
            r"None is not a BackendConfig; pass qviz's BackendConfig\('name'\)",
        ),
        (
            lambda b, m, q: (b, None),
            r"qconfig_mapping=\.\.\.\): None is not a QConfigMapping; give one: "
            r"QConfigMapping\(\).set_global\(qconfig\), .* get_default_qconfig_mapping\('x86'\)",
        ),
        (
            lambda b, m, q: (b, q),
            r"but a single QConfig; wrap it: QConfigMapping\(\).set_global\(qconfig\)",
        ),
        (lambda b, m, q: (b, "x86"), r"give get_default_qconfig_mapping\('x86'\)"),
        (lambda b, m, q: (m, b), r"but a QConfigMapping; .* the backend first"),
        (lambda b, m, q: (b.configs[0], m), r"but one pattern's config; put it in one"),
        (lambda b, m, q: (b, {"": q}), r"but a dict; .* QConfigMapping.from_dict"),
    ],
)
def test_a_wrong_argument_to_the_quantizer_is_answered_with_what_to_pass(arguments, message):
    backend = tutorial_backend(qviz_api)
    mapping = QConfigMapping().set_global(_QCONFIG)
    with pytest.raises(ConfigError, match=message):
        BackendConfigQuantizer(*arguments(backend, mapping, _QCONFIG))


def test_torch_aos_reversed_nested_pattern_is_refused_with_its_forward_form():
    """``(ReLU, (BatchNorm2d, Conv2d))`` is torch.ao's reversed nested format. torch.ao's own
    ``set_pattern`` takes it and FX never matches it (checked here); qviz refuses it and names
    the forward pattern, for its own config and for torch.ao's read with BackendConfig.of."""
    reversed_ = (nn.ReLU, (nn.BatchNorm2d, nn.Conv2d))
    forward = r"write it forward: \(Conv2d, BatchNorm2d, ReLU\)"
    with pytest.raises(ConfigError, match=forward):
        BackendPatternConfig(reversed_)
    with pytest.raises(ConfigError, match=forward):
        BackendPatternConfig().set_pattern([nn.ReLU, [nn.BatchNorm2d, nn.Conv2d]])

    dtypes = ao_backend.DTypeConfig(torch.quint8, torch.quint8, torch.qint8, torch.float)
    theirs = ao_backend.BackendConfig("b").set_backend_pattern_config(
        ao_backend.BackendPatternConfig(reversed_).add_dtype_config(dtypes)
    )
    model = nn.Sequential(nn.Conv2d(3, 3, 3), nn.BatchNorm2d(3), nn.ReLU()).eval()
    mapping = QConfigMapping().set_global(get_default_qconfig("x86"))
    from torch.ao.quantization import QConfigMapping as AoMapping
    from torch.ao.quantization.quantize_fx import prepare_fx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fx = prepare_fx(
            copy.deepcopy(model),
            AoMapping().set_global(get_default_qconfig("x86")),
            (torch.rand(1, 3, 8, 8),),
            backend_config=theirs,
        )
    assert not any("activation_post_process" in name for name, _ in fx.named_modules())
    with pytest.raises(ConfigError, match=forward):
        BackendConfigQuantizer(theirs, mapping)


def test_torch_aos_shipped_configs_need_no_extra_import_once_qviz_is_imported():
    """In a fresh interpreter, torch.ao's get_*_backend_config() fail unless
    ``torch.ao.quantization.backend_config.utils`` was imported; qviz's backend_config imports
    it, so the README's order (torch.ao's import, then qviz's, then the call) works."""
    code = textwrap.dedent(
        """
        from torch.ao.quantization.backend_config import (
            get_fbgemm_backend_config, get_native_backend_config,
        )
        from torch.ao.quantization.backend_config.x86 import get_x86_backend_config
        from qviz.engine.backend_config import (
            BackendConfigQuantizer, get_default_qconfig_mapping,
        )

        backend = get_fbgemm_backend_config()
        BackendConfigQuantizer(backend, get_default_qconfig_mapping("fbgemm"))
        BackendConfigQuantizer(get_native_backend_config(), get_default_qconfig_mapping())
        BackendConfigQuantizer(get_x86_backend_config(), get_default_qconfig_mapping("x86"))
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
