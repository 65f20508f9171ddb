"""QuantLSTM: torch.nn.LSTM's results with quantizers off, a cell-by-cell hand computation on.

The hand computation runs ``torch.nn.LSTMCell`` (torch's fused cell, not qviz's Python loop) on
inputs, hidden states and weights fake-quantized with ``fake_tensor_quant``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from qviz.engine import quant_nn
from qviz.engine.tensor.tensor_quant import QuantDescriptor, TensorQuantizer, fake_tensor_quant
from qviz.errors import ConfigError

CONFIGS = [
    {},
    {"num_layers": 2, "bidirectional": True, "batch_first": True},
    {"num_layers": 3, "bias": False},
    {"num_layers": 2, "dropout": 0.3},  # eval mode: no dropout
]


def _pair(**kwargs) -> tuple[nn.LSTM, quant_nn.QuantLSTM]:
    ref = nn.LSTM(3, 4, **kwargs).eval()
    lstm = quant_nn.QuantLSTM(3, 4, **kwargs).eval()
    lstm.load_state_dict(ref.state_dict(), strict=True)
    return ref, lstm


def _disable(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, TensorQuantizer):
            m.disable()


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=0)


def _assert_lstm_close(ours, theirs) -> None:
    (out, (h, c)), (ref_out, (ref_h, ref_c)) = ours, theirs
    assert _close(out, ref_out) and _close(h, ref_h) and _close(c, ref_c)


# -- quantizers off: torch.nn.LSTM ---------------------------------------------------------------
@pytest.mark.parametrize("with_hx", [False, True], ids=["zeros", "hx"])
@pytest.mark.parametrize("kwargs", CONFIGS, ids=str)
def test_disabled_quantizers_give_torch_lstm(kwargs, with_hx):
    ref, lstm = _pair(**kwargs)
    assert lstm.state_dict().keys() == ref.state_dict().keys()
    _disable(lstm)
    x = torch.randn(2, 5, 3) if kwargs.get("batch_first") else torch.randn(5, 2, 3)
    cells = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    hx = (torch.randn(cells, 2, 4), torch.randn(cells, 2, 4)) if with_hx else None
    _assert_lstm_close(lstm(x, hx), ref(x, hx))


def test_unbatched_input():
    ref, lstm = _pair(num_layers=2, bidirectional=True, batch_first=True)
    _disable(lstm)
    x, hx = torch.randn(6, 3), (torch.randn(4, 4), torch.randn(4, 4))
    _assert_lstm_close(lstm(x, hx), ref(x, hx))
    _assert_lstm_close(lstm(x), ref(x))


@pytest.mark.parametrize("batch_first", [False, True])
def test_packed_sequences(batch_first):
    ref, lstm = _pair(num_layers=2, bidirectional=True, batch_first=batch_first)
    _disable(lstm)
    x = torch.randn(3, 5, 3) if batch_first else torch.randn(5, 3, 3)
    packed = pack_padded_sequence(
        x, torch.tensor([2, 5, 3]), batch_first=batch_first, enforce_sorted=False
    )
    hx = (torch.randn(4, 3, 4), torch.randn(4, 3, 4))
    (out, (h, c)), (ref_out, (ref_h, ref_c)) = lstm(packed, hx), ref(packed, hx)
    assert torch.equal(out.batch_sizes, ref_out.batch_sizes)
    assert torch.equal(out.unsorted_indices, ref_out.unsorted_indices)
    assert _close(out.data, ref_out.data) and _close(h, ref_h) and _close(c, ref_c)
    padded, lengths = pad_packed_sequence(out, batch_first=batch_first)
    assert lengths.tolist() == [2, 5, 3] and padded.shape[-1] == 8


def test_dropout_only_in_train_mode():
    ref, lstm = _pair(num_layers=2, dropout=1.0)  # p=1 zeroes layer 1's input: deterministic
    _disable(lstm)
    x = torch.randn(4, 2, 3)
    ref.train()
    lstm.train()
    _assert_lstm_close(lstm(x), ref(x))
    ref.eval()
    lstm.eval()
    _assert_lstm_close(lstm(x), ref(x))
    half = quant_nn.QuantLSTM(3, 4, num_layers=2, dropout=0.5).train()
    assert not torch.equal(half(x)[0], half(x)[0])
    half.eval()
    assert torch.equal(half(x)[0], half(x)[0])


# -- quantizers on: torch's LSTMCell on fake-quantized operands ----------------------------------
def _fq(t: torch.Tensor, amax: torch.Tensor | None) -> torch.Tensor:
    return fake_tensor_quant(t, t.abs().amax() if amax is None else amax, 8, narrow_range=False)


def _by_hand(lstm: quant_nn.QuantLSTM, x: torch.Tensor, in_amax, w_amax) -> torch.Tensor:
    """(seq, batch, features) through every layer and direction with nn.LSTMCell."""
    directions = 2 if lstm.bidirectional else 1
    for layer in range(lstm.num_layers):
        outputs = []
        for d in range(directions):
            sfx = f"_l{layer}{'_reverse' if d else ''}"
            cell = nn.LSTMCell(x.size(-1), lstm.hidden_size, bias=lstm.bias)
            with torch.no_grad():
                cell.weight_ih.copy_(_fq(getattr(lstm, f"weight_ih{sfx}"), w_amax))
                cell.weight_hh.copy_(_fq(getattr(lstm, f"weight_hh{sfx}"), w_amax))
                if lstm.bias:
                    cell.bias_ih.copy_(getattr(lstm, f"bias_ih{sfx}"))
                    cell.bias_hh.copy_(getattr(lstm, f"bias_hh{sfx}"))
            h = c = torch.zeros(x.size(1), lstm.hidden_size)
            out = [h] * x.size(0)
            for t in reversed(range(x.size(0))) if d else range(x.size(0)):
                h, c = cell(_fq(x[t], in_amax), (_fq(h, in_amax), c))
                out[t] = h
            outputs.append(torch.stack(out))
        x = torch.cat(outputs, dim=-1)
    return x


@pytest.mark.parametrize("loaded", [False, True], ids=["dynamic", "loaded-amax"])
def test_quantized_lstm_equals_cells_on_fake_quantized_operands(loaded):
    _, lstm = _pair(num_layers=2, bidirectional=True)
    x = torch.randn(5, 2, 3)
    in_amax = w_amax = None
    if loaded:
        in_amax, w_amax = torch.tensor(0.7), torch.tensor(0.3)
        for q in lstm.input_quantizers:
            q.amax = in_amax
        for q in lstm.weight_quantizers:
            q.amax = w_amax
    out, _ = lstm(x)
    expected = _by_hand(lstm, x, in_amax, w_amax)
    assert _close(out, expected)
    _disable(lstm)
    assert not _close(lstm(x)[0], expected)  # the quantization is visible


def test_straight_through_gradients():
    _, lstm = _pair()
    x = torch.randn(4, 2, 3, requires_grad=True)
    lstm.input_quantizer.amax = 1.0
    lstm.weight_quantizer.amax = 0.3
    lstm(x)[0].sum().backward()
    clipped = x.detach().abs() > 1.0
    assert bool(clipped.any()) and bool((x.grad[clipped] == 0).all())
    assert bool((x.grad[~clipped] != 0).all())
    w_clipped = lstm.weight_ih_l0.detach().abs() > 0.3
    assert bool(w_clipped.any()) and bool((lstm.weight_ih_l0.grad[w_clipped] == 0).all())
    assert bool((lstm.weight_hh_l0.grad != 0).any()) and lstm.bias_ih_l0.grad is not None


# -- calibration and state_dict ------------------------------------------------------------------
def _calibrate(lstm: nn.Module, x: torch.Tensor) -> None:
    quantizers = [m for m in lstm.modules() if isinstance(m, TensorQuantizer)]
    for q in quantizers:
        q.disable_quant()
        q.enable_calib()
    lstm(x)
    for q in quantizers:
        q.load_calib_amax()
        q.disable_calib()
        q.enable_quant()


def test_calibration_sees_inputs_hidden_states_and_both_weights():
    ref, lstm = _pair(bidirectional=True)
    x = torch.randn(5, 2, 3) * 0.05  # small: the hidden states set the input quantizers' amax
    _calibrate(lstm, x)
    out, _ = ref(x)
    forward_h, reverse_h = out[..., :4], out[..., 4:]  # the states each direction fed back
    assert forward_h[:-1].abs().amax() > x.abs().amax() < reverse_h[1:].abs().amax()
    expected_in = [
        torch.maximum(x.abs().amax(), forward_h[:-1].abs().amax()),
        torch.maximum(x.abs().amax(), reverse_h[1:].abs().amax()),
    ]
    for q, sfx in zip(lstm.weight_quantizers, ("_l0", "_l0_reverse"), strict=True):
        w = torch.cat([getattr(ref, f"weight_ih{sfx}"), getattr(ref, f"weight_hh{sfx}")], dim=1)
        assert torch.equal(q.amax, w.detach().abs().amax())
    for q, want in zip(lstm.input_quantizers, expected_in, strict=True):
        assert torch.allclose(q.amax, want, atol=1e-6, rtol=0)


def test_calibrated_checkpoint_round_trip():
    ref, lstm = _pair(num_layers=2)
    x = torch.randn(5, 2, 3)
    _calibrate(lstm, x)
    state = lstm.state_dict()
    amax_keys = {f"_{kind}_quantizers.{i}._amax" for kind in ("input", "weight") for i in (0, 1)}
    assert set(state) == set(ref.state_dict()) | amax_keys
    fresh = quant_nn.QuantLSTM(3, 4, num_layers=2).eval()
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(fresh(x)[0], lstm(x)[0])


# -- from_float ----------------------------------------------------------------------------------
def test_from_float_keeps_settings_and_shares_nothing():
    ref = nn.LSTM(3, 4, num_layers=2, bias=False, batch_first=True, bidirectional=True).train()
    ref.dropout = 0.25
    lstm = quant_nn.QuantLSTM.from_float(ref, quant_desc_weight=QuantDescriptor(axis=0))
    assert type(lstm) is quant_nn.QuantLSTM and lstm.training
    assert nn.LSTM.extra_repr(lstm) == ref.extra_repr()
    assert lstm.weight_quantizers[3].axis == (0,)
    _disable(lstm)
    ref.eval()
    lstm.eval()
    x = torch.randn(2, 5, 3)
    _assert_lstm_close(lstm(x), ref(x))
    before = ref.weight_ih_l0.detach().clone()
    with torch.no_grad():
        lstm.weight_ih_l0.add_(1.0)
    assert torch.equal(ref.weight_ih_l0, before)


def test_projections_are_refused():
    with pytest.raises(ConfigError, match=r"proj_size=2.*keep this LSTM float"):
        quant_nn.QuantLSTM(3, 4, proj_size=2)
    with pytest.raises(ConfigError, match="proj_size"):
        quant_nn.QuantLSTM.from_float(nn.LSTM(3, 4, proj_size=2))


# -- quantizer access and errors -----------------------------------------------------------------
def test_quantizer_access():
    single = quant_nn.QuantLSTM(3, 4)
    assert single.input_quantizer is single._input_quantizers[0]
    assert single.weight_quantizer is single._weight_quantizers[0]
    deep = quant_nn.QuantLSTM(3, 4, num_layers=2, bidirectional=True)
    with pytest.raises(ConfigError, match=r"input_quantizer is ambiguous with 4 cells"):
        _ = deep.input_quantizer
    assert deep.cell_quantizers(1, reverse=True) == (
        deep.input_quantizers[3],
        deep.weight_quantizers[3],
    )
    with pytest.raises(ConfigError, match=r"layers 0\.\.1"):
        deep.cell_quantizers(2)
    with pytest.raises(ConfigError, match="forward only"):
        single.cell_quantizers(0, reverse=True)
    with pytest.raises(ConfigError, match="assign into the ModuleList"):
        single.input_quantizer = TensorQuantizer()
    names = [n for n, m in deep.named_modules() if isinstance(m, TensorQuantizer)]
    assert names[:2] == ["_input_quantizers.0", "_input_quantizers.1"]


def test_bad_inputs_get_clear_errors():
    lstm = quant_nn.QuantLSTM(3, 4, num_layers=2)
    with pytest.raises(ConfigError, match=r"input_size=3 but the input has 5 features"):
        lstm(torch.randn(4, 2, 5))
    with pytest.raises(ConfigError, match="unbatched"):
        lstm(torch.randn(3))
    with pytest.raises(ConfigError, match=r"hx must be a tuple \(h0, c0\).*\(2, 2, 4\)"):
        lstm(torch.randn(4, 2, 3), (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)))
    with pytest.raises(ConfigError, match=r"shape \(2, 4\)"):
        lstm(torch.randn(4, 3), (torch.zeros(2, 1, 4), torch.zeros(2, 1, 4)))
    with pytest.raises(ConfigError, match="empty sequence"):
        lstm(torch.randn(0, 2, 3))
    with pytest.raises(ConfigError, match="QuantLSTM: quant_desc_input must be"):
        quant_nn.QuantLSTM(3, 4, quant_desc_input=8)
    with pytest.raises(ConfigError, match=r"keeps axis \(3,\)"):
        quant_nn.QuantLSTM(3, 4, quant_desc_weight=QuantDescriptor(axis=3))
