"""cross_layer_equalization: exact properties on toy chains, and AIMET's equalize_model as the
oracle on torchvision's resnet18 and mobilenet_v2."""

import copy
import itertools
import warnings

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.graph.get_attr import get_attr_value
from qviz.engine.pt2e.plan import TRANSFORMS_KEY
from qviz.engine.repair import cross_layer_equalization
from qviz.errors import ConfigError
from qviz.numeric.measure.metrics import sqnr
from tests.helpers.quantize import quantize


def _scrambled(model: nn.Module, seed: int = 0) -> nn.Module:
    """Output channels scaled by factors e^N(0, 1.5): ranges that differ by orders of magnitude."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                shape = (m.weight.shape[0],) + (1,) * (m.weight.ndim - 1)
                m.weight.mul_(torch.exp(1.5 * torch.randn(shape, generator=gen)))
    return model.eval()


def _layers(gm):
    """{node name: (weight, bias, groups)} of every conv / linear of a graph."""
    out = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and str(n.target).split(".")[1] in ("conv2d", "linear"):
            bias = n.args[2] if len(n.args) > 2 else None
            groups = n.args[6] if len(n.args) > 6 else 1
            out[n.name] = (
                get_attr_value(gm, n.args[1]).detach(),
                None if bias is None else get_attr_value(gm, bias).detach(),
                groups,
            )
    return out


def _r_out(w):
    return w.abs().flatten(1).amax(1)


def _r_in(w, groups=1):
    w = w.abs().flatten(2).amax(2) if w.ndim > 2 else w.abs()  # (out, in / groups)
    out, per_group = w.shape
    return w.reshape(groups, out // groups, per_group).amax(1).reshape(-1)


def _records(gm):
    return gm.meta.get(TRANSFORMS_KEY, ())


TOYS = {
    "conv-relu-conv": (
        lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 5, 3)),
        (4, 3, 9, 9),
    ),
    "linear-relu-linear": (
        lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)),
        (5, 6),
    ),
    "conv-dw-conv": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 8, 1),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, groups=8),
            nn.LeakyReLU(0.1),
            nn.Conv2d(8, 6, 1),
        ),
        (4, 3, 7, 7),
    ),
    "conv-grouped-conv-linear chain": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, groups=2),
            nn.Conv2d(8, 4, 1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, 8),
            nn.PReLU(),
            nn.Linear(8, 3),
        ),
        (4, 3, 6, 6),
    ),
}


@pytest.mark.parametrize("name", list(TOYS))
def test_the_float_function_is_unchanged_and_the_original_untouched(name):
    make, shape = TOYS[name]
    torch.manual_seed(0)
    gm = qviz.export(_scrambled(make()), (torch.randn(shape),))
    before = {k: v.clone() for k, v in gm.state_dict().items()}
    code = gm.code
    x = torch.randn(shape)
    eq = cross_layer_equalization(gm)
    with torch.no_grad():
        y, y_eq = gm(x), eq(x)
    assert torch.allclose(y_eq, y, rtol=1e-5, atol=1e-6 * float(y.abs().max())), name
    assert gm.code == code and TRANSFORMS_KEY not in gm.meta
    assert all(torch.equal(before[k], v) for k, v in gm.state_dict().items())
    assert [r for r in _records(eq) if dict(r.params)["equalized"]], name
    changed = [k for k, v in eq.state_dict().items() if not torch.equal(v, before[k])]
    assert changed  # the copy's weights moved


def test_a_pair_ends_with_the_papers_equal_ranges():
    torch.manual_seed(1)
    make, shape = TOYS["conv-relu-conv"]
    gm = qviz.export(_scrambled(make()), (torch.randn(shape),))
    (w1, _, _), (w2, _, _) = _layers(gm).values()
    r1, r2 = _r_out(w1).double(), _r_in(w2).double()
    eq = cross_layer_equalization(gm)
    (e1, _, _), (e2, _, _) = _layers(eq).values()
    q1, q2 = _r_out(e1).double(), _r_in(e2).double()
    # r1_i / max(r1) == r2_i / max(r2): here both ranges of channel i are sqrt(r1_i * r2_i)
    torch.testing.assert_close(q1 / q1.max(), q2 / q2.max(), rtol=1e-6, atol=0)
    torch.testing.assert_close(q1, torch.sqrt(r1 * r2), rtol=1e-6, atol=0)
    s = torch.sqrt(r1 * r2) / r2  # the paper's s_i
    torch.testing.assert_close(e1.double(), w1.double() / s[:, None, None, None], rtol=1e-6, atol=0)
    torch.testing.assert_close(e2.double(), w2.double() * s[None, :, None, None], rtol=1e-6, atol=0)
    (record,) = _records(eq)
    params = dict(record.params)
    assert record.nodes == ("conv2d", "conv2d_1") and "relu" in record.detail
    assert params["max_scale"] == pytest.approx(float(s.max()), rel=1e-6)  # W1 rows / s
    assert params["min_scale"] == pytest.approx(float(s.min()), rel=1e-6)
    assert params["range_spread_after"][0] == pytest.approx(params["range_spread_after"][1])
    assert params["range_spread_after"][0] < params["range_spread_before"][0]


def test_a_depthwise_triplet_gets_one_range_per_channel():
    torch.manual_seed(2)
    make, shape = TOYS["conv-dw-conv"]
    gm = qviz.export(_scrambled(make()), (torch.randn(shape),))
    (w0, _, _), (w1, _, _), (w2, _, _) = _layers(gm).values()
    cube = torch.pow(_r_out(w0).double() * _r_out(w1).double() * _r_in(w2).double(), 1 / 3)
    for sweeps in (1, None):  # closed form: converged in one sweep
        eq = cross_layer_equalization(gm, sweeps=sweeps)
        (e0, _, _), (e1, _, _), (e2, _, _) = _layers(eq).values()
        for r in (_r_out(e0), _r_out(e1), _r_in(e1, 8), _r_in(e2)):
            torch.testing.assert_close(r.double(), cube, rtol=1e-6, atol=0)
        assert [r.nodes for r in _records(eq)] == [("conv2d", "conv2d_1"), ("conv2d_1", "conv2d_2")]
        assert all("triplet" in r.detail for r in _records(eq))


def test_a_chain_converges_to_equal_ranges_on_every_pair():
    torch.manual_seed(3)
    model = _scrambled(
        nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)
        )
    )
    gm = qviz.export(model, (torch.randn(2, 3, 9, 9),))
    one, conv = cross_layer_equalization(gm, sweeps=1), cross_layer_equalization(gm, tol=1e-9)
    for eq, converged in ((conv, True), (one, False)):
        layers = list(_layers(eq).values())
        gaps = []
        for (a, _, _), (b, _, _) in itertools.pairwise(layers):
            ra, rb = _r_out(a).double(), _r_in(b).double()
            # converged: every s_i is 1, so r1_i == r2_i (and so the normalized ranges agree)
            gaps.append(float(((ra - rb) / ra.max()).abs().max()))
        # one pass: the last pair is exact; the pair before it was rescaled since
        assert max(gaps) < 1e-6 if converged else gaps[-1] < 1e-6
    assert dict(_records(conv)[0].params)["sweeps"] > 1


def test_skipped_pairs_say_why():
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU6(), nn.Conv2d(4, 4, 1), nn.Sigmoid())
    gm = qviz.export(model.eval(), (torch.randn(1, 3, 4, 4),))
    (record,) = _records(cross_layer_equalization(gm))
    assert record.nodes == ("conv2d", "conv2d_1") and not dict(record.params)["equalized"]
    assert "hardtanh" in record.detail and "not scale-equivariant" in record.detail

    class Branch(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return self.b(h) + self.c(h)

    gm = qviz.export(Branch().eval(), (torch.randn(1, 3, 4, 4),))
    x = torch.randn(1, 3, 4, 4)
    eq = cross_layer_equalization(gm)
    (record,) = _records(eq)
    assert record.nodes == ("conv2d",) and "feeds 2 nodes" in record.detail
    assert torch.equal(eq(x), gm(x))


def test_batch_norm_is_folded_and_high_biases_absorbed():
    """conv1x1 -> BN (beta far above 3 gamma) -> relu -> conv1x1: no padding, and every
    pre-activation above the absorbed c, so absorption is exact; c as the paper says."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(3, 6, 1), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 4, 1))
    bn = model[1]
    with torch.no_grad():
        bn.running_mean.zero_(), bn.running_var.fill_(1.0)
        bn.weight.copy_(torch.linspace(0.1, 0.5, 6))
        bn.bias.copy_(torch.linspace(2.0, 8.0, 6))
    model = _scrambled(model)
    x = 0.01 * torch.randn(8, 3, 5, 5)  # pre-activations ~ beta +- small: all above c
    gm = qviz.export(model, (x,))
    plain = cross_layer_equalization(gm, high_bias_absorption=False)
    hba = cross_layer_equalization(gm)
    assert not any("batch_norm" in str(n.target) for n in hba.graph.nodes)
    torch.testing.assert_close(hba(x), gm(x), rtol=1e-5, atol=1e-5)
    (p1, pb1, _), (p2, pb2, _) = _layers(plain).values()
    (h1, hb1, _), (h2, hb2, _) = _layers(hba).values()
    assert torch.equal(h1, p1) and torch.equal(h2, p2)
    s = dict(_records(plain)[0].params)  # the scale of each channel: from the weights
    scale = _r_out(model[0].weight * (bn.weight / (1 + bn.eps) ** 0.5)[:, None, None, None])
    scale = (scale / _r_out(p1)).detach()
    assert float(scale.max()) == pytest.approx(s["max_scale"], rel=1e-5)
    c = torch.clamp(bn.bias / scale - 3 * bn.weight.abs() / scale, min=0).detach()
    torch.testing.assert_close(hb1, pb1 - c, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(hb2, pb2 + p2.flatten(1) @ c, rtol=1e-5, atol=1e-5)
    assert dict(_records(hba)[0].params)["max_absorbed_bias"] == pytest.approx(float(c.max()))


def test_it_takes_the_exported_float_graph_only():
    with pytest.raises(ConfigError, match=r"qviz\.export"):
        cross_layer_equalization(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="sweeps"):
        gm = qviz.export(nn.Linear(2, 2).eval(), (torch.randn(1, 2),))
        cross_layer_equalization(gm, sweeps=0)


# --- AIMET's equalize_model as the oracle -----------------------------------------------------


def _torchvision(name: str, seed: int = 0) -> nn.Module:
    """Random weights; BatchNorm affine parameters drawn, statistics from train-mode passes."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5), m.bias.normal_(0, 0.5)
        model.train()
        for _ in range(4):
            model(torch.randn(16, 3, 64, 64))
    return model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_aimet_equalize_model_is_the_oracle(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        aimet_cle = pytest.importorskip("aimet_torch.cross_layer_equalization")
    model = _torchvision(name)
    example = (torch.randn(2, 3, 64, 64),)
    aimet_model = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        aimet_cle.equalize_model(aimet_model, input_shapes=(1, 3, 64, 64))
    gm = qviz.export(model, example, dynamic_batch=True)
    aimet_gm = qviz.export(aimet_model, example, dynamic_batch=True)
    one_pass = cross_layer_equalization(gm, sweeps=1)
    # the same sets, scales and absorbed biases: qviz's weights are AIMET's to float32 rounding
    aimet_layers = {str(k).rsplit(".", 1)[0]: v for k, v in _by_module(aimet_gm).items()}
    ours = {str(k).rsplit(".", 1)[0]: v for k, v in _by_module(one_pass).items()}
    assert aimet_layers.keys() == ours.keys()
    for key, (w, b) in aimet_layers.items():
        torch.testing.assert_close(ours[key][0], w, rtol=1e-5, atol=1e-6 * float(w.abs().max()))
        torch.testing.assert_close(ours[key][1], b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
    pairs = [r for r in _records(one_pass) if dict(r.params)["equalized"]]
    assert len(pairs) == {"resnet18": 8, "mobilenet_v2": 2}[name]  # relu6 stops mobilenet's
    torch.manual_seed(1)
    calib, test = [torch.randn(8, 3, 64, 64) for _ in range(4)], torch.randn(32, 3, 64, 64)
    reference = model(test)
    # W8A8, per-tensor weights
    before = sqnr(reference, quantize(gm, calib, per_channel=False).converted(test))
    aimet = sqnr(reference, quantize(aimet_gm, calib, per_channel=False).converted(test))
    equalized = cross_layer_equalization(gm)
    qviz_db = sqnr(reference, quantize(equalized, calib, per_channel=False).converted(test))
    # float32 rounding differences between the two BatchNorm folds move per-tensor W8A8 by
    # about 0.1 dB either way on these random-weight models
    assert qviz_db >= aimet - 0.3, (before, aimet, qviz_db)


def _by_module(gm):
    out = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and "conv2d" in str(n.target):
            out[str(n.args[1].target)] = (
                get_attr_value(gm, n.args[1]).detach(),
                get_attr_value(gm, n.args[2]).detach(),
            )
    return out


def test_a_model_prepared_from_an_equalized_graph_compares_with_it():
    """With a BatchNorm folded by the equalization, the numeric suite matches every quantized
    operator with the equalized graph's own (the folded conv is that graph's operator now)."""
    from qviz.numeric import compare

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3)
    ).eval()  # fmt: skip
    x = torch.randn(8, 3, 10, 10)
    equalized = cross_layer_equalization(qviz.export(model, (x,)))
    converted = quantize(equalized, x, per_channel=False).converted
    report = compare(equalized, converted, x, progress=False)
    assert {"conv2d", "conv2d_1"} <= set(report.df["node"]) and report.output_sqnr > 20
