"""torch.ao's FX numeric suite, watched where it fails on a stock model.

``torch.ao.ns._numeric_suite_fx.add_loggers`` raises ``KeyError`` on stock torchvision resnet18
(in-place ReLUs, one ReLU module called twice per block), where :func:`qviz.numeric.compare`
compares every quantized operator (tests/numeric/compare/test_compare_reference.py, defect (iv):
``test_iv_qviz_compares_every_quantized_op_of_stock_resnet18``). The strict xfail below fails
once upstream is fixed: then (iv) is no longer a defect of the reference, and what the docs and
that module say of it must change.
"""

import copy
import warnings

import pytest
import torch

torchvision = pytest.importorskip("torchvision")


@pytest.mark.xfail(
    strict=True,
    raises=KeyError,
    reason="torch.ao.ns._numeric_suite_fx (torch 2.14.1, 2.15.0): add_loggers raises KeyError "
    "'layer1_0_conv1_1' on stock resnet18 (in-place ReLUs, one ReLU module called twice per "
    "block); this passes (and strict xfail fails) once upstream fixes it",
)
def test_iv_fx_numeric_suite_adds_loggers_on_stock_resnet18():
    from torch.ao.ns import _numeric_suite_fx as ns
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization deprecation notices
        prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), (x,))
        prepared(x)
        converted = convert_fx(copy.deepcopy(prepared))
        ns.add_loggers("fp32", prepared, "int8", converted, ns.OutputLogger)
