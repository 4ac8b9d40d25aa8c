"""The self-attention encoder (``encoder=transformer``): the transformer's encoder stack over the
embedded source, and a bridge from its states to the recurrent decoder's initial state.

- input: scaled embeddings plus sinusoidal positions, x_i = √E · E[y_i] + PE(i) (Vaswani et al.
  2017; the embedding starts at N(0, 1/E), so both terms are of unit size), then dropout, then a
  learned map to d = ``model.hidden_size`` when the embedding size E differs;
- layers: pre-norm (the norm before each block; a final norm after the last, as in
  ``nn.TransformerEncoderLayer(norm_first=True)`` plus ``nn.TransformerEncoder(norm=...)``):
  x + Dropout(SelfAttention(LN(x))), then x + Dropout(W_2 Dropout(ReLU(W_1 LN(x)))). The
  self-attention is this package's ``multihead`` scorer with queries, keys and values all from x,
  padded positions masked as keys; its weights per layer on demand: ``self_attention_weights``;
- keys: the final states ``(B, T_enc, d)``, zero at padding, as the recurrent encoder's are;
- the decoder's initial state: tanh(W_b · mean of the real states), one ``(L, B, d)`` per decoder
  layer (an LSTM decoder gets its ``(h, c)`` pair from one W_b twice as tall).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnseq.attention import MultiheadAttention, lengths_to_valid_mask
from attnseq.model.state import RNNState


def sinusoidal_positions(length: int, dim: int, dtype: torch.dtype, device: torch.device, start: int = 0) -> Tensor:
    """PE(i, 2j) = sin(i / 10000^(2j/dim)), PE(i, 2j+1) = cos(i / 10000^(2j/dim)): ``(T, dim)``, the
    rows of positions i = ``start`` … ``start + length − 1``."""
    positions = torch.arange(start, start + length, dtype=dtype, device=device)[:, None]  # (T, 1)
    frequencies = torch.exp(
        torch.arange(0, dim, 2, dtype=dtype, device=device) * (-math.log(10000.0) / dim)
    )  # (⌈dim/2⌉,)
    angles = positions * frequencies  # (T, ⌈dim/2⌉)
    table = torch.zeros(length, dim, dtype=dtype, device=device)  # (T, dim)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table


class EmbedsWithPositions:
    """The token embedding both transformer stacks share: x_i = Dropout(√E · E[y_i] + PE(i)), mapped to
    d when the embedding size E differs. The embedding starts at N(0, 1/E) (PE is of unit size too)."""

    def init_embedding(self, vocab_size: int, embedding_dim: int, model_dim: int, dropout: float,
                       padding_idx: int) -> None:
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=padding_idx)
        with torch.no_grad():
            self.embedding.weight.normal_(0.0, embedding_dim**-0.5)
            self.embedding.weight[padding_idx].zero_()
        self.embedding_scale = math.sqrt(embedding_dim)
        self.dropout = nn.Dropout(dropout)
        self.input_map = nn.Linear(embedding_dim, model_dim) if embedding_dim != model_dim else nn.Identity()

    def embed(self, tokens: Tensor, start: int = 0) -> Tensor:
        """Tokens ``(B, T)`` at positions ``start`` … → the first layer's input ``(B, T, d)``."""
        embedded = self.embedding(tokens) * self.embedding_scale  # (B, T, E)
        positions = sinusoidal_positions(tokens.shape[1], embedded.shape[-1], embedded.dtype, embedded.device,
                                         start=start)  # (T, E)
        return self.input_map(self.dropout(embedded + positions))  # (B, T, d)


class SelfAttentionLayer(nn.Module):
    """One pre-norm transformer encoder layer: ``(B, T, d)`` → ``(B, T, d)``."""

    def __init__(self, model_dim: int, heads: int, ff_dim: int, dropout: float) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(model_dim)
        self.self_attention = MultiheadAttention(model_dim, model_dim, heads=heads)
        self.feed_forward_norm = nn.LayerNorm(model_dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(model_dim, ff_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ff_dim, model_dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, states: Tensor, valid_mask: Tensor) -> Tensor:
        return self.attend(states, valid_mask)[0]

    def attend(self, states: Tensor, valid_mask: Tensor) -> tuple[Tensor, Tensor]:
        """The new states and the self-attention weights ``(B, H, T, T)`` (zero at padded keys)."""
        normed = self.attention_norm(states)  # (B, T, d)
        attended, weights = self.self_attention(normed, normed, valid_mask)  # (B, T, d), (B, H, T, T)
        states = states + self.dropout(attended)  # (B, T, d)
        return states + self.dropout(self.feed_forward(self.feed_forward_norm(states))), weights  # (B, T, d)


class TransformerEncoder(EmbedsWithPositions, nn.Module):
    """Source tokens ``(B, T_enc)`` → encoder states ``(B, T_enc, d_k)`` with d_k = ``hidden_size``,
    and the decoder's initial RNN state ``(L, B, d_s)`` (a pair of them for an LSTM decoder)."""

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        layers: int,
        heads: int,
        ff_dim: int,
        dropout: float,
        decoder_cell: str,
        decoder_layers: int,
        padding_idx: int = 0,
    ) -> None:
        super().__init__()
        self.key_dim = hidden_size
        self.decoder_cell = decoder_cell
        self.decoder_layers = decoder_layers
        self.init_embedding(vocab_size, embedding_dim, hidden_size, dropout, padding_idx)
        self.layers = nn.ModuleList(SelfAttentionLayer(hidden_size, heads, ff_dim, dropout) for _ in range(layers))
        self.final_norm = nn.LayerNorm(hidden_size)
        parts = 2 if decoder_cell == "lstm" else 1  # (h, c) for an LSTM decoder
        self.bridge = nn.Linear(hidden_size, parts * decoder_layers * hidden_size)

    def forward(self, src: Tensor, src_lengths: Tensor) -> tuple[Tensor, RNNState]:
        batch, steps = src.shape
        valid = lengths_to_valid_mask(src_lengths, steps)  # (B, T)
        states = self.embed(src)  # (B, T, d)
        for layer in self.layers:
            states = layer(states, valid)  # (B, T, d)
        states = self.final_norm(states).masked_fill(~valid.unsqueeze(-1), 0.0)  # (B, T, d): zero at padding
        mean = states.sum(1) / src_lengths.clamp_min(1).unsqueeze(1).to(states.dtype)  # (B, d)
        initial = torch.tanh(self.bridge(mean))  # (B, parts·L·d)
        initial = initial.view(batch, -1, self.decoder_layers, self.key_dim).permute(1, 2, 0, 3)  # (parts, L, B, d)
        if self.decoder_cell == "lstm":
            return states, (initial[0].contiguous(), initial[1].contiguous())  # (L, B, d) each
        return states, initial[0].contiguous()  # (L, B, d)

    def self_attention_weights(self, src: Tensor, src_lengths: Tensor) -> list[Tensor]:
        """Each layer's self-attention weights ``(B, H, T_enc, T_enc)``, on demand (``forward`` keeps none):
        row i is how position i averages the positions of its source, zero at padded ones."""
        valid = lengths_to_valid_mask(src_lengths, src.shape[1])  # (B, T)
        states, maps = self.embed(src), []  # (B, T, d)
        for layer in self.layers:
            states, weights = layer.attend(states, valid)  # (B, T, d), (B, H, T, T)
            maps.append(weights)
        return maps
