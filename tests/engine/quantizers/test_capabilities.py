"""quantization_capabilities(): what a quantizer can quantize, declared before any model."""

from __future__ import annotations

import importlib

import pytest
from torch import nn

from qviz.engine import backend_config as api
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.quantizers.base import ComposableQuantizer, Quantizer
from qviz.errors import ConfigError
from qviz.viz import capabilities
from tests.helpers.backend_config import tutorial_backend


def _backend_quantizer(backend=None):
    return api.BackendConfigQuantizer(backend or tutorial_backend(api), api.QConfigMapping())


def test_a_backend_declares_each_pattern_with_its_dtypes_and_constraints():
    rows = _backend_quantizer().quantization_capabilities()
    assert [r.pattern for r in rows] == ["Linear", "(Conv2d, ReLU)", "ConvReLU2d"]
    linear = rows[0]
    assert linear.input == "quint8 [0, 255] scale >= 0.000244"
    assert linear.weight == "qint8 [-128, 127] scale >= 0.000244"
    assert (linear.bias, linear.observation, linear.setting) == (
        "float32", "own observer", "backend 'my_backend'",
    )  # fmt: skip


def test_torch_aos_x86_backend_declares_a_row_per_pattern_and_dtype_config():
    importlib.import_module("torch.ao.quantization.backend_config.utils")
    from torch.ao.quantization.backend_config.x86 import get_x86_backend_config

    quantizer = _backend_quantizer(get_x86_backend_config())
    rows = quantizer.quantization_capabilities()
    expected = sum(len(c.dtype_configs) for c in quantizer.backend_config.configs)
    assert len(rows) == expected > 100
    shared = {r.pattern for r in rows if r.observation == "shares its input's observer"}
    assert "MaxPool2d" in shared and "flatten" in shared
    assert any(r.dynamic for r in rows if r.pattern == "Linear")


def test_xnnpack_declares_its_patterns_per_setting():
    quantizer = (
        XNNPACKQuantizer()
        .set_global(get_symmetric_quantization_config(is_per_channel=True))
        .set_module_type(nn.Linear, None)
        .set_module_name("head", get_symmetric_quantization_config(is_dynamic=True))
    )
    rows = quantizer.quantization_capabilities()
    settings = {r.setting for r in rows}
    assert settings == {"global", "module name 'head'"}  # a None setting declares nothing
    conv = next(r for r in rows if r.pattern == "conv" and r.setting == "global")
    assert conv.weight == "int8 [-127, 127] per_channel_symmetric"
    assert [r.pattern for r in rows if r.setting == "module name 'head'"] == ["linear"]
    sigmoid = next(r for r in rows if r.pattern == "sigmoid")
    assert sigmoid.observation == "fixed qparams for [0.0, 1.0]"


def test_a_composed_quantizer_lists_every_member_and_hides_none():
    class Silent(Quantizer):
        def annotate(self, model):
            return model

        def validate(self, model):
            pass

    xnnpack = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    composed = ComposableQuantizer([_backend_quantizer(), xnnpack, Silent()])
    rows = composed.quantization_capabilities()
    assert [r.quantizer for r in rows[:3]] == ["BackendConfigQuantizer"] * 3
    assert rows[-1].quantizer == "Silent" and rows[-1].pattern == "(not declared)"
    assert len(rows) == 3 + len(xnnpack.quantization_capabilities()) + 1


def test_the_table_renders_in_a_notebook_and_refuses_what_declares_nothing():
    pytest.importorskip("pandas")
    table = capabilities(_backend_quantizer())
    assert list(table.pattern) == ["Linear", "(Conv2d, ReLU)", "ConvReLU2d"]
    assert "<table" in table._repr_html_()
    with pytest.raises(ConfigError, match="does not declare quantization_capabilities"):
        capabilities(object())
