"""quant_modules: one-line instrumentation that leaves nothing behind, and quantize_model."""

import pytest
import torch
from torch import nn

from qviz.engine import quant_modules, quant_nn
from qviz.engine.tensor.calibrate_quantizers import calibrate_quantizers
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import CalibrationError, ConfigError

ORIGINALS = {name: getattr(nn, name) for name in dir(nn) if isinstance(getattr(nn, name), type)}


def _torch_nn_is_untouched() -> None:
    changed = [n for n, cls in ORIGINALS.items() if getattr(nn, n) is not cls]
    assert changed == [], f"torch.nn names still patched: {changed}"
    assert not quant_modules.is_active()


@pytest.fixture(autouse=True)
def _nothing_leaks():
    yield
    quant_modules.deactivate()  # a failed test must not poison the others
    _torch_nn_is_untouched()


def _build_resnet18():
    torchvision = pytest.importorskip("torchvision")
    return torchvision.models.resnet18(weights=None)


def test_a_torchvision_model_built_under_enable_is_quantized_and_nothing_leaks():
    with quant_modules.enable():
        model = _build_resnet18().eval()
    kinds = {type(m) for m in model.modules()}
    assert quant_nn.QuantConv2d in kinds and quant_nn.QuantLinear in kinds
    assert quant_nn.QuantMaxPool2d in kinds and quant_nn.QuantAdaptiveAvgPool2d in kinds
    assert nn.Conv2d not in kinds and nn.Linear not in kinds
    _torch_nn_is_untouched()
    # another test's model construction afterwards builds float layers again
    float_model = _build_resnet18()
    assert not any(isinstance(m, TensorQuantizer) for m in float_model.modules())
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_an_exception_inside_the_block_restores_every_name():
    with pytest.raises(RuntimeError, match="boom"), quant_modules.enable():
        assert nn.Conv2d is quant_nn.QuantConv2d
        raise RuntimeError("boom")
    _torch_nn_is_untouched()


def test_initialize_twice_is_idempotent_and_deactivate_restores_once():
    quant_modules.initialize()
    quant_modules.initialize(float_module_list=["Linear"])  # replaces, does not stack
    assert nn.Conv2d is quant_nn.QuantConv2d and nn.Linear is ORIGINALS["Linear"]
    quant_modules.deactivate()
    _torch_nn_is_untouched()
    quant_modules.deactivate()  # a second deactivate is harmless


def test_nested_enable_gives_back_the_outer_choice():
    with quant_modules.enable(float_module_list=["Linear"]):
        with quant_modules.enable():
            assert nn.Linear is quant_nn.QuantLinear
        assert nn.Linear is ORIGINALS["Linear"] and nn.Conv2d is quant_nn.QuantConv2d
    _torch_nn_is_untouched()


def test_custom_quant_modules_and_bad_names_are_checked():
    class MyQuantLinear(quant_nn.QuantLinear):
        pass

    with quant_modules.enable(custom_quant_modules=[(torch.nn, "Linear", MyQuantLinear)]):
        assert type(nn.Linear(2, 2)) is MyQuantLinear
    with pytest.raises(ConfigError, match=r"float_module_list names \['Linaer'\]"):
        quant_modules.initialize(float_module_list=["Linaer"])
    with pytest.raises(ConfigError, match="has no attribute 'Lineer'"):
        quant_modules.initialize(custom_quant_modules=[(torch.nn, "Lineer", MyQuantLinear)])
    with pytest.raises(ConfigError, match=r"\(namespace, name, quantized class\)"):
        quant_modules.initialize(custom_quant_modules=[MyQuantLinear])
    _torch_nn_is_untouched()


def _digits_like() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
    ).eval()  # fmt: skip


def test_quantize_model_swaps_layers_of_a_copy_and_keeps_the_weights():
    model = _digits_like()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quant_modules.quantize_model(model)
    assert [type(m).__name__ for m in q] == [
        "QuantConv2d", "BatchNorm2d", "ReLU", "QuantMaxPool2d",
        "QuantConv2d", "QuantAdaptiveAvgPool2d", "Flatten", "QuantLinear",
    ]  # fmt: skip
    assert all(type(m).__module__.startswith("torch.nn") for m in model)  # the float model
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert all(torch.equal(q.state_dict()[k], v) for k, v in before.items())
    x = torch.randn(2, 1, 8, 8)
    for m in q.modules():
        if isinstance(m, TensorQuantizer):
            m.disable()
    assert torch.equal(q(x), model(x))  # quantizers off: the float model's function
    with torch.no_grad():
        q[0].weight.add_(1.0)
    assert torch.equal(model[0].weight, before["0.weight"])  # no shared storage


def test_calibrate_quantizers_loads_each_amax_and_reports_it():
    model = quant_modules.quantize_model(_digits_like())
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 1, 8, 8, generator=g), torch.zeros(16)) for _ in range(3)]
    seen: list[torch.Tensor] = []
    hook = model[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    table = calibrate_quantizers(model, batches, method="percentile", percentile=99.0,
                                 progress=False)  # fmt: skip
    hook.remove()
    rows = {r.name: r for r in table}
    assert rows["0._input_quantizer"].method == "percentile"
    assert rows["0._weight_quantizer"].method == "max" and rows["0._weight_quantizer"].channels == 4
    assert rows["0._weight_quantizer"].amax == pytest.approx(
        float(model[0].weight.detach().abs().max())
    )
    assert rows["3._input_quantizer"].role == "input"
    everything = torch.cat([s.flatten() for s in seen]).abs()
    assert rows["0._input_quantizer"].amax < float(everything.max())  # the 99.9th percentile
    assert all(tq._if_quant and not tq._if_calib for _, tq in _quantizers(model))
    assert not model.training
    frame = pytest.importorskip("pandas").DataFrame(table)
    assert list(frame["name"]) == [r.name for r in table]
    assert "0._input_quantizer" in repr(table)


def _quantizers(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, TensorQuantizer)]


def test_the_documents_recipe_by_hand_gives_the_same_max_amax():
    model = quant_modules.quantize_model(_digits_like())
    twin = quant_modules.quantize_model(_digits_like())
    batches = [
        torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(2)
    ]
    for name, module in model.named_modules():
        if name.endswith("_input_quantizer"):
            module.enable_calib()
            module.disable_quant()
    with torch.no_grad():
        for x in batches:
            model(x)
    for name, module in model.named_modules():
        if name.endswith("_input_quantizer"):
            module.load_calib_amax()
            module.enable_quant()
            module.disable_calib()
    calibrate_quantizers(twin, batches, method="max", progress=False)
    for (name, a), (_, b) in zip(_quantizers(model), _quantizers(twin), strict=True):
        if name.endswith("_input_quantizer"):
            assert torch.equal(a.amax, b.amax), name
    x = torch.randn(2, 1, 8, 8)
    assert torch.equal(model(x), twin(x))  # weights: dynamic max == calibrated max


def test_calibrate_quantizers_names_what_it_cannot_do():
    with pytest.raises(ConfigError, match=r"takes a quant_nn model.*got a float.*quantize_model"):
        calibrate_quantizers(_digits_like(), [torch.randn(1, 1, 8, 8)], progress=False)

    class Skips(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = quant_nn.QuantLinear(4, 4), quant_nn.QuantLinear(4, 4)

        def forward(self, x):
            return self.used(x)

    with pytest.raises(CalibrationError, match=r"saw no data: \['unused._input_quantizer'"):
        calibrate_quantizers(Skips(), [torch.randn(2, 4)], progress=False)
    with pytest.raises(ConfigError, match="calibration batch 0"):
        calibrate_quantizers(Skips(), [torch.randn(2, 5)], progress=False)


def test_a_single_name_as_float_module_list_is_refused_with_the_list_form():
    """Issue 25: "Linear" was split into letters and the message listed ['L', 'i', ...]."""
    from qviz.errors import ConfigError

    before = torch.nn.Linear
    with pytest.raises(ConfigError, match=r"pass \['Linear'\], not 'Linear'"):
        quant_modules.initialize(float_module_list="Linear")
    assert torch.nn.Linear is before  # nothing was swapped
