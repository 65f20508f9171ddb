"""qviz.numeric.diagnose: each planted cause is named, its evidence matches an independent
computation on the float and converted models, and the prescription names the right fix."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.quantizers.override import OverrideQuantizer
from qviz.errors import ConfigError
from qviz.numeric import Cause, diagnose, fallback
from tests.helpers.quantize import quantize

OVERRIDE = "qviz.engine.quantizers.override.OverrideQuantizer"


def _quantizer():
    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config())


def _run(model, calib, evaluate=None, quantizer=None):
    """(float graph, calibrated prepared, converted, report over ``evaluate``, diagnosis)."""
    evaluate = evaluate or calib
    gm, prepared, converted = quantize(model, calib, quantizer or _quantizer(), dynamic_batch=True)
    report = qviz.numeric.compare(gm, converted, evaluate, progress=False)
    return gm, prepared, converted, report, diagnose(report, prepared, data=evaluate)


def _lower_median_spread(amax: torch.Tensor) -> float:
    ordered = amax.double().sort().values
    return float(ordered[-1] / ordered[(len(ordered) - 1) // 2])


def _only(diagnosis, node):
    found = diagnosis.for_node(node)
    assert len(found) == 1, diagnosis.df.to_string()
    return found[0]


def _output_qparams(converted, node_name):
    """scale, zero point, quant_min, quant_max of the quantize op after ``node_name``."""
    node = next(n for n in converted.graph.nodes if n.name == node_name)
    q = next(u for u in node.users if "quantize_per_tensor" in str(u.target))
    return float(q.args[1]), int(q.args[2]), int(q.args[3]), int(q.args[4])


class TwoConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))


def test_an_outlier_weight_channel_is_named_and_per_channel_weights_fix_it():
    model = TwoConvs()
    with torch.no_grad():
        model.c1.weight[2] *= 50
    data = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    *_, report, diagnosis = _run(model, data)
    finding = _only(diagnosis, "conv2d")
    assert finding.cause is Cause.OUTLIER_CHANNELS
    amax = model.c1.weight.detach().abs().amax((1, 2, 3))
    assert finding.facts["channel_spread"] == pytest.approx(_lower_median_spread(amax), rel=1e-5)
    assert finding.facts["widest_channel"] == 2
    row = report.df.set_index("node").loc["conv2d"]
    assert row["local_sqnr"] > 25 > row["local_worst_channel_sqnr"]  # hidden by the average
    assert finding.figure == "local_worst_channel_sqnr"
    assert finding.suggested.function == OVERRIDE
    overrides = dict(finding.suggested.arguments)["overrides"]
    assert list(overrides.values()) == [{"qscheme": "per_channel_symmetric", "ch_axis": 0}]
    *_, fixed, _ = _run(model, data, quantizer=OverrideQuantizer(_quantizer(), overrides))
    assert fixed.df.set_index("node").loc["conv2d", "local_worst_channel_sqnr"] > 25


class NormThenLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(16, 16)
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(self.ln(self.fc0(x)))


def test_activation_outlier_channels_after_a_layernorm_prescribe_smoothquant():
    model = NormThenLinear()
    with torch.no_grad():
        model.ln.weight[[3, 7]] *= 80
    data = [torch.randn(4, 6, 16) for _ in range(3)]
    seen = []
    hook = model.ln.register_forward_hook(lambda m, a, out: seen.append(out.abs().amax((0, 1))))
    with torch.no_grad():
        for x in data:
            model(x)
    hook.remove()
    _, prepared, _, report, diagnosis = _run(model, data)
    state = {k: v.clone() for k, v in prepared.state_dict().items()}
    assert diagnose(report, prepared, data=data).df.equals(diagnosis.df)  # run twice: alike
    assert all(torch.equal(v, state[k]) for k, v in prepared.state_dict().items())
    finding = _only(diagnosis, "linear_1")
    assert finding.cause is Cause.OUTLIER_CHANNELS
    assert finding.facts["tensor"] == "layer_norm"
    expected = _lower_median_spread(torch.stack(seen).amax(0))
    assert finding.facts["channel_spread"] == pytest.approx(expected, rel=1e-5)
    assert finding.facts["widest_channel"] in (3, 7)
    assert finding.suggested.function == "qviz.engine.repair.smooth_quant"
    assert dict(finding.suggested.arguments)["nodes"] == ("linear_1",)


def test_clipping_on_data_wider_than_calibration_is_split_from_rounding():
    model = nn.Sequential(nn.Linear(16, 16))
    calib = [0.1 * torch.randn(8, 16) for _ in range(3)]
    evaluate = [10 * torch.randn(8, 16) for _ in range(3)]
    _, _, converted, _, diagnosis = _run(model, calib, evaluate)
    finding = _only(diagnosis, "linear")
    assert finding.cause is Cause.CLIPPING
    scale, zp, qmin, qmax = _output_qparams(converted, "linear")
    with torch.no_grad():
        out = torch.cat([model(x) for x in evaluate]).double().flatten()
    beyond = (out < scale * (qmin - zp - 0.5)) | (out > scale * (qmax - zp + 0.5))
    err = torch.fake_quantize_per_tensor_affine(out.float(), scale, zp, qmin, qmax).double() - out
    assert finding.facts["clipped"] == pytest.approx(float(beyond.double().mean()))
    share = float(err[beyond].square().sum() / err.square().sum())
    assert finding.facts["clip_error_share"] == pytest.approx(share, rel=1e-4)
    assert finding.facts["float_max"] == pytest.approx(float(out.max()))
    assert finding.suggested.function == OVERRIDE
    fixed = dict(finding.suggested.arguments)["overrides"]["linear"]
    low = fixed["scale"] * (qmin - fixed["zero_point"])
    high = fixed["scale"] * (qmax - fixed["zero_point"])
    assert low <= float(out.min()) + fixed["scale"] and high >= float(out.max()) - fixed["scale"]


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(16, 4)
        with torch.no_grad():
            self.b.weight *= 100
            self.b.bias *= 100

    def forward(self, x):
        return self.head(torch.cat([self.a(x), self.b(x)], -1))


def test_a_cat_of_branches_with_ranges_one_and_a_hundred_is_a_shared_group():
    model = TwoBranches()
    data = [torch.randn(8, 8) for _ in range(3)]
    _, prepared, _, _, diagnosis = _run(model, data)
    finding = _only(diagnosis, "linear")
    assert finding.cause is Cause.SHARED_GROUP
    with torch.no_grad():
        small = max(float(model.a(x).abs().max()) for x in data)
        large = max(float(model.b(x).abs().max()) for x in data)
    facts = finding.facts
    assert facts["small_member"] == "linear"
    assert facts["small_range"] == pytest.approx(small, rel=1e-5)
    assert facts["large_range"] == pytest.approx(large, rel=1e-5)
    assert facts["range_ratio"] == pytest.approx(large / small, rel=1e-5)
    members = {str(m) for m in prepared.plan.group(facts["group"]).members}
    assert {"linear", "linear_1", "cat"} <= {m.split(" ->")[0] for m in members}
    overrides = dict(finding.suggested.arguments)["overrides"]
    assert overrides and all(key.startswith("linear") and key in members for key in overrides)
    assert all(f.cause is Cause.SHARED_GROUP for f in diagnosis)  # the cat too


class LayerScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.gamma = nn.Parameter(torch.full((8,), 1e-6))

    def forward(self, x):
        return self.fc(x) * self.gamma


def test_a_layer_scale_of_1e_6_is_a_degenerate_range_at_0_db_and_fallback_fixes_it():
    model = LayerScale()
    data = [torch.randn(8, 8) for _ in range(3)]
    gm, _, converted, _, diagnosis = _run(model, data)
    finding = _only(diagnosis, "mul")
    assert finding.cause is Cause.DEGENERATE
    assert finding.facts["tensor"] == "gamma -> mul"
    assert finding.facts["zeros_before"] == 0.0 and finding.facts["zeros_after"] == 1.0
    assert finding.facts["scale"] > 2 * 1e-6  # every |gamma| lies within half a step of zero
    with torch.no_grad():
        f = torch.cat([gm(x) for x in data]).double()
        q = torch.cat([converted(x) for x in data]).double()
    independent = 10 * math.log10(float(f.square().sum() / (f - q).square().sum()))
    assert finding.sqnr == pytest.approx(independent, abs=1e-6) and abs(independent) < 1e-3
    assert finding.suggested.function == "qviz.numeric.fallback"
    names = dict(finding.suggested.arguments)["nodes_or_module_names"]
    *_, fixed, _ = _run(model, data, quantizer=fallback(_quantizer(), names))
    assert "mul" not in set(fixed.df["node"]) and fixed.output_sqnr > 25


def test_a_broken_token_hidden_by_the_tensor_sqnr_is_a_slice():
    model = nn.Sequential(nn.Linear(16, 16))
    data = []
    for _ in range(3):
        x = torch.randn(4, 6, 16)
        x[:, 0] *= 1000  # token 0 sets the per-tensor input range; the others starve
        data.append(x)
    gm, _, converted, report, diagnosis = _run(model, data)
    finding = _only(diagnosis, "linear")
    assert finding.cause is Cause.SLICE
    with torch.no_grad():
        f = torch.cat([gm(x) for x in data]).double()
        q = torch.cat([converted(x) for x in data]).double()
    per_token = 10 * torch.log10(f.square().sum((0, 2)) / (f - q).square().sum((0, 2)))
    row = report.df.set_index("node").loc["linear"]
    assert row["local_sqnr"] > 25
    assert row["local_worst_token_sqnr"] == pytest.approx(float(per_token.min()), abs=1e-4)
    assert row["worst_token"] == int(per_token.argmin()) != 0
    assert finding.facts["worst_token"] == row["worst_token"]
    assert finding.facts["local_worst_token_sqnr"] < 5
    assert finding.suggested.function == "qviz.numeric.fallback"


def test_a_healthy_model_has_no_finding_and_the_diagnosis_draws_as_a_graph_metric():
    data = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    _, prepared, converted, report, diagnosis = _run(TwoConvs(), data)
    worst = report.df[["local_sqnr", "local_worst_channel_sqnr"]].min(axis=1)
    assert (worst > diagnosis.threshold_db).all() and len(diagnosis) == 0
    assert repr(diagnosis) == "Diagnosis(no layer below 25 dB)"
    strict = diagnose(report, prepared, threshold_db=float(worst.max()) + 1)
    assert {f.node for f in strict} == set(report.df["node"])
    values, name, higher, _ = strict.graph_metric()
    assert set(values) == set(report.df["node"]) and not higher and "severity" in name
    assert strict.df["node"].iloc[0] == strict.findings[0].node
    assert "<table" in strict._repr_html_()
    drawn = {n.name: n.value for n in qviz.viz.graph(converted, metrics=strict).view.nodes}
    assert all(drawn[node] == pytest.approx(value) for node, value in values.items())
    with pytest.raises(ConfigError, match="prepared"):
        diagnose(report, converted)


def test_a_nearly_dead_channel_is_not_ranked_as_the_worst_slice():
    """A channel a ReLU leaves nearly dead (values far below the grid's step) rounds to zero:
    0 dB on its own, yet it carries no error forward. The worst channel is the worst of the
    channels with signal (at least 1 % of the median channel's energy)."""
    from qviz.numeric.measure.slices import SliceStats

    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 16, generator=gen, dtype=torch.float64).abs()
    ref[:, 3] *= 1e-3  # nearly dead: 1e-6 of the others' energy
    ref[:, 8:] = 0  # half the channels dead (no signal): they do not lower the median
    test = ref.clone()
    test[:, 3] = 0  # rounds to zero: 0 dB on its own
    test[:, 5] += 0.1 * ref[:, 5]  # a live channel 20 dB down
    stats = SliceStats()
    stats.update(ref, test)
    assert stats.worst_channel() == 5
    assert stats.worst_channel_sqnr() == pytest.approx(20.0, abs=1e-9)


def test_the_graph_colours_each_poor_layer_by_its_cause():
    from qviz.numeric.diagnose.rules import CAUSE_COLOURS

    data = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    _, prepared, converted, report, _ = _run(TwoConvs(), data)
    strict = diagnose(report, prepared, data=data, threshold_db=200.0)  # every layer is poor
    causes = {f.node: f.cause for f in strict}
    g = qviz.viz.graph(converted, metrics=strict, metric_column="cause")
    drawn = {n.name: n.category for n in g.view.nodes if n.category is not None}
    assert drawn == {k: (c.value, CAUSE_COLOURS[c]) for k, c in causes.items()}
    assert g.view.categories == tuple(
        (c.value, colour) for c, colour in CAUSE_COLOURS.items() if c in set(causes.values())
    )
    assert all(n.value is None for n in g.view.nodes)  # classes, not a heat map
    for cause in set(causes.values()):
        assert f"cause: {cause.value}" in g.dot and CAUSE_COLOURS[cause] in g.dot
    boxes = qviz.viz.graph(converted, metrics=strict, metric_column="cause", collapse=1).view
    c2 = next(n for n in boxes.nodes if n.kind == "collapsed" and n.label == "c2")
    assert c2.category == (causes["conv2d_1"].value, CAUSE_COLOURS[causes["conv2d_1"]])
    with pytest.raises(ConfigError, match="graph_categories"):
        strict.graph_categories("severity")


def test_a_relus_exact_zeros_are_not_a_degenerate_range():
    """Half of a ReLU's outputs are exactly 0 before quantizing: rounding them to 0 loses
    nothing, so the layer that reads them is not 'degenerate' (its input's zeros before are
    the histogram's share within a bin of 0, not 0)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    data = [torch.randn(64, 16) for _ in range(3)]
    _, prepared, _, report, _ = _run(model, data)
    strict = diagnose(report, prepared, data=data, threshold_db=200.0)  # every layer is poor
    with torch.no_grad():
        exact = float(torch.cat([model[1](model[0](x)) for x in data]).eq(0).double().mean())
    assert 0.3 < exact < 0.7
    assert all(f.cause is not Cause.DEGENERATE for f in strict), strict.df.to_string()
    from qviz.numeric.diagnose.rules import Context, _zero_shares

    ctx = Context(
        rows={}, prepared=prepared, plan=prepared.plan, threshold_db=200.0, outlier_factor=10.0
    )
    rec = next(r for r in ctx.records("linear_1") if r.tensor.consumer == "linear_1"
               and r.tensor.producer == "relu")  # fmt: skip
    before, after, _, _ = _zero_shares(ctx, rec)
    assert before == pytest.approx(exact, abs=0.02) and after - before < 0.05


def test_a_weight_that_mostly_rounds_to_zero_is_rounding_not_a_degenerate_range():
    """At 3 bits per tensor the step is a third of the largest weight: a weight whose every
    channel has one large tap rounds mostly to zero. That is rounding (learned rounding is the
    remedy), not a degenerate range to keep in float."""
    torch.manual_seed(0)
    model = TwoConvs()
    with torch.no_grad():
        model.c1.weight.normal_(0, 0.05)
        model.c1.weight[:, 0, 1, 1] = 1.0  # every channel's largest tap: no outlier channel
    three_bits = get_symmetric_quantization_config(
        is_per_channel=False, weight_qmin=-3, weight_qmax=3
    )
    data = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    *_, diagnosis = _run(model, data, quantizer=XNNPACKQuantizer().set_global(three_bits))
    w = model.c1.weight.detach()
    assert float((w.abs() < w.abs().max() / 6).double().mean()) > 0.9  # rounds to zero
    finding = _only(diagnosis, "conv2d")
    assert finding.cause is Cause.ROUNDING
    assert finding.suggested.function != "qviz.numeric.fallback"


def test_a_slice_whose_error_is_an_offset_prescribes_bias_correction():
    """Channel 3's weights all round to zero on the per-tensor grid the other rows set, so its
    error is ``-x . w3``: with inputs near 1.5 nearly all of it is a constant offset. The
    diagnosis says so with the channel's own offset share, and bias correction fixes it."""
    from qviz.engine.repair import bias_correction

    linear = nn.Linear(4, 8)
    with torch.no_grad():
        linear.weight.copy_(torch.randint(-7, 8, (8, 4)).float())
        linear.weight[0, 0] = 7.5  # the grid: step 1 (4 bits per tensor: 7.5 / 7.5)
        linear.weight[3] = 0.1  # rounds to 0: channel 3 outputs its bias alone
        linear.bias[3] = 5.0  # a live channel: about 5.6 in float, 5.0 quantized
    gen = torch.Generator().manual_seed(0)
    data = [1.5 + 0.05 * torch.randn(64, 4, generator=gen) for _ in range(3)]
    four_bits = get_symmetric_quantization_config(
        is_per_channel=False, weight_qmin=-8, weight_qmax=7
    )
    model = nn.Sequential(linear)
    gm, _, converted, _, diagnosis = _run(
        model, data, quantizer=XNNPACKQuantizer().set_global(four_bits)
    )
    finding = _only(diagnosis, "linear")
    assert finding.cause is Cause.SLICE and finding.facts["worst_channel"] == 3
    with torch.no_grad():
        f = torch.cat([gm(x) for x in data]).double()[:, 3]
        err = torch.cat([converted(x) for x in data]).double()[:, 3] - f
    share = float(err.mean() ** 2 * len(err) / err.square().sum())
    assert finding.facts["worst_channel_bias_share"] == pytest.approx(share, rel=1e-6)
    assert share > 0.9 and finding.suggested.function == "qviz.engine.repair.bias_correction"
    fixed = bias_correction(converted, gm, data)
    after = qviz.numeric.compare(gm, fixed, data, progress=False).df.set_index("node")
    assert after.loc["linear", "local_worst_channel_sqnr"] > 25
