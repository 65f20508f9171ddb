"""diagnose's remedies measured on their layer: the figure it measures alone is the report's,
its estimate of a remedy is what the rebuilt model's report then says, a remedy that does not
pay on its layer is never prescribed first, and measuring changes nothing of the user's."""

import math

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.quantizers.override import OverrideQuantizer
from qviz.engine.repair import bias_correction, smooth_quant
from qviz.numeric import RepairSession
from qviz.numeric.diagnose.diagnose import diagnose
from tests.helpers.quantize import quantize


def _quantizer(config=None):
    return XNNPACKQuantizer().set_global(
        config or get_symmetric_quantization_config(is_per_channel=False)
    )


def _run(model, data, quantizer=None, **kwargs):
    """(float graph, prepared, converted, report, diagnosis), all on ``data``."""
    gm = qviz.export(model.eval(), (data[0],), dynamic_batch=True)  # smooth_quant's graph too
    _, prepared, converted = quantize(gm, data, quantizer or _quantizer())
    report = qviz.numeric.compare(gm, converted, data, progress=False)
    diagnosis = diagnose(report, prepared, data=data, progress=False, **kwargs)
    return gm, prepared, converted, report, diagnosis


class TwoConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))


class NormThenLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0, self.ln, self.fc = nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(self.ln(self.fc0(x)))


@pytest.fixture(scope="module")
def outlier_conv():
    """c1's output channel 2 fifty times the others' range, per-tensor weights."""
    torch.manual_seed(0)
    model = TwoConvs()
    with torch.no_grad():
        model.c1.weight[2] *= 50
    data = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    return model, data, _run(model, data)


@pytest.fixture(scope="module")
def outlier_norm():
    """A LayerNorm whose channels 3 and 7 are eighty times the others: SmoothQuant's case."""
    torch.manual_seed(0)
    model = NormThenLinear()
    with torch.no_grad():
        model.ln.weight[[3, 7]] *= 80
    data = [torch.randn(4, 6, 16) for _ in range(3)]
    return model, data, _run(model, data)


@pytest.fixture(scope="module")
def offset_channel():
    """4-bit per-tensor weights; channel 3's weights round to 0, so its error is a constant
    offset: bias correction's case."""
    linear = nn.Linear(4, 8)
    with torch.no_grad():
        linear.weight.copy_(
            torch.randint(-7, 8, (8, 4), generator=torch.Generator().manual_seed(1)).float()
        )
        linear.weight[0, 0] = 7.5
        linear.weight[3] = 0.1
        linear.bias[3] = 5.0
    gen = torch.Generator().manual_seed(0)
    data = [1.5 + 0.05 * torch.randn(64, 4, generator=gen) for _ in range(3)]
    four_bits = get_symmetric_quantization_config(is_per_channel=False, weight_qmin=-8,
                                                  weight_qmax=7)  # fmt: skip
    model = nn.Sequential(linear)
    return model, data, _run(model, data, quantizer=_quantizer(four_bits))


def _finding(diagnosis, node):
    found = diagnosis.for_node(node)
    assert len(found) == 1, f"{node}: {diagnosis.df[['node', 'cause']]}"
    return found[0]


def _remedy(finding, name):
    return next(r for r in finding.remedies if r.name == name)


@pytest.mark.parametrize("case", ["outlier_conv", "outlier_norm", "offset_channel"])
def test_each_finding_is_measured_alone_as_the_report_measures_it(case, request):
    *_, report, diagnosis = request.getfixturevalue(case)[2]
    assert len(diagnosis)
    for f in diagnosis:
        row = report.df.set_index("node").loc[f.node]
        figure = f.remedies[0].figure
        assert figure == ("local_sqnr" if row["local_sqnr"] < 25 else f.figure)
        assert f.local_db == pytest.approx(float(row[figure]), abs=1e-3), f.node
        assert all(r.before_db == f.local_db and r.figure == figure for r in f.remedies)
        assert f.remedies and f.prescription is f.remedies[0].prescription
        assert f.suggested in [r.prescription for r in f.remedies]  # the rule's is tried


def test_a_per_channel_estimate_is_what_the_rebuilt_model_reports(outlier_conv):
    model, data, (*_, diagnosis) = outlier_conv
    finding = _finding(diagnosis, "conv2d")
    best = finding.remedies[0]
    assert best.name == "per-channel weights" and best.gain_db > 10
    overrides = dict(best.prescription.arguments)["overrides"]
    *_, report, _ = _run(model, data, quantizer=OverrideQuantizer(_quantizer(), overrides))
    rebuilt = report.df.set_index("node").loc["conv2d", best.figure]
    assert best.after_db == pytest.approx(float(rebuilt), abs=0.05)


def test_a_smoothquant_estimate_is_what_the_smoothed_model_reports(outlier_norm):
    _, data, (gm, *_, diagnosis) = outlier_norm
    finding = _finding(diagnosis, "linear_1")
    estimate = _remedy(finding, "SmoothQuant")
    assert finding.prescription is estimate.prescription and estimate.gain_db > 3
    with pytest.warns(UserWarning, match="skipped"):
        smoothed = smooth_quant(gm, data, progress=False)
    *_, report, _ = _run(smoothed, data)
    rebuilt = report.df.set_index("node").loc["linear_1", estimate.figure]
    assert estimate.after_db == pytest.approx(float(rebuilt), abs=0.05)


def test_a_bias_correction_estimate_is_what_the_corrected_model_reports(offset_channel):
    _, data, (gm, _, converted, _, diagnosis) = offset_channel
    finding = _finding(diagnosis, "linear")
    estimate = _remedy(finding, "bias correction")
    assert finding.prescription is estimate.prescription and estimate.gain_db > 5
    fixed = bias_correction(converted, gm, data)
    after = qviz.numeric.compare(gm, fixed, data, progress=False).df.set_index("node")
    assert estimate.after_db == pytest.approx(float(after.loc["linear", estimate.figure]), abs=0.05)
    assert all(
        r.gain_db is None or r.gain_db <= estimate.gain_db
        for r in finding.remedies[1:]
        if not r.widens
    )


def test_a_remedy_that_does_not_pay_on_its_layer_is_never_prescribed_first():
    """A token a thousand times the others sets the input's per-tensor range: no remedy that
    keeps the layer at 8 bits helps its starved tokens; diagnose says so and prescribes a wider
    grid, where the cause alone would have sent the user to one of those 8-bit remedies."""
    data = []
    for seed in range(3):
        x = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(seed))
        x[:, 0] *= 1000
        data.append(x)
    torch.manual_seed(0)
    *_, diagnosis = _run(nn.Sequential(nn.Linear(16, 16)), data)
    finding = _finding(diagnosis, "linear")
    kept = [r for r in finding.remedies if not r.widens and r.gain_db is not None]
    assert kept and all(r.gain_db < 0.5 for r in kept)
    assert finding.remedies[0].widens and finding.remedies[0].gain_db > 10
    assert finding.verdict.startswith("no remedy that keeps linear on its grid gains 0.5 dB")
    assert "int16 grid" in finding.verdict and finding.best_gain_db > 10
    assert diagnosis.df.set_index("node").loc["linear", "verdict"] == finding.verdict


@pytest.mark.parametrize("case", ["outlier_conv", "outlier_norm", "offset_channel"])
def test_the_ranking_puts_paying_eight_bit_remedies_first_and_never_a_loss(case, request):
    for f in request.getfixturevalue(case)[2][-1]:
        first = f.remedies[0]
        if not first.widens and first.gain_db is not None:
            assert first.gain_db >= 0.5, f.verdict
            assert f.verdict.startswith(f"{first.name}: +")
        ranks = [(r.widens, r.gain_db) for r in f.remedies]
        paying = [i for i, (w, g) in enumerate(ranks) if not w and g is not None and g >= 0.5]
        assert paying == list(range(len(paying)))  # they lead
        gains = [ranks[i][1] for i in paying]
        assert gains == sorted(gains, reverse=True)


def test_measuring_changes_neither_the_prepared_model_nor_grad_mode(outlier_conv):
    _, data, (_, prepared, _, report, diagnosis) = outlier_conv
    state = {k: v.clone() for k, v in prepared.state_dict().items()}
    code, modules = prepared.code, dict(prepared.named_modules())
    assert torch.is_grad_enabled()
    again = diagnose(report, prepared, data=data, progress=False)
    assert torch.is_grad_enabled()  # AdaRound's estimate trains; the caller's mode is kept
    assert prepared.code == code and dict(prepared.named_modules()).keys() == modules.keys()
    assert all(torch.equal(v, state[k]) for k, v in prepared.state_dict().items())
    assert again.df.equals(diagnosis.df)  # measured twice: alike


def test_without_data_nothing_is_measured_and_each_finding_says_so(outlier_conv):
    _, _, (_, prepared, _, report, measured) = outlier_conv
    plain = diagnose(report, prepared)
    assert {f.node for f in plain} == {f.node for f in measured}
    for f in plain:
        assert f.remedies == () and math.isnan(f.local_db) and f.best_gain_db is None
        assert (
            f.verdict
            == f"not measured: pass data= to diagnose to measure the remedies on {f.node} alone"
        )
        assert f.prescription == f.suggested


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1", True])
def test_min_gain_db_must_be_a_positive_number(outlier_conv, bad):
    _, data, (_, prepared, _, report, _) = outlier_conv
    with pytest.raises(qviz.errors.ConfigError, match=r"diagnose\(min_gain_db="):
        diagnose(report, prepared, data=data, min_gain_db=bad, progress=False)


def test_the_session_applies_the_measured_best_and_it_pays(outlier_conv):
    model, data, _ = outlier_conv
    gm = qviz.export(model.eval(), (data[0],), dynamic_batch=True)
    session = RepairSession(gm, _quantizer(), data, data, progress=False)
    finding = _finding(session.diagnosis, "conv2d")
    assert finding.remedies[0].name == "per-channel weights"
    step = session.apply(finding)
    assert step.gained and step.remedy == "override"
    after = session.report.df.set_index("node").loc["conv2d", finding.remedies[0].figure]
    assert float(after) == pytest.approx(finding.remedies[0].after_db, abs=0.05)


def test_kept_estimates_are_what_measuring_again_gives(outlier_conv, monkeypatch):
    """diagnose(estimates=...): the second diagnosis of the same model measures nothing and is
    the first, finding for finding; after a change to one layer only what changed is measured,
    and the diagnosis equals one measured from nothing."""
    import sys

    _, data, (gm, prepared, _, report, first) = outlier_conv
    kept: dict = {}
    choice = sys.modules["qviz.numeric.diagnose.choice"]
    measured, original = [], choice.estimate

    def counted(local, name, p, before):
        measured.append(local.node.name)
        return original(local, name, p, before)

    monkeypatch.setattr(choice, "estimate", counted)
    assert diagnose(report, prepared, data=data, progress=False, estimates=kept) == first
    again = len(measured)
    assert again > 0 and diagnose(report, prepared, data=data, progress=False,
                                  estimates=kept) == first  # fmt: skip
    assert len(measured) == again  # nothing measured twice
    # by default the process's recent estimates: the fixture's diagnosis measured these
    assert diagnose(report, prepared, data=data, progress=False) == first
    assert len(measured) == again
    # c2's output observed by min/max: c1's finding is kept, c2's quantizers changed
    changed = OverrideQuantizer(_quantizer(), {"conv2d_1": {"observer": "MinMaxObserver"}})
    _, prepared2, converted2 = quantize(gm, data, changed)
    report2 = qviz.numeric.compare(gm, converted2, data, progress=False)
    fresh = diagnose(report2, prepared2, data=data, progress=False, estimates={})
    start = len(measured)
    assert diagnose(report2, prepared2, data=data, progress=False, estimates=kept) == fresh
    assert len(measured) - start < start - again  # fewer measured than from nothing
