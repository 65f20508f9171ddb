"""Every argument of the repair transforms is checked where the user gave it: a ConfigError
naming the argument, the value and the valid range, before any model is copied, run or changed
(qviz.engine.repair.options). Tiny models only; each refused call leaves them bitwise as they
were."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.repair import (
    adaround,
    bias_correction,
    cross_layer_equalization,
    smooth_quant,
    smoothing_factors,
)
from qviz.engine.repair.options import AdaRoundOptions, EqualizationOptions
from qviz.errors import ConfigError
from tests.helpers.quantize import quantize

NAN, INF = float("nan"), float("inf")


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key


@pytest.fixture(scope="module")
def chain():
    """A float linear -> relu -> linear -> relu -> linear graph (two pairs to equalize)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
    return qviz.export(model.eval(), (torch.randn(3, 4),))


@pytest.fixture(scope="module")
def normed():
    """A float layer_norm -> linear graph and one batch (SmoothQuant's smallest group)."""
    x = torch.randn(8, 4)
    return qviz.export(nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 2)).eval(), (x,)), [x]


@pytest.fixture(scope="module")
def converted():
    """(float graph, its converted int8 model, calibration data): one linear."""
    torch.manual_seed(0)
    data = [torch.randn(8, 4)]
    gm, _, converted = quantize(nn.Linear(4, 2), data, per_channel=False)
    return gm, converted, data


def _refused(call, models: tuple[nn.Module, ...], name: str, value, *words: str) -> str:
    """``call()`` raises a ConfigError naming ``name`` and ``value`` (and ``words``), and leaves
    every one of ``models`` bitwise as it was; the message."""
    before = [_state(model) for model in models]
    with pytest.raises(ConfigError) as info:
        call()
    message = str(info.value)
    assert f"{name} must be" in message and f"got {value!r}" in message, message
    for word in words:
        assert word in message, message
    for model, state in zip(models, before, strict=True):
        _unchanged(model, state)
    return message


# -- cross_layer_equalization -----------------------------------------------------------------
CLE_REFUSED = [
    ("num_std", -3, ">= 0", "changes the float function"),  # moved 26.7 of the float function
    ("num_std", NAN, ">= 0 (a finite number)"),
    ("num_std", INF, ">= 0"),
    ("num_std", "3", ">= 0"),
    ("max_sweeps", 0, "an integer >= 1"),  # recorded "equalized" with no scale moved
    ("max_sweeps", 2.5, "an integer >= 1"),
    ("max_sweeps", True, "a bool is not a count"),
    ("tol", NAN, ">= 0 (a finite number)"),  # looped 1000 sweeps silently
    ("tol", -1, ">= 0"),
    ("tol", None, ">= 0"),
    ("sweeps", 0, "an integer >= 1, or None"),  # a builtins ValueError
    ("sweeps", 1.0, "give sweeps=1"),
    ("high_bias_absorption", 1, "True or False"),
]


@pytest.mark.parametrize(("name", "value", "words"), [(n, v, w) for n, v, *w in CLE_REFUSED])
def test_equalization_refuses_each_bad_argument_and_changes_nothing(chain, name, value, words):
    message = _refused(
        lambda: cross_layer_equalization(chain, **{name: value}), (chain,), name, value, *words
    )
    assert message.startswith("cross_layer_equalization: ")


def test_equalization_that_runs_out_of_sweeps_says_so(chain):
    with pytest.warns(UserWarning, match=r"did not converge in max_sweeps=2 sweeps"):
        out = cross_layer_equalization(chain, tol=0.0, max_sweeps=2)
    assert {dict(r.params)["sweeps"] for r in out.meta["qviz_transforms"]} == {2}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cross_layer_equalization(chain, num_std=0, sweeps=3)  # the edges of the ranges: taken


# -- smooth_quant and smoothing_factors -------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value"),
    [("alpha", None), ("alpha", NAN), ("alpha", 1.5), ("alpha", "0.5"), ("alpha", True),
     ("progress", 1), ("progress", None)],
)  # fmt: skip
def test_smooth_quant_refuses_each_bad_argument_and_changes_nothing(normed, name, value):
    gm, data = normed
    rule = "in [0, 1]" if name == "alpha" else "True or False"
    message = _refused(lambda: smooth_quant(gm, data, **{name: value}), (gm,), name, value, rule)
    assert message.startswith("smooth_quant: ")


def test_smoothing_factors_refuses_an_alpha_that_is_no_number_and_ranges_that_differ():
    with pytest.raises(ConfigError, match=r"alpha must be in \[0, 1\] \(a finite number\), got "):
        smoothing_factors(torch.ones(2), torch.ones(2), None)
    with pytest.raises(ConfigError, match=r"tensors of one shape .*got shape \(2,\) and list"):
        smoothing_factors(torch.ones(2), [1.0, 2.0])
    with pytest.raises(ConfigError, match=r"got shape \(2,\) and shape \(3,\)"):
        smoothing_factors(torch.ones(2), torch.ones(3))


# -- bias_correction --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [("reference", None, "one of ('float', 'quantized')"),
     ("reference", "both", "one of ('float', 'quantized')"),
     ("max_batches", 0, "an integer >= 1, or None"), ("max_batches", 1.5, "an integer >= 1"),
     ("max_batches", True, "an integer >= 1")],
)  # fmt: skip
def test_bias_correction_refuses_each_bad_argument_and_changes_nothing(
    converted, name, value, rule
):
    gm, model, data = converted
    call = lambda: bias_correction(model, gm, data, **{name: value})  # noqa: E731
    assert _refused(call, (model, gm), name, value, rule).startswith("bias_correction: ")


# -- adaround ---------------------------------------------------------------------------------
ADAROUND_REFUSED = [
    ("iterations", 2.7, "an integer >= 1"),  # ran 2 and recorded 2.7
    ("iterations", "10", "an integer >= 1"),  # a TypeError from torch
    ("iterations", True, "a bool is not a count"),
    ("iterations", 0, "an integer >= 1"),
    ("lr", NAN, "> 0 (a finite number)"),
    ("lr", 0, "> 0"),
    ("lr", "0.01", "> 0"),
    ("seed", "x", "an integer >= 0"),
    ("seed", -1, "an integer >= 0"),
    ("seed", 1.5, "an integer >= 0"),
    ("reg_param", -0.1, ">= 0"),
    ("reg_param", INF, ">= 0"),
    ("warm_start", 1.0, "in [0, 1)"),
    ("warm_start", NAN, "in [0, 1)"),
    ("batch_size", 0, "an integer >= 1"),
    ("batch_size", 8.0, "give batch_size=8"),
    ("beta_range", (20.0,), "(start, end)"),
    ("beta_range", "ab", "(start, end)"),
    ("beta_range[1]", NAN, "> 0"),
    ("beta_range[0]", 0, "> 0"),
    ("nodes", [], "it names no node"),  # a silent no-op
    ("nodes", [3], "a node name or a non-empty list"),
    ("nodes", 5, "a node name or a non-empty list"),
    ("progress", "yes", "True or False"),
]


@pytest.mark.parametrize(("name", "value", "words"), [(n, v, w) for n, v, *w in ADAROUND_REFUSED])
def test_adaround_refuses_each_bad_argument_and_changes_nothing(converted, name, value, words):
    gm, model, data = converted
    given = {name: value}
    if name.startswith("beta_range["):  # one end of the pair
        given = {"beta_range": (value, 2.0) if name.endswith("[0]") else (20.0, value)}
    given = {"iterations": 5, "progress": False} | given
    call = lambda: adaround(model, gm, data, **given)  # noqa: E731
    assert _refused(call, (model, gm), name, value, *words).startswith("adaround: ")


def test_the_options_records_are_frozen_typed_and_keyword_only():
    options = AdaRoundOptions(iterations=3, nodes="linear", beta_range=[10, 1], lr=1)
    assert (options.iterations, options.nodes, options.beta_range, options.lr) == (
        3, ("linear",), (10.0, 1.0), 1.0,
    )  # fmt: skip
    assert isinstance(options.lr, float) and isinstance(options.iterations, int)
    with pytest.raises(AttributeError):
        options.iterations = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        EqualizationOptions(None)  # type: ignore[misc]


def test_a_valid_adaround_records_the_integer_it_ran(converted):
    gm, model, data = converted
    out = adaround(model, gm, data, iterations=3, seed=2**40, nodes=("linear",), progress=False)
    (record,) = out.plan.transforms
    assert dict(record.params)["iterations"] == 3
