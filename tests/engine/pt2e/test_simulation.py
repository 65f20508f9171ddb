"""The converted model's exact simulation: the quantize / dequantize operators' own outputs, bit
for bit (a property over scales, zero points, grids and awkward values), the converted models'
outputs bit for bit on models of every shape the suite quantizes, the converted model untouched;
and convert_pt2e(inplace=True), which the variant pipeline uses, equal to the copying convert."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import qviz
from qviz.data import digits_loaders, digits_model
from qviz.engine.compat import quantized_decomposed
from qviz.engine.graph.stage import Stage, model_stage
from qviz.engine.pt2e.observer_reuse import ObserverReuse
from qviz.engine.pt2e.plan import plan_of
from qviz.engine.pt2e.simulation import SIMULATED_KEY, fake_quantize, simulated
from qviz.engine.quantizers import get_symmetric_quantization_config
from tests.helpers.quantize import quantize, xnnpack

_GRIDS = {torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int16: (-32768, 32767)}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)  # -0.0 and +0.0 differ here, as NaN payloads do


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from(list(_GRIDS)),
    scale=st.floats(1e-6, 10.0, allow_nan=False, allow_infinity=False),
    zero_share=st.floats(0.0, 1.0),
    spread=st.floats(1e-3, 1e4),
    seed=st.integers(0, 2**16),
)
def test_fake_quantize_is_the_reference_pair_bit_for_bit(dtype, scale, zero_share, spread, seed):
    lo, hi = _GRIDS[dtype]
    zero_point = lo + round(zero_share * (hi - lo))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(257, generator=g) * spread  # odd length: the vector loops' tails too
    # exact ties (k + 0.5 steps), signed zeros, values far off the grid
    ties = (torch.arange(-6, 6) + 0.5) * scale
    x = torch.cat([x, ties, torch.tensor([0.0, -0.0, 1e30, -1e30, scale * 1e-3, -scale * 1e-3])])
    qd = quantized_decomposed()
    q = qd.quantize_per_tensor.default(x, scale, zero_point, lo, hi, dtype)
    reference = qd.dequantize_per_tensor.default(q, scale, zero_point, lo, hi, dtype)
    assert torch.equal(_bits(fake_quantize(x, scale, zero_point, lo, hi, dtype)), _bits(reference))


def test_fake_quantize_of_bfloat16_goes_through_the_reference_operators():
    x = torch.randn(64).to(torch.bfloat16)
    qd = quantized_decomposed()
    q = qd.quantize_per_tensor.default(x, 0.03, 2, -128, 127, torch.int8)
    expected = qd.dequantize_per_tensor.default(q, 0.03, 2, -128, 127, torch.int8)
    assert torch.equal(fake_quantize(x, 0.03, 2, -128, 127, torch.int8), expected)


class _Branches(nn.Module):
    """Shared observers (cat, max-pool), an add, a linear head: the shapes sharing makes."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        y = torch.cat([self.a(x), self.b(x)], 1)
        y = nn.functional.max_pool2d(torch.relu(self.bn(y)), 2)
        y = y + y.mean(dim=(2, 3), keepdim=True)
        return self.head(y.mean(dim=(2, 3)))


def _encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)


def _cases():
    torch.manual_seed(0)
    digits = list(digits_loaders(batch_size=32).calibration)[:2]
    images = [torch.randn(4, 3, 12, 12) for _ in range(2)]
    tokens = [torch.randn(2, 6, 16) for _ in range(2)]
    dynamic = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    return {
        "digits per channel": (digits_model(), [b[0] for b in digits], {"per_channel": True}),
        "digits per tensor": (digits_model(), [b[0] for b in digits], {"per_channel": False}),
        "branches": (_Branches(), images, {}),
        "encoder": (_encoder(), tokens, {}),
        "dynamic linear": (nn.Sequential(nn.Linear(16, 8)), tokens, {"config": dynamic}),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_simulation_gives_the_converted_outputs_bit_for_bit(case):
    model, batches, options = _cases()[case]
    q = quantize(model, batches, **options)
    converted = q.converted
    code, state = converted.code, {k: v.clone() for k, v in converted.state_dict().items()}
    fast = simulated(converted)
    with torch.no_grad():
        for x in [*batches, batches[0] * 3.0, -batches[-1]]:  # calibrated and beyond its range
            assert torch.equal(_bits(fast(x)), _bits(converted(x)))
    # the converted model is as it was: graph, constants, no mark
    assert converted.code == code and SIMULATED_KEY not in converted.meta
    assert all(torch.equal(state[k], v) for k, v in converted.state_dict().items())
    assert simulated(fast) is fast and plan_of(fast) == converted.plan
    if case != "dynamic linear":  # every static pair is one call, no integer weight is left
        targets = [n.target for n in fast.graph.nodes if n.op == "call_function"]
        assert fake_quantize in targets and model_stage(fast) is Stage.FLOAT


def test_variants_share_the_weights_they_have_in_common_and_stay_exact():
    """Simulations given one ``constants`` memo dequantize a weight two variants share once
    (the same float tensor); each still gives its converted model's outputs bit for bit."""
    from qviz.engine.graph.memo import ContentMemo
    from qviz.numeric import fallback

    model, batches, _ = _cases()["digits per channel"]
    gm = qviz.export(model, (batches[0],), dynamic_batch=True)

    def converted(quantizer):
        prepared = qviz.calibrate(qviz.prepare_pt2e(gm, quantizer), batches, progress=False)
        return qviz.convert_pt2e(prepared)

    full, variant = converted(xnnpack()), converted(fallback(xnnpack(), "conv2d_1"))
    memo = ContentMemo()
    a, b = simulated(full, constants=memo), simulated(variant, constants=memo)
    for fast, reference in ((a, full), (b, variant)):
        with torch.no_grad():
            for x in batches:
                assert torch.equal(_bits(fast(x)), _bits(reference(x)))

    def weights(fast):
        return {id(v) for k, v in fast.named_buffers() if k.startswith("_simulated_constant")}

    shared = weights(a) & weights(b)
    assert len(memo) == len(weights(a) | weights(b))  # each distinct weight dequantized once
    assert 0 < len(shared) < len(weights(a))  # all but the fallen-back layer's


def test_simulation_refuses_what_is_not_a_graph_module():
    with pytest.raises(qviz.QvizError, match="simulated\\(\\) needs the graph module"):
        simulated(nn.Linear(2, 2))


def test_convert_in_place_is_the_copying_convert_and_keeps_held_observers():
    torch.manual_seed(0)
    data = [torch.randn(4, 3, 12, 12) for _ in range(2)]
    gm = qviz.export(_Branches().eval(), (data[0],))
    prepared = qviz.prepare_pt2e(gm, xnnpack())
    reuse = ObserverReuse(prepared)
    qviz.calibrate(prepared, data, progress=False)
    held = copy.deepcopy(prepared)
    copied = qviz.convert_pt2e(held)
    in_place = qviz.convert_pt2e(prepared, inplace=True)
    assert in_place is prepared and in_place.code == copied.code
    assert in_place.plan == copied.plan
    with torch.no_grad():
        assert torch.equal(in_place(data[0]), copied(data[0]))
    # the observers ObserverReuse holds keep their calibrated state: a variant still fills
    variant = qviz.prepare_pt2e(gm, xnnpack())
    assert reuse.fill(variant)
    with torch.no_grad():
        assert torch.equal(qviz.convert_pt2e(variant)(data[1]), copied(data[1]))
