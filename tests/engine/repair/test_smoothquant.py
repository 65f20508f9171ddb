"""SmoothQuant (qviz.engine.repair.smooth_quant) against the paper's equations on toy blocks."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import qviz
from qviz.engine.quantizers import XNNPACKQuantizer, get_symmetric_quantization_config
from qviz.engine.repair.smoothquant import find_groups, smooth_quant
from qviz.errors import CalibrationError, ConfigError
from tests.helpers.quantize import quantize

OUTLIERS = [3, 17, 40]


class TwoHeads(nn.Module):
    """A LayerNorm read by two linears (as q and k read one), a relu, one more linear."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.fc = nn.Linear(width, width // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        return self.fc(torch.relu(self.q(h))) + self.k(h)[..., : self.fc.out_features]


def _batches(n: int, seed: int, shape: tuple[int, ...] = (16, 64)) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen) for _ in range(n)]


def _smooth(gm, data, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return smooth_quant(gm, data, progress=False, **kw)


def _with_outliers(seed: int = 0) -> TwoHeads:
    """LayerNorm channels scaled by 80 and the linears' columns by 1/80: the float function of
    a plain block, with the activation outliers of a trained transformer's LayerNorm."""
    torch.manual_seed(seed)
    model = TwoHeads().eval()
    with torch.no_grad():
        model.ln.bias.normal_(0, 0.1)
        model.ln.weight[OUTLIERS] *= 80
        model.ln.bias[OUTLIERS] *= 80
        for linear in (model.q, model.k):
            linear.weight[:, OUTLIERS] /= 80
    return model


def test_float_function_unchanged_and_recorded():
    torch.manual_seed(0)
    model = TwoHeads().eval()
    data = _batches(4, 1)
    gm = qviz.export(model, (data[0],), dynamic_batch=True)
    before = {k: v.clone() for k, v in gm.state_dict().items()}
    with pytest.warns(UserWarning, match="linear_1: its input comes from relu"):
        out = smooth_quant(gm, data, progress=False)
    x = torch.randn(5, 64)
    torch.testing.assert_close(out(x), gm(x), rtol=1e-5, atol=1e-5)
    for key, value in gm.state_dict().items():  # the caller's graph is untouched
        assert torch.equal(value, before[key]), key
    (record,) = out.meta["qviz_transforms"]
    assert record.kind == "smoothquant"
    assert record.nodes == ("layer_norm", "linear", "linear_2")  # q, k; fc is linear_1
    params = dict(record.params)
    assert params["alpha"] == 0.5 and params["ratio_after"] == pytest.approx(1.0, rel=1e-4)
    assert params["ratio_before"] > params["ratio_after"]


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_factors_follow_the_formula(alpha):
    """s_j = max|X_j|^alpha / max|W_j|^(1-alpha), X the LayerNorm output over the data, W the
    two linears' columns; LayerNorm weight and bias divided by s, the columns multiplied."""
    model = _with_outliers(seed=2)
    data = _batches(3, 3)
    gm = qviz.export(model, (data[0],), dynamic_batch=True)
    out = _smooth(gm, data, alpha=alpha)
    with torch.no_grad():  # the reference: the eager model's own LayerNorm outputs
        act = torch.stack([model.ln(x).abs().amax(dim=0) for x in data]).amax(dim=0).double()
        w = torch.cat([model.q.weight, model.k.weight]).abs().amax(dim=0).double()
    s = (act**alpha / w ** (1 - alpha)).float()
    sd = out.state_dict()
    torch.testing.assert_close(sd["ln.weight"], model.ln.weight / s)
    torch.testing.assert_close(sd["ln.bias"], model.ln.bias / s)
    torch.testing.assert_close(sd["q.weight"], model.q.weight * s)
    torch.testing.assert_close(sd["k.weight"], model.k.weight * s)
    torch.testing.assert_close(sd["fc.weight"], model.fc.weight)  # behind a relu: skipped
    assert float(s[OUTLIERS].min()) > 10 * float(s.median())  # outliers moved the most


@pytest.mark.parametrize("norm_first", [True, False])
def test_transformer_encoder_layer(norm_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first
    ).eval()
    data = _batches(3, 4, (2, 6, 32))
    gm = qviz.export(layer, (data[0],))
    out = _smooth(gm, data)
    x = _batches(1, 5, (2, 6, 32))[0]
    torch.testing.assert_close(out(x), gm(x), rtol=1e-5, atol=1e-5)
    groups, skipped = find_groups(gm)
    records = out.meta.get("qviz_transforms", ())
    if norm_first:  # norm1 -> transpose -> in_proj (q, k, v in one), norm2 -> linear1
        assert [r.nodes for r in records] == [
            ("layer_norm", "linear"),
            ("layer_norm_1", "linear_2"),
        ]
    else:  # post-norm: the residual add reads norm1's output; norm2 is the layer's output
        assert records == ()
        assert "also feeds add_1" in skipped["linear_2"]
    assert "relu" in skipped["linear_3"] and len(groups) == len(records)


def test_linear_into_linear():
    """A linear feeding only linears absorbs 1/s in its rows and bias."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)).eval()
    with torch.no_grad():
        model[0].weight[:2] *= 50
    data = _batches(2, 6, (32, 8))
    gm = qviz.export(model, (data[0],), dynamic_batch=True)
    out = _smooth(gm, data)
    x = torch.randn(7, 8)
    torch.testing.assert_close(out(x), gm(x), rtol=1e-5, atol=1e-4)
    (record,) = out.meta["qviz_transforms"]
    assert record.nodes == ("linear", "linear_1")
    act = torch.cat([model[0](b) for b in data]).abs().amax(dim=0).detach()
    s = (act.double() ** 0.5 / model[1].weight.abs().amax(dim=0).double() ** 0.5).float()
    torch.testing.assert_close(out.state_dict()["1.weight"], model[1].weight * s)


def _sqnr(reference, model, batches) -> float:
    num = den = 0.0
    with torch.no_grad():
        for x in batches:
            r = reference(x)
            num += float(r.pow(2).sum())
            den += float((r - model(x)).pow(2).sum())
    return 10 * torch.log10(torch.tensor(num / den)).item()


def test_outliers_w8a8_per_tensor_improves():
    """Per-tensor int8 activations of a LayerNorm output with 80x channels leave the other
    channels a few steps; after SmoothQuant the quantized block tracks the float one far better
    (measured: 6.7 dB -> 33.8 dB output SQNR)."""
    model = _with_outliers()
    data, test = _batches(8, 7), _batches(8, 8)
    gm = qviz.export(model, (data[0],), dynamic_batch=True)
    smoothed = _smooth(gm, data)
    # W8A8: per-tensor activations and weights
    before = _sqnr(gm, quantize(gm, data, per_channel=False).converted, test)
    after = _sqnr(gm, quantize(smoothed, data, per_channel=False).converted, test)
    assert after > before + 15, (before, after)
    prepared = qviz.prepare_pt2e(
        smoothed, XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    )
    assert [r.kind for r in prepared.plan.transforms] == ["smoothquant"]


def test_errors_name_the_fix():
    model = TwoHeads().eval()
    data = _batches(2, 9)
    gm = qviz.export(model, (data[0],), dynamic_batch=True)
    with pytest.raises(ConfigError, match="alpha must be in"):
        smooth_quant(gm, data, alpha=1.5)
    prepared = qviz.prepare_pt2e(
        gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    )
    with pytest.raises(ConfigError, match="smooth_quant takes"):
        smooth_quant(prepared, data)
    bad = [data[0], torch.full((16, 64), float("nan"))]
    with pytest.raises(CalibrationError, match="batch 1"):
        _smooth(gm, bad)
