"""The recurrent encoder: embeds the source, runs a (bi)GRU/LSTM over packed sequences, and
bridges its final state to the decoder's initial state."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnseq.kernels import DEFAULT_FAST_PATHS, FastPaths
from attnseq.kernels.cells import layer_parameters
from attnseq.kernels.gru_sequence import gru_sequence
from attnseq.kernels.lstm_sequence import lstm_sequence, lstm_sequence_pays
from attnseq.model.state import RNNState

RNN_CLASSES = {"gru": nn.GRU, "lstm": nn.LSTM}

MOST_LSTM_CALLS = 8
"""The most distinct source lengths in a batch for which a one-layer LSTM runs once per length
(``FastPaths.lstm_by_length``) rather than packed: up to 8 the calls by length were the faster in every
batch measured, from 12 on not always (``benchmarks/lstm_encoder.py``; benchmarks/results.md, "The LSTM
encoder by length"). With length bucketing a batch holds 1–3 lengths; random batches of 64 about 30."""


def build_rnn(
    cell: str, input_size: int, hidden_size: int, layers: int, dropout: float, bidirectional: bool = False
) -> nn.RNNBase:
    """A batch-first ``nn.GRU``/``nn.LSTM``; dropout applies between stacked layers only."""
    return RNN_CLASSES[cell](
        input_size,
        hidden_size,
        num_layers=layers,
        batch_first=True,
        bidirectional=bidirectional,
        dropout=dropout if layers > 1 else 0.0,
    )


class RNNEncoder(nn.Module):
    """Source tokens ``(B, T_enc)`` → encoder states ``(B, T_enc, d_k)`` and the decoder's
    initial RNN state ``(L, B, d_s)`` (a pair of them for LSTM).

    ``d_k = hidden_size`` (unidirectional) or ``2 × hidden_size`` (bidirectional, where a learned
    bridge ``tanh(W_b [h_fwd; h_bwd])`` maps each layer's final pair to the decoder's size).
    Padding never enters the recurrence. A one-layer GRU (uni- or bidirectional) runs over the
    padded batch unpacked — each direction as one call, the backward one over every sequence
    reversed within its own length — and reads each sequence's final state at its last real
    token; that is exactly what packing computes, at about half the cost of a packed sequence's
    backward pass on CPU (whose per-step slices each zero-fill a buffer as large as the whole
    sequence). A one-layer LSTM on CPU runs the same way through torch's own LSTM (whose fused CPU kernel
    a packed sequence never takes), one call per distinct source length in the batch, each from the
    state the previous call ended in, so each sequence's final state and cell are those at its last real
    token (``FastPaths.lstm_by_length``; up to ``MOST_LSTM_CALLS`` lengths) — or through
    ``kernels.lstm_sequence`` (which returns every cell) where that kernel is switched on
    (``FastPaths.lstm_sequence``, off by default) and pays. Otherwise LSTMs, and stacked layers, run
    packed — unless the batch holds no padding at all, when one plain call computes the same. States at
    padded positions are zero either way.
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        cell: str = "gru",
        bidirectional: bool = False,
        layers: int = 1,
        dropout: float = 0.0,
        padding_idx: int = 0,
        fast_paths: FastPaths = DEFAULT_FAST_PATHS,
    ) -> None:
        super().__init__()
        self.fast_paths = fast_paths
        self.cell = cell
        self.bidirectional = bidirectional
        self.layers = layers
        self.hidden_size = hidden_size
        self.key_dim = hidden_size * (2 if bidirectional else 1)
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.rnn = build_rnn(cell, embedding_dim, hidden_size, layers, dropout, bidirectional)
        self.bridge = nn.Linear(2 * hidden_size, hidden_size) if bidirectional else None

    def forward(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, RNNState]:
        embedded = self.dropout(self.embedding(src))  # (B, T_enc, E)
        if self.layers == 1 and (self.cell == "gru" or self._lstm_sequence_pays(embedded)
                                 or self._lstm_by_length(embedded, src_lengths)):
            states, final = self._unpacked(embedded, src_lengths)  # (B, T_enc, d_k), (dirs, B, d) [× 2 for LSTM]
            return states, self._bridge_state(final)
        lengths = src_lengths.cpu()  # packing needs them on the host anyway
        if int(lengths.min()) == src.shape[1]:  # no padding: nothing to pack
            states, final = self.rnn(embedded)  # (B, T_enc, d_k)
            return states, self._bridge_state(final)
        packed = pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
        packed_states, final = self.rnn(packed)
        states, _ = pad_packed_sequence(
            packed_states, batch_first=True, total_length=src.shape[1]
        )  # (B, T_enc, d_k)
        return states, self._bridge_state(final)

    def _bridge_state(self, final: RNNState) -> RNNState:
        if self.cell == "lstm":
            h, c = final
            return self._bridge(h), self._bridge(c)
        return self._bridge(final)

    def _lstm_sequence_pays(self, embedded: Tensor) -> bool:
        if self.cell != "lstm" or not self.fast_paths.lstm_sequence:
            return False
        zeros = embedded.new_zeros(0, self.hidden_size)
        return lstm_sequence_pays(embedded, zeros, zeros, layer_parameters(self.rnn))

    def _lstm_by_length(self, embedded: Tensor, lengths: Tensor) -> bool:
        """On CPU, in float32/float64 outside autocast (where torch's fused LSTM serves), up to ``MOST_LSTM_CALLS``
        distinct lengths."""
        if self.cell != "lstm" or not self.fast_paths.lstm_by_length or embedded.device.type != "cpu":
            return False
        if embedded.dtype not in (torch.float32, torch.float64) or torch.is_autocast_enabled("cpu"):
            return False
        return len(torch.unique(lengths)) <= MOST_LSTM_CALLS

    def _unpacked(self, embedded: Tensor, lengths: Tensor) -> tuple[Tensor, RNNState]:
        """One-layer GRU/LSTM over a right-padded batch, the same states as packing: ``(B, T, d_k)``
        (zeros at padding) and the final state of each direction ``(dirs, B, d)`` (for an LSTM the
        pair of final states and final cells)."""
        steps = embedded.shape[1]
        positions = torch.arange(steps, device=embedded.device)  # (T,)
        valid = positions[None, :] < lengths[:, None]  # (B, T)
        forward, forward_final = self._direction(embedded, lengths, reverse=False)  # (B, T, d), [(B, d)]
        finals, outputs = [forward_final], [forward]
        if self.bidirectional:
            # Position t of row b reads token len_b − 1 − t (t < len_b), so padding comes last again.
            reverse = torch.where(valid, lengths[:, None] - 1 - positions[None, :], positions[None, :])  # (B, T)
            flip = reverse.unsqueeze(-1)  # (B, T, 1)
            reversed_input = embedded.gather(1, flip.expand_as(embedded))  # (B, T, E)
            backward, backward_final = self._direction(reversed_input, lengths, reverse=True)  # in reversed order
            finals.append(backward_final)
            outputs.append(backward.gather(1, flip.expand_as(backward)))  # (B, T, d), back in order
        states = torch.cat(outputs, dim=-1) if len(outputs) > 1 else outputs[0]  # (B, T, d_k)
        states = states.masked_fill(~valid.unsqueeze(-1), 0.0)  # (B, T, d_k): padding's states are zero
        final = [torch.stack(kind) for kind in zip(*finals, strict=True)]  # (dirs, B, d) each
        return states, (final[0] if self.cell == "gru" else tuple(final))

    def _direction(self, inputs: Tensor, lengths: Tensor, reverse: bool) -> tuple[Tensor, list[Tensor]]:
        """One direction of the one-layer RNN over right-padded ``inputs (B, T, E)``, from a zero state: the
        states ``(B, T, d)`` (past a sequence's end, not its own) and each sequence's final state at its last
        real token ``(B, d)`` (an LSTM's final state and final cell)."""
        batch = inputs.shape[0]
        h0 = inputs.new_zeros(batch, self.hidden_size)  # (B, d)
        weights = layer_parameters(self.rnn, reverse=reverse)
        if self.cell == "lstm" and not self._lstm_sequence_pays(inputs):
            return lstm_by_length(inputs, lengths, weights, self.training)
        if self.cell == "lstm":
            sequences = lstm_sequence(inputs, h0, torch.zeros_like(h0), weights)  # (B, T, d) × 2: states, cells
        else:
            sequences = (gru_sequence(inputs, h0, weights, self.fast_paths.gru_sequence),)  # (B, T, d)
        last = (lengths - 1).view(batch, 1, 1).expand(batch, 1, self.hidden_size)  # (B, 1, d): the last real token
        return sequences[0], [sequence.gather(1, last).squeeze(1) for sequence in sequences]  # (B, T, d), (B, d) each

    def _bridge(self, final: Tensor) -> Tensor:
        """``(L·dirs, B, d)`` → ``(L, B, hidden)``: the decoder's initial state per layer."""
        if self.bridge is None:
            return final  # (L, B, d_s)
        _, batch, hidden = final.shape
        pairs = final.view(self.layers, 2, batch, hidden)  # (L, 2, B, d)
        both = torch.cat([pairs[:, 0], pairs[:, 1]], dim=-1)  # (L, B, 2d)
        return torch.tanh(self.bridge(both))  # (L, B, d_s)


def lstm_by_length(
    inputs: Tensor, lengths: Tensor, weights: tuple[Tensor, Tensor, Tensor, Tensor], training: bool
) -> tuple[Tensor, list[Tensor]]:
    """A one-layer, one-direction LSTM (``torch.lstm``, the op ``nn.LSTM`` runs) over right-padded ``inputs
    (B, T, E)`` from a zero state, one call per distinct length in ``lengths (B,)``, each call starting from the
    state the previous one ended in: the states ``(B, T, d)`` (past a sequence's end, not its own) and each
    sequence's final state and cell at its last real token ``(B, d)`` — what packing computes, without packing."""
    batch, hidden = inputs.shape[0], weights[1].shape[1]
    bounds = torch.unique(lengths).tolist()  # ascending; the last is T where the batch is as long as its longest
    state = (inputs.new_zeros(1, batch, hidden), inputs.new_zeros(1, batch, hidden))  # (1, B, d) each: h_0, c_0
    outputs, ends, start = [], [], 0
    for stop in bounds:
        output, h, c = torch.lstm(
            inputs[:, start:stop], state, list(weights), True, 1, 0.0, training, False, True
        )  # (B, stop − start, d), (1, B, d) × 2
        state = (h, c)
        outputs.append(output)
        ends.append(torch.cat([h, c]))  # (2, B, d): the state and cell after step ``stop``
        start = stop
    states = torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]  # (B, T', d), T' = the longest length
    if states.shape[1] < inputs.shape[1]:  # the batch is padded past its longest sequence
        states = torch.cat([states, states.new_zeros(batch, inputs.shape[1] - states.shape[1], hidden)], dim=1)
    if len(ends) == 1:
        return states, list(ends[0])  # (B, T, d), [(B, d), (B, d)]
    which = torch.searchsorted(lengths.new_tensor(bounds), lengths)  # (B,): the call that ends each sequence
    final = torch.stack(ends)[which, :, torch.arange(batch, device=inputs.device)]  # (B, 2, d)
    return states, [final[:, 0], final[:, 1]]  # (B, d) each
