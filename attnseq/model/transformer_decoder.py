"""The Transformer decoder (``decoder=transformer``): N pre-norm layers of masked self-attention,
cross-attention over the encoder states and a feed-forward block (Vaswani et al. 2017).

- input: x_t = √E · E[y_{t-1}] + PE(t), then dropout, then a learned map to d = ``model.hidden_size``
  when the embedding size E differs (as ``encoder=transformer`` embeds the source);
- each layer, pre-norm as ``nn.TransformerDecoderLayer(norm_first=True)``:
  x + Dropout(SelfAttention(LN(x)) over positions ≤ t), then x + Dropout(Cross(LN(x), keys)), then
  x + Dropout(W_2 Dropout(ReLU(W_1 LN(x)))); a final norm after the last layer, then W_out to the vocabulary
  (with ``model.tie_output`` the embedding's matrix, after a projection d → E where E ≠ d);
- the self-attention is the ``multihead`` scorer (``MultiheadAttention``) called through its parts
  (``project_keys``, ``score``, ``average``): the scorer contract's mask is a padding mask over the
  keys, and a decoder needs the causal one as well;
- the cross-attention is one mechanism of the configured scorer per layer, called through the
  contract (``attention(query, keys, valid_mask, projected_keys=...)``): ``scorer=multihead`` (what
  ``conf/decoder/transformer.yaml`` selects) is Vaswani's, any other scorer reads the source its
  own way. Its context is d_k wide (the keys' size, e.g. 2d for a bidirectional RNN encoder); a
  learned map takes it to d where d_k ≠ d. An additive or concat score of every position at once goes
  through ``kernels.additive_scores`` (``FastPaths.additive_all_steps``, as Luong's decoder without input
  feeding: the same values, without autograd's (B, H, T, T_enc, a) activations);
- incremental decoding: ``step`` keeps each layer's self-attention keys and values of y_<t in
  ``DecoderState.cache`` ``(B, N, H, t, 2·d_h)``, so a step computes one position, and greedy and
  beam search (which reorders the cache with the rest of the state) give what recomputing the whole
  prefix gives. Under full teacher forcing the whole target runs in one pass with the causal mask.

The weights a step returns (the heatmaps', the alignment metrics'): the cross-attention of every
layer, layer-major along the head axis ``(B, N·H, T_enc)`` (head h of layer l at l·H + h), or of the
one layer ``decoder.shown_layer`` picks. The encoder's final state is not read: the decoder knows the
source through its cross-attention alone. The attention weights are not dropped out (torch's are).
Each layer's masked self-attention weights are read on demand (``self_attention_weights``, what
``Seq2Seq.self_attention`` returns): ``decode`` hands back the ones it computes anyway, and a step drops them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnseq.attention import Attention, MultiheadAttention, masked_softmax
from attnseq.kernels import DEFAULT_FAST_PATHS, FastPaths
from attnseq.model import fused_decoders
from attnseq.model.decoders import SequenceDecoder, StepOutput, output_layer
from attnseq.model.state import DecoderState, Memory
from attnseq.model.transformer_encoder import EmbedsWithPositions


class TransformerDecoderLayer(nn.Module):
    """One pre-norm decoder layer: states ``(B, T, d)`` of positions ``start`` … → ``(B, T, d)``."""

    def __init__(self, model_dim: int, heads: int, ff_dim: int, dropout: float, cross_attention: nn.Module,
                 fast_paths: FastPaths = DEFAULT_FAST_PATHS) -> None:
        super().__init__()
        self.fast_paths = fast_paths
        self.self_attention_norm = nn.LayerNorm(model_dim)
        self.self_attention = MultiheadAttention(model_dim, model_dim, heads=heads)
        self.cross_attention_norm = nn.LayerNorm(model_dim)
        self.cross_attention = cross_attention
        key_dim = cross_attention.key_dim
        self.context_map = nn.Linear(key_dim, model_dim) if key_dim != model_dim else nn.Identity()
        self.feed_forward_norm = nn.LayerNorm(model_dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(model_dim, ff_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ff_dim, model_dim)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, states: Tensor, past: Tensor | None, memory: Memory, projected_keys: Tensor, start: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``past``: the self-attention's keys and values of the positions before ``start``
        ``(B, H, start, 2·d_h)``, or None at 0. Returns the new states, the cross-attention weights
        ``(B, H, T, T_enc)``, the keys and values of every position so far ``(B, H, start + T, 2·d_h)``
        and the masked self-attention's weights ``(B, H, T, start + T)`` (zero after each query's position)."""
        attention = self.self_attention
        normed = self.self_attention_norm(states)  # (B, T, d)
        own = attention.project_keys(normed)  # (B, H, T, 2·d_h)
        seen = own if past is None else torch.cat([past, own], dim=2)  # (B, H, start + T, 2·d_h)
        scores = attention.score(normed, seen)  # (B, H, T, start + T)
        steps, positions = normed.shape[1], seen.shape[2]
        query_at = torch.arange(start, start + steps, device=states.device)  # (T,)
        causal = torch.arange(positions, device=states.device)[None, :] <= query_at[:, None]  # (T, start + T)
        weights = masked_softmax(scores, causal[None, None])  # (B, H, T, start + T)
        states = states + self.dropout(attention.average(weights, normed, seen))  # (B, T, d)

        normed = self.cross_attention_norm(states)  # (B, T, d)
        attended = None
        if self.cross_attention_fuses():
            attended = fused_decoders.additive_all_steps(
                self.cross_attention, normed, Memory(memory.keys, memory.valid_mask, projected_keys)
            )  # None but for an additive or concat score
        if attended is None:
            step = {"step": start} if getattr(self.cross_attention, "reads_step", False) else {}
            attended = self.cross_attention(normed, memory.keys, memory.valid_mask, projected_keys=projected_keys,
                                            **step)
        context, cross_weights = attended  # (B, T, d_k), (B, H, T, T_enc)
        states = states + self.dropout(self.context_map(context))  # (B, T, d)
        states = states + self.dropout(self.feed_forward(self.feed_forward_norm(states)))  # (B, T, d)
        return states, cross_weights, seen, weights

    def cross_attention_fuses(self) -> bool:
        """Whether the cross-attention may be computed through its parts (``FastPaths.additive_all_steps``): our
        own scorer without hooks, declaring it fuses (no local window); a wrapped or hooked one must see every call."""
        attention = self.cross_attention
        return (self.fast_paths.additive_all_steps and isinstance(attention, Attention) and attention.fuses
                and not attention.hooked())


class TransformerDecoder(EmbedsWithPositions, SequenceDecoder):
    """Target tokens ``(B, T_dec)`` and the encoder memory → logits ``(B, T_dec, V)`` and the
    cross-attention weights; one token at a time with a key/value cache (``step``)."""

    def __init__(
        self,
        cross_attentions: list[nn.Module],
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        heads: int,
        ff_dim: int,
        dropout: float = 0.0,
        shown_layer: int | None = None,
        padding_idx: int = 0,
        tie_output: bool = False,
        fast_paths: FastPaths = DEFAULT_FAST_PATHS,
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.shown_layer = shown_layer
        self.init_embedding(vocab_size, embedding_dim, hidden_size, dropout, padding_idx)
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(hidden_size, heads, ff_dim, dropout, cross, fast_paths)
            for cross in cross_attentions
        )
        self.final_norm = nn.LayerNorm(hidden_size)
        self.output = output_layer(hidden_size, vocab_size, self.embedding, tie_output)

    @property
    def attention(self) -> nn.Module:
        """The cross-attention of the layer whose weights are shown (the last when all are)."""
        return self.layers[(self.shown_layer or len(self.layers)) - 1].cross_attention

    def head_labels(self, heads: int) -> list[str]:
        """Layer-major: ``layer l head h`` (layers from 1, as ``decoder.shown_layer`` counts them)."""
        shown = [self.shown_layer] if self.shown_layer is not None else range(1, len(self.layers) + 1)
        per_layer = heads // len(shown)
        return [f"layer {layer} head {h}" for layer in shown for h in range(per_layer)]

    def takes_fast_path(self) -> bool:
        return True  # the one-pass causal decode is the definition here, not an optional fast path

    def project_keys(self, keys: Tensor) -> Tensor:
        """Each layer's projected keys, layer-major along the head axis: ``(B, N·H, T_enc, d_p)``."""
        return torch.cat([layer.cross_attention.project_keys(keys) for layer in self.layers], dim=1)

    def wrap_attention(self, wrap: Callable[[nn.Module], nn.Module]) -> None:
        for layer in self.layers:
            layer.cross_attention = wrap(layer.cross_attention)

    def decode(
        self, tokens: Tensor, state: DecoderState, memory: Memory
    ) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
        """Tokens ``(B, T)`` following the cached prefix → logits ``(B, T, V)``, weights
        ``(B, H', T, T_enc)``, the cache of every position so far ``(B, N, H, t + T, 2·d_h)`` and each
        layer's self-attention weights ``(B, H, T, t + T)`` (computed anyway; only kept when asked for)."""
        states = self.embed(tokens, state.step)  # (B, T, d)
        per_layer = memory.projected_keys.chunk(len(self.layers), dim=1)  # N × (B, H, T_enc, d_p)
        weights, caches, own = [], [], []
        for index, layer in enumerate(self.layers):
            past = None if state.cache is None else state.cache[:, index]  # (B, H, t, 2·d_h)
            states, layer_weights, seen, self_weights = layer(states, past, memory, per_layer[index], state.step)
            weights.append(layer_weights)
            caches.append(seen)
            own.append(self_weights)
        logits = self.output(self.final_norm(states))  # (B, T, V)
        shown = torch.cat(weights, dim=1) if self.shown_layer is None else weights[self.shown_layer - 1]
        return logits, shown, torch.stack(caches, dim=1), own  # (B, T, V), (B, H', T, T_enc), (B, N, H, t + T, 2·d_h)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> StepOutput:
        logits, weights, cache, _ = self.decode(prev_tokens[:, None], state, memory)  # (B, 1, V), (B, H', 1, T_enc)
        new_state = DecoderState(state.rnn, None, state.step + 1, cache)
        return logits[:, 0], weights[:, :, 0], new_state  # (B, V), (B, H', T_enc)

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        logits, weights, _, _ = self.decode(tgt_in, state, memory)  # (B, T_dec, V), (B, H', T_dec, T_enc)
        return logits, weights

    def self_attention_weights(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> list[Tensor]:
        """Each layer's masked self-attention weights ``(B, H, T_dec, T_dec)`` over the inputs ``tgt_in``
        ``(B, T_dec)``, on demand: row t is how step t averages the inputs 0 … t, exactly 0 above the diagonal."""
        return self.decode(tgt_in, state, memory)[3]
