"""Decoders, named by *when* they query the encoder — separately from *how* they score.

- ``bahdanau``: query = s_{t-1}, the state before the step; the context enters the RNN input
  with the previous token's embedding; the readout sees [s_t; c_t; E y_{t-1}].
- ``luong``: query = s_t, the state after the step; attentional state h̃_t = tanh(W_c [c_t; s_t]);
  optional input feeding passes h̃_{t-1} into the next step's input. Without input feeding,
  teacher forcing runs the RNN over the whole target and attends over all steps in one call.
- ``PlainDecoder`` (scorer ``none``): no attention; the decoder sees only the encoder's final
  state — the fixed-vector baseline.

Every decoder offers ``step`` (one token, used by greedy/beam decoding) and ``forward`` (teacher
forcing over a whole target, optionally scheduled: each step feeds the gold token with
probability ``teacher_forcing``, else the model's own previous argmax).

**The fused teacher-forced path.** Where the recurrence cannot run as one RNN call (Bahdanau;
Luong with input feeding), full teacher forcing takes ``forward_fused``: the maths of ``step``
over the whole target (the tests hold the two equal, values and gradients), arranged so that each
step does few, large operations. Before the loop: the embeddings and their share of the RNN's
input gates for all steps, in one matmul. Per step: one matmul of the state for everything that
reads it (the hidden gates, the scorer's query map W_a, Luong's W_c half), the scores, the
context, and the cell written out on the RNN's own parameters (``cells.py``). After the loop: the
readout over all steps. A GRU decoder with additive or concat attention goes further, through
``fused.AdditiveGRURecurrence``: one autograd node with a hand-written backward pass. The fused
path serves one-layer GRU/LSTM decoders whose attention is one of ``attnseq.attention``'s scorers
without hooks; anything else (several layers, a wrapped or hooked attention such as the
counterfactual one, scheduled sampling) runs ``step`` by step.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from attnseq.attention import AdditiveAttention, Attention, masked_softmax
from attnseq.attention.scorers import fast_tanh
from attnseq.kernels import ALL_FAST_PATHS, FastPaths
from attnseq.model.cells import gru_cell, layer_parameters, lstm_cell
from attnseq.model.fused import AdditiveGRURecurrence
from attnseq.model.gru_sequence import gru_sequence
from attnseq.model.encoder import RNN_CLASSES
from attnseq.model.state import DecoderState, Memory, RNNState, top_layer

StepOutput = tuple[Tensor, Tensor | None, DecoderState]
"""logits ``(B, V)``, attention weights ``(B, H, T_enc)`` (None without attention), new state."""


class Decoder(nn.Module):
    """Shared machinery: embedding, RNN, the teacher-forced loop and scheduled sampling."""

    attention: Attention | None
    parallel_teacher_forcing: bool = False
    """True where the maths lets teacher forcing run the RNN over all steps in one call."""

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        rnn_input_size: int,
        cell: str,
        layers: int,
        dropout: float,
        padding_idx: int = 0,
        fast_paths: FastPaths = ALL_FAST_PATHS,
    ) -> None:
        super().__init__()
        self.fast_paths = fast_paths
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.rnn = RNN_CLASSES[cell](
            rnn_input_size,
            hidden_size,
            num_layers=layers,
            batch_first=True,
            dropout=dropout if layers > 1 else 0.0,
        )

    def init_state(self, encoder_final: RNNState) -> DecoderState:
        return DecoderState(encoder_final)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> StepOutput:
        raise NotImplementedError

    def forward_parallel(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def forward(
        self,
        tgt_in: Tensor,
        state: DecoderState,
        memory: Memory,
        teacher_forcing: float = 1.0,
    ) -> tuple[Tensor, Tensor | None]:
        """Decode a whole target ``(B, T_dec)`` → logits ``(B, T_dec, V)`` and weights
        ``(B, H, T_dec, T_enc)`` (None without attention)."""
        if teacher_forcing >= 1.0 and self.fast_paths.fused_decoder and self.parallel_teacher_forcing:
            return self.forward_parallel(tgt_in, state, memory)
        if teacher_forcing >= 1.0 and self.fast_paths.fused_decoder and self.can_fuse():
            return self.forward_fused(tgt_in, state, memory)
        step_logits: list[Tensor] = []
        step_weights: list[Tensor] = []
        tokens = tgt_in[:, 0]  # (B,)
        for t in range(tgt_in.shape[1]):
            if t > 0:
                tokens = tgt_in[:, t]  # (B,)
                if teacher_forcing < 1.0:
                    use_gold = torch.rand(tokens.shape, device=tokens.device) < teacher_forcing
                    tokens = torch.where(use_gold, tokens, step_logits[-1].argmax(-1))  # (B,)
            logits, weights, state = self.step(tokens, state, memory)
            step_logits.append(logits)
            if weights is not None:
                step_weights.append(weights)
        logits = torch.stack(step_logits, dim=1)  # (B, T_dec, V)
        weights = torch.stack(step_weights, dim=2) if step_weights else None  # (B, H, T_dec, T_enc)
        return logits, weights

    def _run_rnn(self, inputs: Tensor, rnn_state: RNNState) -> Tensor:
        """The RNN over a whole input ``(B, T, d_in)`` → its outputs ``(B, T, d_s)``; a one-layer
        GRU through ``gru_sequence`` (its hand-written backward pass), anything else as it is."""
        if isinstance(self.rnn, nn.GRU) and self.rnn.num_layers == 1:
            return gru_sequence(inputs, rnn_state[0], layer_parameters(self.rnn), self.fast_paths.gru_sequence)  # (B, T, d_s)
        outputs, _ = self.rnn(inputs, rnn_state)  # (B, T, d_s)
        return outputs

    def _rnn_step(self, rnn_input: Tensor, rnn_state: RNNState) -> tuple[Tensor, RNNState]:
        output, rnn_state = self.rnn(rnn_input.unsqueeze(1), rnn_state)  # (B, 1, d_s)
        return output.squeeze(1), rnn_state  # (B, d_s)

    # -- the fused teacher-forced path (see the module docstring) -------------------------
    def forward_fused(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def can_fuse(self) -> bool:
        """Whether ``forward_fused`` computes what stepping would: one layer, and our own scorer
        called only through its parts (a wrapped or hooked attention must see every call)."""
        attention = self.attention
        return (
            type(self).forward_fused is not Decoder.forward_fused
            and self.rnn.num_layers == 1
            and isinstance(attention, Attention)
            and not (attention._forward_hooks or attention._forward_pre_hooks)
        )

    def _fused_setup(self, tgt_in: Tensor, state_maps: list[Tensor]):
        """What every step reads, computed once: the embeddings ``(B, T_dec, E)``; the embedding's
        share of the input gates ``W_ie E y + b_ih`` ``(B, T_dec, G·d)``; the other input columns
        ``W_ix (G·d, d_x)``; one weight and bias applying ``[W_hh; *state_maps; W_q]``
        to the state (``W_q``: the scorer's query map, when it has one); and W_q's row count (0 without)."""
        weight_ih, weight_hh, bias_ih, bias_hh = layer_parameters(self.rnn)
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T_dec, E)
        emb_dim = embedded.shape[-1]
        input_gates = F.linear(embedded, weight_ih[:, :emb_dim], bias_ih)  # (B, T_dec, G·d)
        query_weight = self.attention.query_weight()  # (d_attn, d_s) or None
        maps = [weight_hh, *state_maps] + ([] if query_weight is None else [query_weight])
        state_weight = torch.cat(maps) if len(maps) > 1 else weight_hh  # (G·d + Σ rows, d_s)
        extra = state_weight.shape[0] - bias_hh.shape[0]
        state_bias = torch.cat([bias_hh, bias_hh.new_zeros(extra)]) if extra else bias_hh  # (G·d + Σ rows,)
        query_rows = 0 if query_weight is None else query_weight.shape[0]
        return embedded, input_gates, weight_ih[:, emb_dim:], state_weight, state_bias, query_rows

    def _fused_attend(
        self, projected: Tensor, h: Tensor, memory: Memory, valid: Tensor, values: Tensor, query_rows: int
    ) -> tuple[Tensor, Tensor]:
        """Score with the state's projection (its last ``query_rows`` columns are ``W_q s`` when
        the scorer has a query map, else the query is ``h`` itself) → weights ``(B, H, 1, T_enc)``
        and ``Σ_h α_h @ values_h`` ``(B, H·d_v)``, heads concatenated."""
        attention = self.attention
        query = projected[:, -query_rows:] if query_rows else h  # (B, d_p·H) or (B, d_s)
        scores = attention.score_projected(attention.split_query(query.unsqueeze(1)), memory.projected_keys)  # (B, H, 1, T_enc)
        weights = masked_softmax(scores, valid)  # (B, H, 1, T_enc)
        mixed = weights @ values  # (B, H, 1, d_v)
        return weights, mixed.view(mixed.shape[0], -1)  # (B, H, 1, T_enc), (B, H·d_v)

    def _fused_cell(self, gates_x: Tensor, gates_h: Tensor, h: Tensor, c: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """One RNN step from its input-side and hidden-side gate pre-activations ``(B, G·d)``."""
        if c is None:
            return gru_cell(gates_x, gates_h, h), None  # (B, d_s)
        return lstm_cell(gates_x + gates_h, c)  # (B, d_s), (B, d_s)


def _split_rnn_state(rnn_state: RNNState) -> tuple[Tensor, Tensor | None]:
    """A one-layer state ``(1, B, d)`` (or an LSTM pair of them) → ``h (B, d)``, ``c (B, d)`` or None."""
    if isinstance(rnn_state, tuple):
        return rnn_state[0][0], rnn_state[1][0]  # (B, d_s), (B, d_s)
    return rnn_state[0], None  # (B, d_s)


class BahdanauDecoder(Decoder):
    """Query with s_{t-1}; feed [E y_{t-1}; c_t] to the RNN; read out from [s_t; c_t; E y_{t-1}]."""

    def __init__(
        self,
        attention: Attention,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        cell: str = "gru",
        layers: int = 1,
        dropout: float = 0.0,
        fast_paths: FastPaths = ALL_FAST_PATHS,
    ) -> None:
        key_dim = attention.key_dim
        super().__init__(
            vocab_size, embedding_dim, hidden_size, embedding_dim + key_dim, cell, layers, dropout, fast_paths=fast_paths
        )
        self.attention = attention
        self.readout = nn.Linear(hidden_size + key_dim + embedding_dim, vocab_size)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> StepOutput:
        query = top_layer(state.rnn)  # (B, d_s): s_{t-1}, before the step
        context, weights = self.attention(
            query, memory.keys, memory.valid_mask, projected_keys=memory.projected_keys
        )  # (B, d_k), (B, H, T_enc)
        embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
        output, rnn_state = self._rnn_step(torch.cat([embedded, context], dim=-1), state.rnn)  # (B, d_s)
        features = torch.cat([output, context, embedded], dim=-1)  # (B, d_s + d_k + E)
        logits = self.readout(self.dropout(features))  # (B, V)
        return logits, weights, DecoderState(rnn_state)

    def forward_fused(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        """Teacher forcing, fused: per step one matmul of s_{t-1} (hidden gates and W_a s_{t-1}),
        the scores, the context, its share of the input gates and the cell; the readout after the loop."""
        attention = self.attention
        attention.check_shapes(top_layer(state.rnn), memory.keys, memory.valid_mask)
        embedded, input_gates, weight_context, state_weight, state_bias, query_rows = self._fused_setup(tgt_in, [])
        h, c = _split_rnn_state(state.rnn)  # (B, d_s)
        if c is None and isinstance(attention, AdditiveAttention) and AdditiveGRURecurrence.supports(input_gates):
            keys2 = 2 * memory.projected_keys  # (B, H, T_enc, a): 2 U_a h, see fused.py
            v_a = attention.v_a.view(attention.heads, -1)  # (H, a)
            states, contexts, weights = AdditiveGRURecurrence.apply(
                input_gates, h, memory.keys, keys2, memory.valid_mask, state_weight, state_bias, weight_context, v_a
            )  # (B, T_dec, d_s), (B, T_dec, d_k), (B, H, T_dec, T_enc)
            features = torch.cat([states, contexts, embedded], dim=-1)  # (B, T_dec, d_s + d_k + E)
            return self.readout(self.dropout(features)), weights
        state_weight_t = state_weight.T  # (d_s, G·d [+ d_attn])
        gates = weight_context.shape[0]  # G·d
        weight_context_t = weight_context.T  # (d_k, G·d)
        values = attention.split_heads(memory.keys)  # (B, H, T_enc, d_h)
        valid = memory.valid_mask[:, None, None, :]  # (B, 1, 1, T_enc)
        outputs: list[Tensor] = []
        contexts: list[Tensor] = []
        step_weights: list[Tensor] = []
        for step_input_gates in input_gates.unbind(1):  # (B, G·d) each: W_ie E y_{t-1} + b_ih
            projected = torch.addmm(state_bias, h, state_weight_t)  # (B, G·d [+ d_attn]): W_hh s_{t-1}, W_a s_{t-1}
            weights, context = self._fused_attend(projected, h, memory, valid, values, query_rows)  # (B, H, 1, T_enc), (B, d_k)
            x_gates = torch.addmm(step_input_gates, context, weight_context_t)  # (B, G·d): + W_ic c_t
            h, c = self._fused_cell(x_gates, projected[:, :gates], h, c)  # (B, d_s)
            outputs.append(h)
            contexts.append(context)
            step_weights.append(weights)
        features = torch.cat(
            [torch.stack(outputs, dim=1), torch.stack(contexts, dim=1), embedded], dim=-1
        )  # (B, T_dec, d_s + d_k + E)
        return self.readout(self.dropout(features)), torch.cat(step_weights, dim=2)  # (B, T_dec, V), (B, H, T_dec, T_enc)


class LuongDecoder(Decoder):
    """Step the RNN first, then query with s_t; h̃_t = tanh(W_c [c_t; s_t]); logits = W_s h̃_t."""

    def __init__(
        self,
        attention: Attention,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        cell: str = "gru",
        layers: int = 1,
        dropout: float = 0.0,
        input_feeding: bool = True,
        fast_paths: FastPaths = ALL_FAST_PATHS,
    ) -> None:
        rnn_input_size = embedding_dim + (hidden_size if input_feeding else 0)
        super().__init__(vocab_size, embedding_dim, hidden_size, rnn_input_size, cell, layers, dropout, fast_paths=fast_paths)
        self.attention = attention
        self.input_feeding = input_feeding
        self.parallel_teacher_forcing = not input_feeding
        self.W_c = nn.Linear(attention.key_dim + hidden_size, hidden_size, bias=False)
        self.W_s = nn.Linear(hidden_size, vocab_size)

    def init_state(self, encoder_final: RNNState) -> DecoderState:
        if not self.input_feeding:
            return DecoderState(encoder_final)
        top = top_layer(encoder_final)  # (B, d_s)
        return DecoderState(encoder_final, torch.zeros_like(top))  # h̃_0 = 0

    def _attentional(self, output: Tensor, memory: Memory) -> tuple[Tensor, Tensor, Tensor]:
        """s_t ``(B, [T_dec,] d_s)`` → logits, weights and h̃_t, for one step or all at once."""
        context, weights = self.attention(
            output, memory.keys, memory.valid_mask, projected_keys=memory.projected_keys
        )  # (B, [T_dec,] d_k), (B, H, [T_dec,] T_enc)
        attentional = fast_tanh(self.W_c(torch.cat([context, output], dim=-1)))  # (B, [T_dec,] d_s)
        logits = self.W_s(self.dropout(attentional))  # (B, [T_dec,] V)
        return logits, weights, attentional

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> StepOutput:
        embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
        rnn_input = torch.cat([embedded, state.feed], dim=-1) if self.input_feeding else embedded  # (B, E [+ d_s])
        output, rnn_state = self._rnn_step(rnn_input, state.rnn)  # (B, d_s): s_t, after the step
        logits, weights, attentional = self._attentional(output, memory)
        return logits, weights, DecoderState(rnn_state, attentional if self.input_feeding else None)

    def can_fuse(self) -> bool:
        return self.input_feeding and super().can_fuse()

    def forward_fused(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        """Teacher forcing with input feeding, fused: per step the feed's share of the input
        gates, the cell, one matmul of s_t (next hidden gates, W_cs s_t, the query map) and
        W_cc c_t straight from the weights; W_s over all steps after the loop."""
        attention = self.attention
        hidden = self.hidden_size
        attention.check_shapes(top_layer(state.rnn), memory.keys, memory.valid_mask)
        weight_cc, weight_cs = self.W_c.weight[:, : attention.key_dim], self.W_c.weight[:, attention.key_dim :]
        _, input_gates, weight_feed, state_weight, state_bias, query_rows = self._fused_setup(tgt_in, [weight_cs])
        state_weight_t = state_weight.T  # (d_s, G·d + d_s [+ d_attn])
        gates = weight_feed.shape[0]  # G·d
        through = attention.values_through(memory.keys, weight_cc)  # (B, H, T_enc, d_s): values × W_cc
        heads = through.shape[1]
        valid = memory.valid_mask[:, None, None, :]  # (B, 1, 1, T_enc)
        h, c = _split_rnn_state(state.rnn)  # (B, d_s)
        feed = state.feed  # (B, d_s): h̃_0
        hidden_gates = torch.addmm(state_bias[:gates], h, state_weight_t[:, :gates])  # (B, G·d): W_hh s_0
        step_attentional: list[Tensor] = []
        step_weights: list[Tensor] = []
        weight_feed_t = weight_feed.T  # (d_s, G·d)
        for step_input_gates in input_gates.unbind(1):  # (B, G·d) each: W_ie E y_{t-1} + b_ih
            h, c = self._fused_cell(torch.addmm(step_input_gates, feed, weight_feed_t), hidden_gates, h, c)  # (B, d_s)
            projected = torch.addmm(state_bias, h, state_weight_t)  # (B, G·d + d_s [+ d_attn])
            hidden_gates = projected[:, :gates]  # (B, G·d): W_hh s_t, for the next step
            weights, context_part = self._fused_attend(projected, h, memory, valid, through, query_rows)  # (B, H, 1, T_enc), (B, H·d_s)
            if heads > 1:
                context_part = context_part.view(-1, heads, hidden).sum(1)  # (B, d_s): Σ_h W_cc,h c_t,h
            feed = torch.tanh(context_part + projected[:, gates : gates + hidden])  # (B, d_s): h̃_t = tanh(W_c [c_t; s_t])
            step_attentional.append(feed)
            step_weights.append(weights)
        attentional = torch.stack(step_attentional, dim=1)  # (B, T_dec, d_s)
        return self.W_s(self.dropout(attentional)), torch.cat(step_weights, dim=2)  # (B, T_dec, V), (B, H, T_dec, T_enc)

    def forward_parallel(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T_dec, E)
        outputs = self._run_rnn(embedded, state.rnn)  # (B, T_dec, d_s): s_1..s_T in one call
        logits, weights, _ = self._attentional(outputs, memory)  # (B, T_dec, V), (B, H, T_dec, T_enc)
        return logits, weights


class PlainDecoder(Decoder):
    """No attention: the encoder's final state is all the decoder ever sees of the source."""

    attention = None
    parallel_teacher_forcing = True

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        cell: str = "gru",
        layers: int = 1,
        dropout: float = 0.0,
        fast_paths: FastPaths = ALL_FAST_PATHS,
    ) -> None:
        super().__init__(vocab_size, embedding_dim, hidden_size, embedding_dim, cell, layers, dropout, fast_paths=fast_paths)
        self.output = nn.Linear(hidden_size, vocab_size)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> StepOutput:
        embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
        output, rnn_state = self._rnn_step(embedded, state.rnn)  # (B, d_s)
        return self.output(self.dropout(output)), None, DecoderState(rnn_state)  # (B, V)

    def forward_parallel(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, None]:
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T_dec, E)
        outputs = self._run_rnn(embedded, state.rnn)  # (B, T_dec, d_s)
        return self.output(self.dropout(outputs)), None  # (B, T_dec, V)
