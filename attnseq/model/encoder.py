"""The recurrent encoder: embeds the source, runs a (bi)GRU/LSTM over packed sequences, and
bridges its final state to the decoder's initial state."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnseq.model.state import RNNState

RNN_CLASSES = {"gru": nn.GRU, "lstm": nn.LSTM}


class RNNEncoder(nn.Module):
    """Source tokens ``(B, T_enc)`` → encoder states ``(B, T_enc, d_k)`` and the decoder's
    initial RNN state ``(L, B, d_s)`` (a pair of them for LSTM).

    ``d_k = hidden_size`` (unidirectional) or ``2 × hidden_size`` (bidirectional, where a learned
    bridge ``tanh(W_b [h_fwd; h_bwd])`` maps each layer's final pair to the decoder's size).
    Padded batches are packed, so padding never enters the recurrence.
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
    ) -> None:
        super().__init__()
        self.cell = cell
        self.bidirectional = bidirectional
        self.layers = layers
        self.hidden_size = hidden_size
        self.key_dim = hidden_size * (2 if bidirectional else 1)
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.rnn = RNN_CLASSES[cell](
            embedding_dim,
            hidden_size,
            num_layers=layers,
            batch_first=True,
            bidirectional=bidirectional,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.bridge = nn.Linear(2 * hidden_size, hidden_size) if bidirectional else None

    def forward(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, RNNState]:
        embedded = self.dropout(self.embedding(src))  # (B, T_enc, E)
        packed = pack_padded_sequence(
            embedded, src_lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        packed_states, final = self.rnn(packed)
        states, _ = pad_packed_sequence(
            packed_states, batch_first=True, total_length=src.shape[1]
        )  # (B, T_enc, d_k)
        if self.cell == "lstm":
            h, c = final
            return states, (self._bridge(h), self._bridge(c))
        return states, self._bridge(final)

    def _bridge(self, final: Tensor) -> Tensor:
        """``(L·dirs, B, d)`` → ``(L, B, hidden)``: the decoder's initial state per layer."""
        if self.bridge is None:
            return final  # (L, B, d_s)
        _, batch, hidden = final.shape
        pairs = final.view(self.layers, 2, batch, hidden)  # (L, 2, B, d)
        both = torch.cat([pairs[:, 0], pairs[:, 1]], dim=-1)  # (L, B, 2d)
        return torch.tanh(self.bridge(both))  # (L, B, d_s)
