"""Decoders, named by *when* they query the encoder — separately from *how* they score.

- ``bahdanau``: query = s_{t-1}, the state before the step; the context enters the RNN input
  with the previous token's embedding; the readout sees [s_t; c_t; E y_{t-1}].
- ``luong``: query = s_t, the state after the step; attentional state h̃_t = tanh(W_c [c_t; s_t]);
  optional input feeding passes h̃_{t-1} into the next step's input.
- ``PlainDecoder`` (scorer ``none``): no attention; the decoder sees only the encoder's final
  state — the fixed-vector baseline.

Every decoder defines ``step`` (one token: the maths, and what greedy/beam decoding run).
``forward`` decodes a whole target, optionally with scheduled sampling (each step feeds the gold
token with probability ``teacher_forcing``, else the model's own previous argmax), and has one
switch: ``step`` by step, or — under full teacher forcing, where ``takes_fast_path()`` — the
decoder's ``teacher_forced`` fast path, which computes the same values and gradients:

- Bahdanau, and Luong with input feeding: ``attnseq.model.fused_decoders`` (one layer, an
  ``Attention`` called through its parts without hooks);
- Luong without input feeding, and the plain decoder: the RNN over the whole target in one call
  (the recurrence does not read the attention), then attention over all steps in one call (an
  additive/concat score through ``kernels.additive_scores``, ``FastPaths.additive_all_steps``).

``FastPaths`` (given at construction) turns the fast paths off. An attention within a local window
(Luong's local-m/local-p) declares it does not fuse (``Attention.fuses``): Bahdanau and Luong with input
feeding then step; Luong without it attends over all steps in one call through the window. The state
carries the step index t (``DecoderState.step``), passed to an attention that ``reads_step`` (local-m).
``SequenceDecoder`` is what every decoder shares, the recurrent ones and the Transformer decoder
(``attnseq.model.transformer_decoder``). The conventions: docs/attention.md.

Every decoder's output layer is ``output_layer``: ``nn.Linear(width, V)``, or with ``model.tie_output``
a ``TiedOutput`` whose weight matrix is the target embedding's own Parameter (Press & Wolf 2017),
after a bias-free projection to the embedding size E where the features the decoder reads out
from are wider or narrower (always for Bahdanau's [s_t; c_t; E y_{t-1}]), as fairseq does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from attnseq.attention import Attention
from attnseq.kernels import DEFAULT_FAST_PATHS, FastPaths
from attnseq.kernels.activations import fast_tanh
from attnseq.kernels.cells import layer_parameters
from attnseq.kernels.gru_sequence import gru_sequence
from attnseq.kernels.lstm_sequence import lstm_sequence, lstm_sequence_pays
from attnseq.model import fused_decoders
from attnseq.model.rnn_encoder import build_rnn
from attnseq.model.state import DecoderState, Memory, RNNState, top_layer

StepOutput = tuple[Tensor, Tensor | None, DecoderState]
"""logits ``(B, V)``, attention weights ``(B, H, T_enc)`` (None without attention), new state."""


class TiedOutput(nn.Module):
    """Logits ``W_E P x + b`` of features x ``(…, width)``: W_E ``(V, E)`` is the target embedding's
    weight (the same Parameter), P ``(E, width)`` a bias-free projection where width ≠ E (else none),
    b the output layer's own bias."""

    def __init__(self, width: int, embedding: nn.Embedding) -> None:
        super().__init__()
        vocab_size, embedding_dim = embedding.weight.shape
        self.projection = nn.Linear(width, embedding_dim, bias=False) if width != embedding_dim else nn.Identity()
        self.output = nn.Linear(embedding_dim, vocab_size)
        self.output.weight = embedding.weight

    def forward(self, features: Tensor) -> Tensor:
        return self.output(self.projection(features))  # (…, V)


def output_layer(width: int, vocab_size: int, embedding: nn.Embedding, tied: bool) -> nn.Module:
    """The decoder's map from its last features ``(…, width)`` to logits ``(…, V)``: its own
    ``nn.Linear``, or tied to ``embedding`` (``model.tie_output``)."""
    return TiedOutput(width, embedding) if tied else nn.Linear(width, vocab_size)


class SequenceDecoder(nn.Module):
    """What every decoder shares: ``step`` by step, or the whole target at once under full teacher
    forcing (``teacher_forced``), with scheduled sampling stepping; the keys projected once per batch."""

    attention: nn.Module | None

    def init_state(self, encoder_final: RNNState) -> DecoderState:
        return DecoderState(encoder_final)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> StepOutput:
        raise NotImplementedError

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor | None]:
        """The fast path: full teacher forcing, the values and gradients of ``step`` by step."""
        raise NotImplementedError

    def takes_fast_path(self) -> bool:
        """Whether full teacher forcing runs ``teacher_forced`` rather than ``step`` by step."""
        return False

    def attention_feeds_recurrence(self) -> bool:
        """Whether the recurrence reads each step's attention (Bahdanau; Luong with input feeding): then
        any teacher-forced pass is a loop over the steps."""
        return False

    def decodes_teacher_forcing(self, memory: Memory) -> bool:
        """Whether full teacher forcing outside autograd and training runs the fused decoding step over the
        target (where it has one): where the pass would be ``step`` by step or a hand-written recurrence, which
        keeps every step's intermediates for its backward, the decoding step was measured faster on 1 and 2
        threads; a rearranged loop (``fused_decoders``) is the decoding step's own maths with the embeddings and
        the readout batched over the steps, no faster that way, so it stays (``benchmarks/teacher_forcing_speed.py``;
        the figures are in ``benchmarks/results.md``)."""
        return False

    def decoding_step(self, memory: Memory, stepwise: bool = False) -> fused_decoders.Stepper:
        """What greedy and beam decoding call at each step, ``memory`` bound: ``step``, or where
        ``fused_decoding`` says so (and not ``stepwise``) a fused step that computes the same tokens
        without autograd. Built once per batch and passed along by the caller; nothing is kept here."""
        fused = None if stepwise else self.inference_step(memory)
        if fused is not None:
            return fused
        return lambda prev_tokens, state: self.step(prev_tokens, state, memory)

    def fused_decoding(self, memory: Memory, reweigh: fused_decoders.Reweigh | None = None
                       ) -> fused_decoders.Stepper | None:
        """The fused decoding step (``fused_decoders``), or None where this decoder has none; ``reweigh``
        swaps each step's weights before the context is taken from them (the counterfactual replays)."""
        return None

    def inference_step(self, memory: Memory, reweigh: fused_decoders.Reweigh | None = None
                       ) -> fused_decoders.Stepper | None:
        """``fused_decoding`` where nothing asks for gradients (outside autograd, not training), else None."""
        return None if torch.is_grad_enabled() or self.training else self.fused_decoding(memory, reweigh)

    def project_keys(self, keys: Tensor) -> Tensor | None:
        """What the attention derives from the keys alone, once per batch (``Memory.projected_keys``):
        ``(B, H, T_enc, d_p)``, or None without attention."""
        return None if self.attention is None else self.attention.project_keys(keys)

    def wrap_attention(self, wrap: Callable[[nn.Module], nn.Module]) -> None:
        """Put ``wrap(mechanism)`` in place of each attention mechanism the decoder reads the source
        through (the counterfactual check's swap)."""
        self.attention = wrap(self.attention)

    def forward(
        self,
        tgt_in: Tensor,
        state: DecoderState,
        memory: Memory,
        teacher_forcing: float = 1.0,
    ) -> tuple[Tensor, Tensor | None]:
        """Decode a whole target ``(B, T_dec)`` → logits ``(B, T_dec, V)`` and weights
        ``(B, H, T_dec, T_enc)`` (None without attention). Under full teacher forcing where nothing asks for
        gradients (validation, evaluation), through the fused decoding step where ``decodes_teacher_forcing``."""
        decodes = teacher_forcing >= 1.0 and self.decodes_teacher_forcing(memory)
        stepper = self.inference_step(memory) if decodes else None
        if stepper is not None:
            return fused_decoders.step_through(stepper, tgt_in, state)
        if teacher_forcing >= 1.0 and self.takes_fast_path():
            return self.teacher_forced(tgt_in, state, memory)
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

    def share_embedding(self, weight: nn.Parameter) -> None:
        """Embed the target with ``weight`` (the source embedding's: ``model.share_embeddings``), and
        write the logits with it too where the output layer is tied."""
        self.embedding.weight = weight
        for module in self.modules():
            if isinstance(module, TiedOutput):
                module.output.weight = weight

    def head_labels(self, heads: int) -> list[str]:
        """A name for each of the ``heads`` rows its attention weights carry (``(B, heads, …)``)."""
        return [f"head {h}" for h in range(heads)]

    def step_of(self, step: int, attention: nn.Module | None = None) -> dict[str, int]:
        """The attention's ``step`` argument when it declares it reads one (``reads_step``: local-m),
        else none (a wrapped attention need not take it). ``attention``: the decoder's own by default."""
        attention = self.attention if attention is None else attention
        return {"step": step} if getattr(attention, "reads_step", False) else {}


class Decoder(SequenceDecoder):
    """Shared machinery of the recurrent decoders: embedding, RNN, the step-by-step loop and scheduled sampling."""

    attention: Attention | None

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
        fast_paths: FastPaths = DEFAULT_FAST_PATHS,
    ) -> None:
        super().__init__()
        self.fast_paths = fast_paths
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=padding_idx)
        self.dropout = nn.Dropout(dropout)
        self.rnn = build_rnn(cell, rnn_input_size, hidden_size, layers, dropout)

    def takes_fast_path(self) -> bool:
        return self.fast_paths.fused_decoder

    def attention_fuses(self) -> bool:
        """Whether a fused loop, which calls the scorer through its parts, computes what stepping
        would: one layer, our own scorer without hooks (a wrapped or hooked attention must see
        every call), and one that declares it fuses (``Attention.fuses``: not within a local window)."""
        attention = self.attention
        return (
            self.rnn.num_layers == 1
            and isinstance(attention, Attention)
            and attention.fuses
            and not attention.hooked()
        )

    def run_rnn(self, inputs: Tensor, rnn_state: RNNState) -> Tensor:
        """The RNN over a whole input ``(B, T, d_in)`` → its outputs ``(B, T, d_s)``."""
        if isinstance(self.rnn, nn.GRU) and self.rnn.num_layers == 1:
            return gru_sequence(
                inputs, rnn_state[0], layer_parameters(self.rnn), self.fast_paths.gru_sequence
            )  # (B, T, d_s)
        if isinstance(self.rnn, nn.LSTM) and self.rnn.num_layers == 1 and self.fast_paths.lstm_sequence:
            h0, c0 = rnn_state[0][0], rnn_state[1][0]  # (B, d_s) each
            weights = layer_parameters(self.rnn)
            if lstm_sequence_pays(inputs, h0, c0, weights):
                return lstm_sequence(inputs, h0, c0, weights)[0]  # (B, T, d_s)
        outputs, _ = self.rnn(inputs, rnn_state)  # (B, T, d_s)
        return outputs

    def rnn_step(self, rnn_input: Tensor, rnn_state: RNNState) -> tuple[Tensor, RNNState]:
        output, rnn_state = self.rnn(rnn_input.unsqueeze(1), rnn_state)  # (B, 1, d_s)
        return output.squeeze(1), rnn_state  # (B, d_s)


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
        fast_paths: FastPaths = DEFAULT_FAST_PATHS,
        tie_output: bool = False,
    ) -> None:
        key_dim = attention.key_dim
        super().__init__(
            vocab_size, embedding_dim, hidden_size, embedding_dim + key_dim, cell, layers, dropout,
            fast_paths=fast_paths,
        )
        self.attention = attention
        self.readout = output_layer(hidden_size + key_dim + embedding_dim, vocab_size, self.embedding, tie_output)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> StepOutput:
        query = top_layer(state.rnn)  # (B, d_s): s_{t-1}, before the step
        context, weights = self.attention(
            query, memory.keys, memory.valid_mask, projected_keys=memory.projected_keys, **self.step_of(state.step)
        )  # (B, d_k), (B, H, T_enc)
        embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
        output, rnn_state = self.rnn_step(torch.cat([embedded, context], dim=-1), state.rnn)  # (B, d_s): s_t
        return self.read_out(output, context, embedded), weights, DecoderState(rnn_state, step=state.step + 1)

    def read_out(self, output: Tensor, context: Tensor, embedded: Tensor) -> Tensor:
        """Logits ``(B, [T_dec,] V)`` from s_t, c_t and E y_{t-1}, for one step or all at once."""
        features = torch.cat([output, context, embedded], dim=-1)  # (B, [T_dec,] d_s + d_k + E)
        return self.readout(self.dropout(features))  # (B, [T_dec,] V)

    def attention_feeds_recurrence(self) -> bool:
        return True

    def decodes_teacher_forcing(self, memory: Memory) -> bool:
        # a multiplicative score's recurrence runs only under autograd; outside it the rearranged loop stays
        # (``fused_decoders.bahdanau``): on 2 threads it ran faster than the decoding step (benchmarks/results.md)
        return not self.takes_fast_path() or fused_decoders.recurrence_kind(self, memory.keys) == "additive"

    def takes_fast_path(self) -> bool:
        return super().takes_fast_path() and self.attention_fuses()

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        return fused_decoders.bahdanau(self, tgt_in, state, memory)

    def fused_decoding(self, memory: Memory, reweigh: fused_decoders.Reweigh | None = None
                       ) -> fused_decoders.Stepper | None:
        # the context comes from the scorer's own ``average``: learned values (multihead) included
        fuses = self.fast_paths.fused_decoder and self.attention_fuses()
        return fused_decoders.bahdanau_decoding(self, memory, reweigh) if fuses else None


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
        fast_paths: FastPaths = DEFAULT_FAST_PATHS,
        tie_output: bool = False,
    ) -> None:
        rnn_input_size = embedding_dim + (hidden_size if input_feeding else 0)
        super().__init__(
            vocab_size, embedding_dim, hidden_size, rnn_input_size, cell, layers, dropout, fast_paths=fast_paths
        )
        self.attention = attention
        self.input_feeding = input_feeding
        self.W_c = nn.Linear(attention.key_dim + hidden_size, hidden_size, bias=False)
        self.W_s = output_layer(hidden_size, vocab_size, self.embedding, tie_output)

    def init_state(self, encoder_final: RNNState) -> DecoderState:
        if not self.input_feeding:
            return DecoderState(encoder_final)
        top = top_layer(encoder_final)  # (B, d_s)
        return DecoderState(encoder_final, torch.zeros_like(top))  # h̃_0 = 0

    def attend(self, output: Tensor, memory: Memory, step: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """s_t ``(B, [T_dec,] d_s)`` → logits, weights and h̃_t, for one step or all at once (``step``:
        the first one's index t)."""
        attended = None
        if output.dim() == 3 and self.fast_paths.additive_all_steps and self.attention_fuses():
            attended = fused_decoders.additive_all_steps(self.attention, output, memory)
        if attended is None:
            attended = self.attention(output, memory.keys, memory.valid_mask, projected_keys=memory.projected_keys,
                                      **self.step_of(step))
        context, weights = attended  # (B, [T_dec,] d_k), (B, H, [T_dec,] T_enc)
        attentional = fast_tanh(self.W_c(torch.cat([context, output], dim=-1)))  # (B, [T_dec,] d_s)
        logits = self.W_s(self.dropout(attentional))  # (B, [T_dec,] V)
        return logits, weights, attentional

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> StepOutput:
        embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
        rnn_input = torch.cat([embedded, state.feed], dim=-1) if self.input_feeding else embedded  # (B, E [+ d_s])
        output, rnn_state = self.rnn_step(rnn_input, state.rnn)  # (B, d_s): s_t, after the step
        logits, weights, attentional = self.attend(output, memory, state.step)
        return logits, weights, DecoderState(rnn_state, attentional if self.input_feeding else None, state.step + 1)

    def attention_feeds_recurrence(self) -> bool:
        return self.input_feeding

    def decodes_teacher_forcing(self, memory: Memory) -> bool:
        fast = self.takes_fast_path()
        return self.input_feeding and (not fast or fused_decoders.recurrence_kind(self, memory.keys) is not None)

    def takes_fast_path(self) -> bool:
        return super().takes_fast_path() and (not self.input_feeding or self.attention_fuses())

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, Tensor]:
        if self.input_feeding:
            return fused_decoders.luong_input_feeding(self, tgt_in, state, memory)
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T_dec, E)
        outputs = self.run_rnn(embedded, state.rnn)  # (B, T_dec, d_s): s_1..s_T in one call
        logits, weights, _ = self.attend(outputs, memory, state.step)  # (B, T_dec, V), (B, H, T_dec, T_enc)
        return logits, weights

    def fused_decoding(self, memory: Memory, reweigh: fused_decoders.Reweigh | None = None
                       ) -> fused_decoders.Stepper | None:
        fuses = self.fast_paths.fused_decoder and self.attention_fuses()
        return fused_decoders.luong_decoding(self, memory, reweigh) if fuses else None


class PlainDecoder(Decoder):
    """No attention: the encoder's final state is all the decoder ever sees of the source."""

    attention = None

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        cell: str = "gru",
        layers: int = 1,
        dropout: float = 0.0,
        fast_paths: FastPaths = DEFAULT_FAST_PATHS,
        tie_output: bool = False,
    ) -> None:
        super().__init__(
            vocab_size, embedding_dim, hidden_size, embedding_dim, cell, layers, dropout, fast_paths=fast_paths
        )
        self.output = output_layer(hidden_size, vocab_size, self.embedding, tie_output)

    def step(self, prev_tokens: Tensor, state: DecoderState, memory: Memory) -> StepOutput:
        embedded = self.dropout(self.embedding(prev_tokens))  # (B, E)
        output, rnn_state = self.rnn_step(embedded, state.rnn)  # (B, d_s)
        return self.output(self.dropout(output)), None, DecoderState(rnn_state, step=state.step + 1)  # (B, V)

    def teacher_forced(self, tgt_in: Tensor, state: DecoderState, memory: Memory) -> tuple[Tensor, None]:
        embedded = self.dropout(self.embedding(tgt_in))  # (B, T_dec, E)
        outputs = self.run_rnn(embedded, state.rnn)  # (B, T_dec, d_s): in one call
        return self.output(self.dropout(outputs)), None  # (B, T_dec, V)
