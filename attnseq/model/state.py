"""What passes between decoder steps, as explicit values: nothing is kept on a module."""

from __future__ import annotations

from typing import NamedTuple, Union

from torch import Tensor

RNNState = Union[Tensor, tuple[Tensor, Tensor]]
"""A GRU's hidden state ``(L, B, d_s)``, or an LSTM's ``(h, c)`` pair of them."""


class Memory(NamedTuple):
    """The encoder's output as the decoder reads it."""

    keys: Tensor  # (B, T_enc, d_k): encoder states, also the values
    valid_mask: Tensor  # (B, T_enc) bool, True at real source tokens
    projected_keys: Tensor | None  # (B, H, T_enc, d_p), projected once per batch; None without attention


class DecoderState(NamedTuple):
    """The recurrent state, plus Luong's input feed h̃_{t-1} when input feeding is on, the index of
    the target token the next step produces (what local-m attention centres its window on), and a
    Transformer decoder's key/value cache of the prefix so far."""

    rnn: RNNState
    feed: Tensor | None = None  # (B, d_s)
    step: int = 0  # t: every entry of a batch (and every beam) is at the same step
    cache: Tensor | None = None  # (B, N, H, t, 2 · d_h): per layer, the self-attention's keys and values of y_<t


def top_layer(rnn_state: RNNState) -> Tensor:
    """The top layer's hidden state ``(B, d_s)``: what queries the encoder."""
    hidden = rnn_state[0] if isinstance(rnn_state, tuple) else rnn_state
    return hidden[-1]  # (B, d_s)


def select_state(state: DecoderState, index: Tensor) -> DecoderState:
    """Reorder/select batch entries ``index`` (used by beam search and early stopping)."""
    rnn = state.rnn
    if isinstance(rnn, tuple):
        rnn = tuple(part.index_select(1, index) for part in rnn)
    else:
        rnn = rnn.index_select(1, index)
    feed = None if state.feed is None else state.feed.index_select(0, index)
    cache = None if state.cache is None else state.cache.index_select(0, index)
    return DecoderState(rnn, feed, state.step, cache)


def select_memory(memory: Memory, index: Tensor) -> Memory:
    """Reorder/select batch entries ``index`` of the encoder memory."""
    projected = None if memory.projected_keys is None else memory.projected_keys.index_select(0, index)
    return Memory(memory.keys.index_select(0, index), memory.valid_mask.index_select(0, index), projected)
