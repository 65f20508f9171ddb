"""QuantLSTM: ``torch.nn.LSTM`` run step by step in Python with fake-quantized matmul operands.

Each cell (one layer in one direction) has one input quantizer and one weight quantizer, as in
NVIDIA's quant_rnn. At every time step the cell computes

    gates = linear(iq(x_t), wq(W_ih), b_ih) + linear(iq(h_{t-1}), wq(W_hh), b_hh)
    i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of the four chunks of gates
    c_t = f * c_{t-1} + i * g;   h_t = o * tanh(c_t)

so the input quantizer ``iq`` quantizes both matmul inputs (the layer input and the hidden state:
calibration sees both, per step) and the weight quantizer ``wq`` quantizes ``weight_ih`` and
``weight_hh`` once per forward (calibration sees both). The cell state ``c`` and the biases stay
float: they never enter a matmul. Weights default to one amax per tensor, as NVIDIA's toolkit.

The quantizers live in ``nn.ModuleList``s ``_input_quantizers`` and ``_weight_quantizers``,
indexed ``layer * num_directions + direction`` (torch's own order of cells and of ``h_n``);
``cell_quantizers(layer, reverse)`` picks a cell's pair. ``input_quantizer`` /
``weight_quantizer`` exist only where they are unambiguous (one layer, one direction) and raise
a ConfigError naming the lists otherwise.

Supported as in ``torch.nn.LSTM``: ``num_layers``, ``bidirectional``, ``batch_first``, ``bias``,
``dropout`` (between layers, train mode only), unbatched 2-D input, ``(h0, c0)`` and
``PackedSequence`` input (each step runs on the sequences still active, so padding never enters
the recurrence). ``proj_size > 0`` is refused with a ConfigError: its projection would need a
third quantized matmul that NVIDIA's design does not describe; keep such an LSTM float.

Example:
    >>> import torch
    >>> lstm = QuantLSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True)
    >>> out, (h, c) = lstm(torch.randn(2, 5, 3))
    >>> out.shape, h.shape, len(lstm._input_quantizers)
    (torch.Size([2, 5, 8]), torch.Size([4, 2, 4]), 4)
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from qviz.engine.tensor.descriptor import QUANT_DESC_8BIT_PER_TENSOR, QuantDescriptor
from qviz.engine.tensor.quant_nn.mixin import QuantMixin
from qviz.engine.tensor.tensor_quantizer import TensorQuantizer
from qviz.errors import ConfigError

_State = tuple[torch.Tensor, torch.Tensor]


def _lstm_cell(
    x: torch.Tensor,
    h: torch.Tensor,
    c: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
) -> _State:
    w_ih, w_hh, b_ih, b_hh = weights
    gates = F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


class QuantLSTM(QuantMixin, nn.LSTM):
    """``torch.nn.LSTM`` with fake-quantized inputs, hidden states and weights in every cell.

    Its parameters and ``state_dict`` are exactly ``torch.nn.LSTM``'s (plus each quantizer's
    ``_amax`` once calibrated); with every quantizer disabled it computes what ``nn.LSTM``
    computes. See the module docstring for what is quantized and what is refused.

    Args:
        *args, **kwargs: those of ``torch.nn.LSTM`` (``proj_size`` must be 0).
        quant_desc_input: descriptor of every cell's input quantizer; default per tensor.
        quant_desc_weight: descriptor of every cell's weight quantizer; default per tensor.

    Raises:
        ConfigError: ``proj_size > 0``, or a descriptor that is not a QuantDescriptor.

    Example:
        >>> import torch
        >>> lstm = QuantLSTM(3, 4)
        >>> out, (h, c) = lstm(torch.randn(5, 3))  # unbatched: (seq, features)
        >>> out.shape, h.shape
        (torch.Size([5, 4]), torch.Size([1, 4]))
        >>> lstm.input_quantizer is lstm.cell_quantizers(0)[0]
        True
    """

    default_quant_desc_input: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight: ClassVar[QuantDescriptor] = QUANT_DESC_8BIT_PER_TENSOR
    _float_module = nn.LSTM
    _init_args = (
        "input_size",
        "hidden_size",
        "num_layers",
        "bias",
        "batch_first",
        "dropout",
        "bidirectional",
        "proj_size",
    )
    _quantizer_aliases: ClassVar[dict[str, str | None]] = dict.fromkeys(
        ("input_quantizer", "weight_quantizer", "input_quantizers", "weight_quantizers")
    )

    # -- quantizers -----------------------------------------------------------------------------
    @property
    def _num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _init_input_quantizers(self, desc: QuantDescriptor) -> None:
        if self.proj_size > 0:
            raise ConfigError(
                f"QuantLSTM does not quantize LSTMs with projections (proj_size="
                f"{self.proj_size}): keep this LSTM float (leave it out of the quantized "
                f"layers), or use proj_size=0"
            )
        cells = self.num_layers * self._num_directions
        self._input_quantizers = nn.ModuleList(TensorQuantizer(desc) for _ in range(cells))

    def _init_weight_quantizers(self, desc: QuantDescriptor) -> None:
        self._check_weight_axis(desc, self.weight_ih_l0)
        cells = self.num_layers * self._num_directions
        self._weight_quantizers = nn.ModuleList(TensorQuantizer(desc) for _ in range(cells))

    @property
    def input_quantizers(self) -> nn.ModuleList:
        """Every cell's input quantizer, indexed ``layer * num_directions + direction``."""
        return self._input_quantizers

    @property
    def weight_quantizers(self) -> nn.ModuleList:
        """Every cell's weight quantizer, indexed ``layer * num_directions + direction``."""
        return self._weight_quantizers

    def cell_quantizers(self, layer: int, reverse: bool = False) -> tuple[TensorQuantizer, ...]:
        """``(input quantizer, weight quantizer)`` of one layer in one direction.

        Raises:
            ConfigError: no such layer, or ``reverse`` on a unidirectional LSTM.
        """
        if not 0 <= layer < self.num_layers or (reverse and not self.bidirectional):
            raise ConfigError(
                f"QuantLSTM has layers 0..{self.num_layers - 1}"
                f"{' in both directions' if self.bidirectional else ', forward only'}; got "
                f"layer={layer}, reverse={reverse}"
            )
        index = layer * self._num_directions + int(reverse)
        return self._input_quantizers[index], self._weight_quantizers[index]

    def _single(self, kind: str) -> TensorQuantizer:
        quantizers = getattr(self, f"_{kind}_quantizers")
        if len(quantizers) != 1:
            raise ConfigError(
                f"QuantLSTM.{kind}_quantizer is ambiguous with {len(quantizers)} cells "
                f"(num_layers={self.num_layers}, bidirectional={self.bidirectional}): use "
                f"{kind}_quantizers[layer * num_directions + direction] or "
                f"cell_quantizers(layer, reverse)"
            )
        return quantizers[0]

    @property
    def input_quantizer(self) -> TensorQuantizer:
        """The input quantizer of a one-layer unidirectional LSTM (ConfigError otherwise)."""
        return self._single("input")

    @property
    def weight_quantizer(self) -> TensorQuantizer:
        """The weight quantizer of a one-layer unidirectional LSTM (ConfigError otherwise)."""
        return self._single("weight")

    # -- forward --------------------------------------------------------------------------------
    def forward(
        self, input: torch.Tensor | PackedSequence, hx: _State | None = None
    ) -> tuple[torch.Tensor | PackedSequence, _State]:
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        if not isinstance(input, torch.Tensor) or input.dim() not in (2, 3):
            raise ConfigError(
                f"QuantLSTM input must be a (seq, batch, features) tensor ((batch, seq, "
                f"features) with batch_first), an unbatched (seq, features) tensor or a "
                f"PackedSequence; got {getattr(input, 'shape', type(input).__name__)}"
            )
        batched = input.dim() == 3
        x = input.unsqueeze(1) if not batched else input
        x = x.transpose(0, 1) if batched and self.batch_first else x
        self._check_features(x)
        h0, c0 = self._initial_state(hx, x.size(1), x, batched)
        outputs, (h_n, c_n) = self._run_layers(list(x.unbind(0)), h0, c0)
        out = torch.stack(outputs)
        if not batched:
            return out.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        return (out.transpose(0, 1) if self.batch_first else out), (h_n, c_n)

    def _forward_packed(
        self, input: PackedSequence, hx: _State | None
    ) -> tuple[PackedSequence, _State]:
        data, batch_sizes, sorted_indices, unsorted_indices = input
        self._check_features(data)
        steps = list(data.split(batch_sizes.tolist()))
        h0, c0 = self._initial_state(hx, int(batch_sizes[0]), data, batched=True)
        if hx is not None and sorted_indices is not None:
            h0, c0 = h0.index_select(1, sorted_indices), c0.index_select(1, sorted_indices)
        outputs, (h_n, c_n) = self._run_layers(steps, h0, c0)
        if unsorted_indices is not None:
            h_n, c_n = h_n.index_select(1, unsorted_indices), c_n.index_select(1, unsorted_indices)
        packed = PackedSequence(torch.cat(outputs), batch_sizes, sorted_indices, unsorted_indices)
        return packed, (h_n, c_n)

    def _check_features(self, x: torch.Tensor) -> None:
        if x.size(-1) != self.input_size:
            raise ConfigError(
                f"QuantLSTM was built for input_size={self.input_size} but the input has "
                f"{x.size(-1)} features (shape {tuple(x.shape)})"
            )
        if x.size(0) == 0:
            raise ConfigError("QuantLSTM got an empty sequence: give at least one time step")

    def _initial_state(
        self, hx: _State | None, batch: int, ref: torch.Tensor, batched: bool
    ) -> _State:
        shape = (self.num_layers * self._num_directions, batch, self.hidden_size)
        if hx is None:
            zeros = torch.zeros(shape, dtype=ref.dtype, device=ref.device)
            return zeros, zeros
        want = shape if batched else (shape[0], shape[2])
        if not (
            isinstance(hx, tuple | list)
            and len(hx) == 2
            and all(isinstance(t, torch.Tensor) and tuple(t.shape) == want for t in hx)
        ):
            got = [tuple(t.shape) if isinstance(t, torch.Tensor) else t for t in hx or ()]
            raise ConfigError(
                f"QuantLSTM hx must be a tuple (h0, c0) of tensors of shape {want} "
                f"(num_layers * num_directions, {'batch, ' if batched else ''}hidden_size), "
                f"got {got}"
            )
        h0, c0 = hx
        return (h0, c0) if batched else (h0.unsqueeze(1), c0.unsqueeze(1))

    def _run_layers(
        self, steps: list[torch.Tensor], h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[list[torch.Tensor], _State]:
        """All layers over per-step inputs (batch rows shrinking with the step when packed)."""
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            if layer > 0 and self.dropout > 0 and self.training:
                steps = [F.dropout(s, self.dropout, training=True) for s in steps]
            per_direction = []
            for direction in range(self._num_directions):
                index = layer * self._num_directions + direction
                outputs, (h, c) = self._run_cell(steps, h0[index], c0[index], layer, direction)
                per_direction.append(outputs)
                h_n.append(h)
                c_n.append(c)
            steps = (
                per_direction[0]
                if len(per_direction) == 1
                else [torch.cat(pair, dim=-1) for pair in zip(*per_direction, strict=True)]
            )
        return steps, (torch.stack(h_n), torch.stack(c_n))

    def _run_cell(
        self,
        steps: list[torch.Tensor],
        h: torch.Tensor,
        c: torch.Tensor,
        layer: int,
        direction: int,
    ) -> tuple[list[torch.Tensor], _State]:
        """One layer in one direction; rows past a step's batch size keep their state."""
        iq, wq = self.cell_quantizers(layer, reverse=bool(direction))
        suffix = f"_l{layer}{'_reverse' if direction else ''}"
        weights = (
            wq(getattr(self, f"weight_ih{suffix}")),
            wq(getattr(self, f"weight_hh{suffix}")),
            getattr(self, f"bias_ih{suffix}") if self.bias else None,
            getattr(self, f"bias_hh{suffix}") if self.bias else None,
        )
        order = range(len(steps) - 1, -1, -1) if direction else range(len(steps))
        outputs: list[torch.Tensor] = [h] * len(steps)
        for t in order:
            n = steps[t].size(0)
            h_t, c_t = _lstm_cell(iq(steps[t]), iq(h[:n]), c[:n], weights)
            outputs[t] = h_t
            if n == h.size(0):
                h, c = h_t, c_t
            else:  # packed input: the sequences that ended (or have not begun) keep their state
                h, c = torch.cat((h_t, h[n:])), torch.cat((c_t, c[n:]))
        return outputs, (h, c)
