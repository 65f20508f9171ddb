"""Every public entry point that runs data through a model takes the same data, and the stages
it states, checked before the model is touched (DESIGN rule 13, issue 24 sections 2 and 3).

* Every accepted shape of data (a DataLoader, lists of tensors, tuples, ``(inputs, target)``
  pairs and dicts, one batch alone) gives every entry point the same result as plain tensors,
  and the same target reaches the user's metric.
* Every entry point handed a model at a stage it does not take raises a ConfigError that names
  the stage, and leaves the model bitwise as it was (state_dict, observer and calibrator
  counters).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import qviz
from qviz.data import evaluate
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.tensor.calibrate_quantizers import calibrate_quantizers
from qviz.engine.tensor.fine_tune import fine_tune
from qviz.engine.tensor.quant_modules import quantize_model
from qviz.errors import ConfigError
from qviz.numeric import compare, compare_calibrators, compare_configs, layer_detail, sensitivity
from qviz.numeric.compare.modules import compare_modules


class Net(nn.Module):
    """A forward with an optional positional parameter, as every Hugging Face model has."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 5)

    def forward(self, x, scale=None):
        h = torch.relu(self.fc1(x))
        return self.fc2(h if scale is None else h * scale)


def _quantizer():
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config())


@pytest.fixture(scope="module")
def world():
    torch.manual_seed(0)
    model = Net().eval()
    xs = [torch.randn(8, 4) for _ in range(2)]
    # classes 2..4: labels passed as `scale` would raise every activation fc2 sees
    ys = [torch.randint(2, 5, (8,)) for _ in range(2)]
    gm = qviz.export(model, (xs[0],), dynamic_batch=True)
    prepared = qviz.prepare_pt2e(gm, _quantizer())
    calibrated = qviz.calibrate(qviz.prepare_pt2e(gm, _quantizer()), xs, progress=False)
    converted = qviz.convert_pt2e(copy.deepcopy(calibrated))
    qnn = quantize_model(model)
    calibrate_quantizers(qnn, xs, progress=False)
    models = {
        "float_eager": model, "float_graph": gm, "prepared": prepared, "calibrated": calibrated,
        "converted": converted, "quant_nn": qnn,
    }  # fmt: skip
    return models, xs, ys


# -- every shape of data ------------------------------------------------------------------------
SHAPES = {
    "tensors": lambda xs, ys: list(xs),
    "tuples": lambda xs, ys: [(x,) for x in xs],
    "pairs": lambda xs, ys: list(zip(xs, ys, strict=True)),
    "lists": lambda xs, ys: [[x, y] for x, y in zip(xs, ys, strict=True)],
    "loader": lambda xs, ys: DataLoader(TensorDataset(torch.cat(xs), torch.cat(ys)), batch_size=8),
    "dicts": lambda xs, ys: [{"x": x} for x in xs],
    "dicts_with_labels": lambda xs, ys: [
        {"x": x, "labels": y} for x, y in zip(xs, ys, strict=True)
    ],
    "one_tensor": lambda xs, ys: xs[0],
    "one_pair": lambda xs, ys: (xs[0], ys[0]),
    "one_dict": lambda xs, ys: {"x": xs[0], "labels": ys[0]},
}
WITH_TARGET = {"pairs", "lists", "loader", "dicts_with_labels", "one_pair", "one_dict"}
SINGLE = {"one_tensor", "one_pair", "one_dict"}


def _recorder(targets):
    def metric(float_out, quant_out, target):
        targets.append(target)
        return 0.5

    return metric


def _calibrate(models, data):
    prepared = qviz.prepare_pt2e(models["float_graph"], _quantizer())
    qviz.calibrate(prepared, data, progress=False)
    return dict(prepared.state_dict())


def _calibrate_quantizers(models, data):
    qnn = quantize_model(models["float_eager"])
    return [(r.name, r.amax, r.amax_min) for r in calibrate_quantizers(qnn, data, progress=False)]


def _report(report):
    df = report.df
    return [df["node"].tolist(), df["local_sqnr"].tolist(), df["cumulative_sqnr"].tolist(),
            report.output_sqnr]  # fmt: skip


def _compare(models, data, targets):
    return _report(compare(models["float_graph"], models["converted"], data, progress=False,
                           metric=_recorder(targets)))  # fmt: skip


def _compare_quant_nn(models, data, targets):
    return _report(compare(models["float_eager"], models["quant_nn"], data, progress=False,
                           metric=_recorder(targets)))  # fmt: skip


def _sensitivity(models, data, targets):
    df = sensitivity(models["float_graph"], _quantizer(), data, progress=False,
                     metric=_recorder(targets))  # fmt: skip
    return [df["node"].tolist(), df["output_sqnr"].tolist()]


def _compare_configs(models, data):
    df = compare_configs(models["float_graph"], {"a": get_symmetric_quantization_config()}, data,
                         progress=False)  # fmt: skip
    return [df["node"].tolist(), df["a"].tolist()]


def _dashboard(models, data, targets):
    from qviz.widgets import NumericDashboard

    d = NumericDashboard.from_models(
        models["float_graph"], models["converted"], data, metric=_recorder(targets),
        progress=False, graph=False,
    )  # fmt: skip
    return _report(d.report)


def _fine_tune(models, data):
    qnn = copy.deepcopy(models["quant_nn"])
    torch.manual_seed(1)
    history = fine_tune(qnn, data, epochs=1, lr=1e-3, progress=False)
    return [history[0].loss, [p.detach().clone() for p in qnn.parameters()]]


#: entry point -> (run(models, data[, targets]), takes a metric, needs a target)
ENTRY_POINTS = {
    "calibrate": (_calibrate, False, False),
    "calibrate_quantizers": (_calibrate_quantizers, False, False),
    "compare": (_compare, True, False),
    "compare(quant_nn)": (_compare_quant_nn, True, False),
    "sensitivity": (_sensitivity, True, False),
    "compare_configs": (_compare_configs, False, False),
    "NumericDashboard.from_models": (_dashboard, True, False),
    "fine_tune": (_fine_tune, False, True),
    "evaluate": (lambda models, data: evaluate(models["converted"], data), False, True),
    "evaluate(quant_nn)": (lambda models, data: evaluate(models["quant_nn"], data), False, True),
}


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def _run(entry, models, data):
    run, takes_metric, _ = ENTRY_POINTS[entry]
    targets: list = []
    result = run(models, data, targets) if takes_metric else run(models, data)
    return result, targets


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_shape_of_data_runs_through_every_entry_point(world, entry, shape):
    models, xs, ys = world
    n = 1 if shape in SINGLE else len(xs)
    xs, ys = xs[:n], ys[:n]
    needs_target = ENTRY_POINTS[entry][2]
    if needs_target and shape not in WITH_TARGET:
        with pytest.raises(ConfigError, match=r"batch 0 has no target.*\(inputs, target\)"):
            _run(entry, models, SHAPES[shape](xs, ys))
        return
    reference, ref_targets = _run(entry, models, SHAPES["pairs" if needs_target else "tensors"](
        xs, ys))  # fmt: skip
    result, targets = _run(entry, models, SHAPES[shape](xs, ys))
    assert _same(result, reference), f"{entry} on {shape} differs from plain tensors"
    if targets or ref_targets:  # the metric saw each batch's target, or None without one
        expected = list(ys) if shape in WITH_TARGET else [None] * n
        assert all(_same(t, e) for t, e in zip(targets, expected * (len(targets) // n),
                                               strict=True)), targets  # fmt: skip


# -- every wrong stage ---------------------------------------------------------------------------
def _stage_calls(models, xs, ys):
    """entry point -> (call(model), the stages it takes)."""
    pairs = list(zip(xs, ys, strict=True))
    gm, converted, float_eager = models["float_graph"], models["converted"], models["float_eager"]
    floats = {"float_eager", "float_graph"}
    return {
        "calibrate": (lambda m: qviz.calibrate(m, xs, progress=False), {"prepared", "calibrated"}),
        "calibrate_quantizers": (lambda m: calibrate_quantizers(m, xs, progress=False),
                                 {"quant_nn"}),
        "compare(quantized_model)": (lambda m: compare(gm, m, xs, progress=False),
                                     {"converted", "quant_nn"}),
        "compare(float_model)": (lambda m: compare(m, converted, xs, progress=False), floats),
        "compare_modules(quantized_model)": (
            lambda m: compare_modules(float_eager, m, xs, progress=False), {"quant_nn"}),
        "compare(float_model of quant_nn)": (
            lambda m: compare(m, models["quant_nn"], xs, progress=False), floats),
        "sensitivity": (lambda m: sensitivity(m, _quantizer(), xs, progress=False),
                        {"float_graph"}),
        "compare_configs": (lambda m: compare_configs(
            m, {"a": get_symmetric_quantization_config()}, xs, progress=False), {"float_graph"}),
        "NumericDashboard.from_models(quantized_model)": (
            lambda m: _from_models(gm, m, xs), {"converted"}),
        "NumericDashboard.from_models(float_model)": (
            lambda m: _from_models(m, converted, xs), floats),
        "fine_tune": (lambda m: fine_tune(m, pairs, epochs=1, lr=1e-3, progress=False),
                      {"quant_nn"}),
        "evaluate": (lambda m: evaluate(m, pairs), floats | {"converted", "quant_nn"}),
        "layer_detail(quantized_gm)": (lambda m: layer_detail(gm, m, "linear", xs[0]),
                                       {"converted"}),
        "layer_detail(float_gm)": (lambda m: layer_detail(m, converted, "linear", xs[0]),
                                   {"float_graph"}),
        "NumericDashboard(quantized_model)": (lambda m: _dashboard_of(models, quantized_model=m),
                                              {"converted"}),
        "NumericDashboard(float_model)": (lambda m: _dashboard_of(models, float_model=m), floats),
        "compare_calibrators": (lambda m: compare_calibrators(m, xs[0]), floats),
    }  # fmt: skip


def _dashboard_of(models, **kwargs):
    from qviz.widgets import NumericDashboard

    report = compare(models["float_graph"], models["converted"], models["xs"], progress=False)
    return NumericDashboard(report, data=models["xs"], graph=False, **kwargs)


def _from_models(float_model, quantized_model, data):
    from qviz.widgets import NumericDashboard

    return NumericDashboard.from_models(float_model, quantized_model, data, progress=False,
                                        graph=False)  # fmt: skip


def _snapshot(model: nn.Module) -> dict:
    """Everything running data would change: tensors, observer and calibrator counters."""
    snap = {f"state.{k}": v.clone() for k, v in model.state_dict().items()}
    for name, module in model.named_modules():
        holders = [(module, name), (getattr(module, "calibrator", None), f"{name}.calibrator")]
        for holder, prefix in holders:
            if holder is None:
                continue
            for key, value in vars(holder).items():
                if isinstance(value, torch.Tensor):
                    snap[f"{prefix}.{key}"] = value.clone()
                elif isinstance(value, bool | int | float | str):
                    snap[f"{prefix}.{key}"] = value
    return snap


STAGE_WORD = {
    "float_eager": "float", "float_graph": "float", "prepared": "prepared",
    "calibrated": "prepared", "converted": "converted", "quant_nn": "quant_nn",
}  # fmt: skip
ENTRIES = [
    "calibrate", "calibrate_quantizers", "compare(quantized_model)", "compare(float_model)",
    "compare_modules(quantized_model)", "compare(float_model of quant_nn)", "sensitivity",
    "compare_configs", "NumericDashboard.from_models(quantized_model)",
    "NumericDashboard.from_models(float_model)", "fine_tune", "evaluate",
    "layer_detail(quantized_gm)", "layer_detail(float_gm)", "NumericDashboard(quantized_model)",
    "NumericDashboard(float_model)", "compare_calibrators",
]  # fmt: skip


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_point_refuses_every_wrong_stage_before_touching_the_model(world, entry):
    models, xs, ys = world
    models = dict(models, xs=xs)
    call, takes = _stage_calls(models, xs, ys)[entry]
    wrong = [stage for stage in STAGE_WORD if stage not in takes]
    assert wrong
    for stage in wrong:
        model = copy.deepcopy(models[stage])
        before = _snapshot(model)
        if stage == "float_eager" and "float_graph" in takes:  # the exported graph is needed
            expected = r"graph module qviz\.export returns.*qviz\.export\(model"
        else:
            expected = rf"takes .* but got a {STAGE_WORD[stage]} \w+ \("
        with pytest.raises(ConfigError, match=expected):
            call(model)
        assert _same(_snapshot(model), before), f"{entry} changed a {stage} model"


def test_a_prepared_model_is_not_compared_and_its_observers_see_nothing(world):
    """Issue 24: compare(gm, prepared, data) reported "15 quantized ops, 134.97 dB"."""
    models, xs, _ = world
    prepared = copy.deepcopy(models["calibrated"])
    before = _snapshot(prepared)
    with pytest.raises(ConfigError, match=r"calibrate and convert it first.*convert_pt2e"):
        compare(models["float_graph"], prepared, xs, progress=False)
    with pytest.raises(ConfigError, match=r"got a prepared GraphModule \(it holds observers"):
        sensitivity(prepared, _quantizer(), xs, progress=False)
    assert _same(_snapshot(prepared), before)
