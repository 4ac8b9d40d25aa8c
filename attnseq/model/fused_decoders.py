"""Teacher forcing over a whole target, fused: the maths of a decoder's ``step`` over every step
(tested equal, values and gradients), arranged so that each step does few, large operations.

Before the loop: the embeddings and their share of the RNN's input gates for all steps, in one
matmul. Per step: one matmul of the state for everything that reads it (the hidden gates, the
scorer's query map W_q, Luong's W_c half), the scores, the context, and the cell
(``kernels.cells``) on the RNN's own parameters. After the loop: the readout over all steps.

A Bahdanau decoder whose scorer declares ``fused_recurrence = "additive"`` goes further, through
``AdditiveGRURecurrence`` or ``AdditiveLSTMRecurrence``: one autograd node with a hand-written
backward pass (for a scorer that declares ``"multiplicative"``, ``MultiplicativeBahdanauRecurrence``);
so does a Luong decoder with input feeding, through ``AdditiveLuongRecurrence`` (or
``MultiplicativeLuongRecurrence``). Luong without input feeding scores all steps at once; with an
additive scorer, through ``additive_all_steps``.

Decoding (``decoding_step``) takes the same per-step maths one token at a time, without autograd: the
embeddings' share of the input gates for every vocabulary entry in one matmul (once per batch, then one
row per token), one matmul of the state for everything that reads it, the scores, the context and the cell.

The decoder (``attnseq.model.decoders``) decides when these apply: one layer, an ``Attention``
called through its parts with no hooks and declaring it fuses (``Attention.fuses``: no local window),
full teacher forcing (or decoding outside autograd and training), ``FastPaths.fused_decoder``. Outside
autograd and training, full teacher forcing that would run a hand-written recurrence (which keeps every
step's intermediates for its backward) or ``step`` by step runs the decoding step over the target instead
(``step_through``): the same values, faster there; the rearranged loops, the decoding step's own maths,
stay (``SequenceDecoder.decodes_teacher_forcing``), and so does Bahdanau's with a multiplicative score, whose
recurrence runs only under autograd.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from attnseq.attention import Attention, masked_softmax
from attnseq.kernels import additive_recurrence, additive_scores
from attnseq.kernels.additive_attention_steps import additive_weights
from attnseq.kernels.additive_recurrence import AdditiveGRURecurrence, AdditiveLSTMRecurrence
from attnseq.kernels.cells import gru_cell, layer_parameters, lstm_cell
from attnseq.kernels.luong_recurrence import AdditiveLuongRecurrence, MultiplicativeLuongRecurrence
from attnseq.kernels.multiplicative_recurrence import MultiplicativeBahdanauRecurrence
from attnseq.model.state import DecoderState, Memory

Stepper = Callable[[Tensor, DecoderState], tuple[Tensor, Tensor | None, DecoderState]]
"""One decoding step, the memory bound: previous tokens ``(B,)`` and state → logits ``(B, V)``, weights
``(B, H, T_enc)`` (None without attention) and the next state, as ``SequenceDecoder.step`` returns them."""


def step_through(stepper: Stepper, tgt_in: Tensor, state: DecoderState) -> tuple[Tensor, Tensor | None]:
    """Teacher forcing by ``stepper``, one target position at a time: ``tgt_in (B, T_dec)`` → logits
    ``(B, T_dec, V)`` and weights ``(B, H, T_dec, T_enc)`` (None without attention)."""
    step_logits, step_weights = [], []
    for tokens in tgt_in.unbind(1):  # (B,) each: y_{t-1}
        logits, weights, state = stepper(tokens, state)  # (B, V), (B, H, T_enc)
        step_logits.append(logits)
        if weights is not None:
            step_weights.append(weights)
    weights = torch.stack(step_weights, dim=2) if step_weights else None  # (B, H, T_dec, T_enc)
    return torch.stack(step_logits, dim=1), weights  # (B, T_dec, V)


Reweigh = Callable[[Tensor], Tensor] | Tensor
"""What a step averages the values with instead of its weights (the counterfactual check's swap,
``attnseq.faithfulness.counterfactual``), and returns: a function of the step's weights ``(B, H, T_enc)``, or
fixed weights ``(B, H, T_enc)`` for every step, when the step then computes no scores."""


class StepInputs(NamedTuple):
    """What every step of a fused teacher-forced loop reads, computed once per batch."""

    embedded: Tensor  # (B, T_dec, E): E y_{t-1} for every step
    input_gates: Tensor  # (B, T_dec, G·d): W_ie E y_{t-1} + b_ih, the embedding's share of the input gates
    extra_input_weight: Tensor  # (G·d, d_x): the RNN's input columns after the embedding's (context or feed)
    state_weight: Tensor  # (G·d + rows, d_s): [W_hh; *state_maps; W_q], everything that reads the state
    state_bias: Tensor  # (G·d + rows,): [b_hh; 0]
    query_rows: int  # W_q's rows at the end of state_weight; 0: the scorer reads the state as it is


class CellState(NamedTuple):
    """A one-layer RNN's state between two steps of a fused loop."""

    h: Tensor  # (B, d_s)
    c: Tensor | None  # (B, d_s), LSTM only


def split_state(rnn_state) -> CellState:
    """A one-layer ``nn.GRU``/``nn.LSTM`` state ``(1, B, d)`` (an LSTM's pair of them) → ``CellState``."""
    if isinstance(rnn_state, tuple):
        return CellState(rnn_state[0][0], rnn_state[1][0])  # (B, d_s), (B, d_s)
    return CellState(rnn_state[0], None)  # (B, d_s)


def step_inputs(
    embedding: nn.Module,
    dropout: nn.Module,
    rnn: nn.RNNBase,
    attention: Attention,
    tgt_in: Tensor,
    state_maps: list[Tensor],
) -> StepInputs:
    weight_ih, weight_hh, bias_ih, bias_hh = layer_parameters(rnn)
    embedded = dropout(embedding(tgt_in))  # (B, T_dec, E)
    emb_dim = embedded.shape[-1]
    input_gates = F.linear(embedded, weight_ih[:, :emb_dim], bias_ih)  # (B, T_dec, G·d)
    query_weight = attention.query_weight()  # (d_p·H, d_s) or None
    maps = [weight_hh, *state_maps] + ([] if query_weight is None else [query_weight])
    state_weight = torch.cat(maps) if len(maps) > 1 else weight_hh  # (G·d + rows, d_s)
    extra = state_weight.shape[0] - bias_hh.shape[0]
    state_bias = torch.cat([bias_hh, bias_hh.new_zeros(extra)]) if extra else bias_hh  # (G·d + rows,)
    query_rows = 0 if query_weight is None else query_weight.shape[0]
    return StepInputs(embedded, input_gates, weight_ih[:, emb_dim:], state_weight, state_bias, query_rows)


def attend(
    attention: Attention,
    query: Tensor,
    projected_keys: Tensor,
    valid: Tensor,
    values: Tensor,
) -> tuple[Tensor, Tensor]:
    """One step's scores from its query (W_q s ``(B, d_p·H)``, or the state itself ``(B, d_s)``) → weights
    ``(B, H, 1, T_enc)`` and ``Σ_i α_i values_i`` per head, concatenated ``(B, H·d_v)``."""
    scores = attention.score_projected(attention.split_query(query.unsqueeze(1)), projected_keys)  # (B, H, 1, T_enc)
    weights = masked_softmax(scores, valid)  # (B, H, 1, T_enc)
    averaged = weights @ values  # (B, H, 1, d_v)
    return weights, averaged.view(averaged.shape[0], -1)  # (B, H, 1, T_enc), (B, H·d_v)


def cell(x_gates: Tensor, hidden_gates: Tensor, state: CellState) -> CellState:
    """One RNN step from its input-side and hidden-side gate pre-activations ``(B, G·d)``."""
    if state.c is None:
        return CellState(gru_cell(x_gates, hidden_gates, state.h), None)  # (B, d_s)
    return CellState(*lstm_cell(x_gates + hidden_gates, state.c))  # (B, d_s), (B, d_s)


def recurrence_kind(decoder, sample: Tensor) -> str | None:
    """The hand-written recurrence ``bahdanau`` or ``luong_input_feeding`` runs ``decoder``'s teacher forcing as:
    ``"additive"`` (``AdditiveGRURecurrence``/``AdditiveLSTMRecurrence``, ``AdditiveLuongRecurrence``),
    ``"multiplicative"`` (``MultiplicativeBahdanauRecurrence``, ``MultiplicativeLuongRecurrence``; with
    ``FastPaths.multiplicative_recurrence``), or None (the rearranged loop), as its scorer declares
    (``fused_recurrence``; ``sample``, a tensor of the batch: ``additive_recurrence.supports``)."""
    kind = decoder.attention.fused_recurrence
    if kind == "multiplicative" and not decoder.fast_paths.multiplicative_recurrence:
        return None
    return kind if kind in ("additive", "multiplicative") and additive_recurrence.supports(sample) else None


def bahdanau(decoder, tgt_in: Tensor, state, memory) -> tuple[Tensor, Tensor]:
    """``BahdanauDecoder``'s teacher forcing: per step one matmul of s_{t-1} (hidden gates and
    W_q s_{t-1}), the scores, the context, its share of the input gates and the cell."""
    attention: Attention = decoder.attention
    start = split_state(state.rnn)
    attention.check_shapes(start.h, memory.keys, memory.valid_mask)
    inputs = step_inputs(decoder.embedding, decoder.dropout, decoder.rnn, attention, tgt_in, [])
    kind = recurrence_kind(decoder, inputs.input_gates)
    if kind == "multiplicative" and torch.is_grad_enabled():  # for its backward; the query is the state: no W_q
        states, contexts, weights = MultiplicativeBahdanauRecurrence.apply(
            inputs.input_gates, start.h, start.c, memory.keys, memory.projected_keys, memory.valid_mask,
            inputs.state_weight, inputs.state_bias, inputs.extra_input_weight, attention.score_scale(),
        )  # (B, T_dec, d_s), (B, T_dec, d_k), (B, H, T_dec, T_enc)
        return decoder.read_out(states, contexts, inputs.embedded), weights
    if kind == "additive":
        doubled_keys = 2 * memory.projected_keys  # (B, H, T_enc, a): K2 = 2K
        v = attention.v_a.view(attention.heads, -1)  # (H, a)
        rest = (
            memory.keys, doubled_keys, memory.valid_mask,
            inputs.state_weight, inputs.state_bias, inputs.extra_input_weight, v,
        )
        if start.c is None:
            recurrence = AdditiveGRURecurrence.apply(inputs.input_gates, start.h, *rest)
        else:
            recurrence = AdditiveLSTMRecurrence.apply(inputs.input_gates, start.h, start.c, *rest)
        states, contexts, weights = recurrence  # (B, T_dec, d_s), (B, T_dec, d_k), (B, H, T_dec, T_enc)
        return decoder.read_out(states, contexts, inputs.embedded), weights
    state_weight_t = inputs.state_weight.T  # (d_s, G·d [+ rows of W_q])
    gates = inputs.extra_input_weight.shape[0]  # G·d
    weight_context_t = inputs.extra_input_weight.T  # (d_k, G·d)
    if attention.values_are_keys:
        values = attention.split_heads(memory.keys)  # (B, H, T_enc, d_h)
    else:  # values of its own (multihead): each step needs W_ic c_t only; the contexts come after the loop
        values = attention.values_through(memory.keys, inputs.extra_input_weight)  # (B, H, T_enc, G·d)
    valid = memory.valid_mask[:, None, None, :]  # (B, 1, 1, T_enc)
    scoring_keys = attention.scoring_keys(memory.projected_keys)  # once, not at every step (its docstring)
    current = start
    outputs: list[Tensor] = []
    contexts: list[Tensor] = []
    step_weights: list[Tensor] = []
    for step_input_gates in inputs.input_gates.unbind(1):  # (B, G·d) each: W_ie E y_{t-1} + b_ih
        projected = torch.addmm(
            inputs.state_bias, current.h, state_weight_t
        )  # (B, G·d [+ rows]): W_hh s_{t-1}, W_q s_{t-1}
        # One split, not slices: each slice's backward fills a zero buffer the size of ``projected``, then summed
        hidden_gates, query = projected.split([gates, inputs.query_rows], dim=1)  # (B, G·d), (B, rows)
        weights, averaged = attend(
            attention, query if inputs.query_rows else current.h, scoring_keys, valid, values
        )  # (B, H, 1, T_enc), (B, d_k) or (B, H·G·d)
        if attention.values_are_keys:
            x_gates = torch.addmm(step_input_gates, averaged, weight_context_t)  # (B, G·d): + W_ic c_t
            contexts.append(averaged)
        else:
            x_gates = step_input_gates + averaged.view(-1, attention.heads, gates).sum(1)  # (B, G·d): + W_ic c_t
        current = cell(x_gates, hidden_gates, current)
        outputs.append(current.h)
        step_weights.append(weights)
    weights = torch.cat(step_weights, dim=2)  # (B, H, T_dec, T_enc)
    if attention.values_are_keys:
        context = torch.stack(contexts, dim=1)  # (B, T_dec, d_k)
    else:
        context = attention.average(weights, memory.keys, memory.projected_keys)  # (B, T_dec, d_k): every step's
    return decoder.read_out(torch.stack(outputs, dim=1), context, inputs.embedded), weights  # (B, T_dec, V)


def luong_input_feeding(decoder, tgt_in: Tensor, state, memory) -> tuple[Tensor, Tensor]:
    """``LuongDecoder``'s teacher forcing with input feeding: per step the feed's share of the
    input gates, the cell, one matmul of s_t (next hidden gates, W_cs s_t, W_q s_t) and W_cc c_t
    straight from the weights (``values_through``); W_s over all steps after the loop. A scorer
    that declares ``fused_recurrence = "additive"`` runs all of it in ``AdditiveLuongRecurrence``, one
    that declares ``"multiplicative"`` in ``MultiplicativeLuongRecurrence``."""
    attention: Attention = decoder.attention
    hidden = decoder.hidden_size
    current = split_state(state.rnn)
    attention.check_shapes(current.h, memory.keys, memory.valid_mask)
    weight_cc, weight_cs = decoder.W_c.weight[:, : attention.key_dim], decoder.W_c.weight[:, attention.key_dim :]
    inputs = step_inputs(decoder.embedding, decoder.dropout, decoder.rnn, attention, tgt_in, [weight_cs])
    through = attention.values_through(memory.keys, weight_cc)  # (B, H, T_enc, d_s): values × W_cc
    feed = state.feed  # (B, d_s): h̃_0
    kind = recurrence_kind(decoder, inputs.input_gates)
    if kind == "additive":
        attentional, weights = AdditiveLuongRecurrence.apply(
            inputs.input_gates, current.h, current.c, feed, through, 2 * memory.projected_keys, memory.valid_mask,
            inputs.state_weight, inputs.state_bias, inputs.extra_input_weight, attention.v_a.view(attention.heads, -1),
        )  # (B, T_dec, d_s), (B, H, T_dec, T_enc)
        return decoder.W_s(decoder.dropout(attentional)), weights  # (B, T_dec, V), (B, H, T_dec, T_enc)
    if kind == "multiplicative":
        attentional, weights = MultiplicativeLuongRecurrence.apply(
            inputs.input_gates, current.h, current.c, feed, through, memory.projected_keys, memory.valid_mask,
            inputs.state_weight, inputs.state_bias, inputs.extra_input_weight, attention.score_scale(),
        )  # (B, T_dec, d_s), (B, H, T_dec, T_enc)
        return decoder.W_s(decoder.dropout(attentional)), weights  # (B, T_dec, V), (B, H, T_dec, T_enc)
    state_weight_t = inputs.state_weight.T  # (d_s, G·d + d_s [+ rows of W_q])
    gates = inputs.extra_input_weight.shape[0]  # G·d
    heads = through.shape[1]
    valid = memory.valid_mask[:, None, None, :]  # (B, 1, 1, T_enc)
    scoring_keys = attention.scoring_keys(memory.projected_keys)  # once, not at every step (its docstring)
    hidden_gates = torch.addmm(inputs.state_bias[:gates], current.h, state_weight_t[:, :gates])  # (B, G·d): W_hh s_0
    step_attentional: list[Tensor] = []
    step_weights: list[Tensor] = []
    feed_weight_t = inputs.extra_input_weight.T  # (d_s, G·d)
    for step_input_gates in inputs.input_gates.unbind(1):  # (B, G·d) each: W_ie E y_{t-1} + b_ih
        current = cell(torch.addmm(step_input_gates, feed, feed_weight_t), hidden_gates, current)  # s_t
        projected = torch.addmm(inputs.state_bias, current.h, state_weight_t)  # (B, G·d + d_s [+ rows])
        hidden_gates, state_part, query = projected.split(
            [gates, hidden, inputs.query_rows], dim=1
        )  # (B, G·d): W_hh s_t, for the next step; (B, d_s): W_cs s_t; (B, rows): W_q s_t
        weights, context_part = attend(
            attention, query if inputs.query_rows else current.h, scoring_keys, valid, through
        )  # (B, H, 1, T_enc), (B, H·d_s)
        if heads > 1:
            context_part = context_part.view(-1, heads, hidden).sum(1)  # (B, d_s): Σ_h W_cc,h c_t,h
        feed = torch.tanh(context_part + state_part)  # (B, d_s): h̃_t = tanh(W_c [c_t; s_t])
        step_attentional.append(feed)
        step_weights.append(weights)
    attentional = torch.stack(step_attentional, dim=1)  # (B, T_dec, d_s)
    return (
        decoder.W_s(decoder.dropout(attentional)),  # (B, T_dec, V)
        torch.cat(step_weights, dim=2),  # (B, H, T_dec, T_enc)
    )


def additive_all_steps(attention: Attention, states: Tensor, memory) -> tuple[Tensor, Tensor] | None:
    """The attention of every step at once for a scorer that declares ``fused_recurrence =
    "additive"``: states ``(B, T_dec, d_q)`` → context ``(B, T_dec, d_k)`` and weights
    ``(B, H, T_dec, T_enc)`` through ``kernels.additive_scores``; None where it does not apply
    (another scorer, autocast), for the caller to call the attention itself."""
    if attention.fused_recurrence != "additive":
        return None
    v = attention.v_a.view(attention.heads, -1)  # (H, a)
    if not additive_scores.supports(states, memory.projected_keys, v):
        return None
    attention.check_shapes(states, memory.keys, memory.valid_mask)
    query = attention.project_query(states)  # (B, H, T_dec, a)
    scores = additive_scores.additive_scores(query, memory.projected_keys, v)  # (B, H, T_dec, T_enc)
    weights = masked_softmax(scores, memory.valid_mask[:, None, None, :])  # (B, H, T_dec, T_enc)
    context = attention.average(weights, memory.keys, memory.projected_keys)  # (B, T_dec, d_k)
    return context, weights  # (B, T_dec, d_k), (B, H, T_dec, T_enc)


def _rnn_state(state: CellState):
    """A ``CellState`` back in ``nn.GRU``/``nn.LSTM``'s layout ``(1, B, d)`` (an LSTM's pair of them)."""
    return state.h[None] if state.c is None else (state.h[None], state.c[None])  # (1, B, d_s)


def _token_input_gates(decoder) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``W_ie E y + b_ih`` of every vocabulary entry y ``(V, G·d)`` (one row per token at each step), the
    RNN's input columns after the embedding's ``(G·d, d_x)``, ``W_hh`` and ``b_hh``."""
    weight_ih, weight_hh, bias_ih, bias_hh = layer_parameters(decoder.rnn)
    table = decoder.embedding.weight  # (V, E)
    emb_dim = table.shape[-1]
    return F.linear(table, weight_ih[:, :emb_dim], bias_ih), weight_ih[:, emb_dim:], weight_hh, bias_hh  # (V, G·d)


def _and_query(weight: Tensor, query_weight: Tensor | None) -> Tensor:
    """``weight (rows, d_s)`` with the scorer's query map under it: ``(rows [+ rows of W_q], d_s)``, what one
    matmul of the state computes."""
    return weight if query_weight is None else torch.cat([weight, query_weight])


def _step_weights(attention: Attention, memory: Memory, reweigh: Reweigh | None = None) -> Callable[[Tensor], Tensor]:
    """One step's weights ``(B, H, T_enc)`` from its query-weight-mapped query ``(B, ·)``: ``attention.forward``'s
    maths without its checks; for a scorer that declares ``fused_recurrence = "additive"``, the fused
    recurrences' (``additive_attention_steps.additive_weights``: σ(K2 + 2q) with K2 = 2K doubled here, once).
    With ``reweigh``, those weights swapped by it, or its fixed weights (no scores computed)."""
    if isinstance(reweigh, Tensor):
        return lambda query: reweigh  # (B, H, T_enc): the same every step
    if reweigh is not None:
        weigh = _step_weights(attention, memory)
        return lambda query: reweigh(weigh(query))  # (B, H, T_enc)
    if attention.fused_recurrence == "additive":
        doubled_keys = 2 * memory.projected_keys  # (B, H, T_enc, a): K2 = 2K
        v = attention.v_a.view(attention.heads, -1)  # (H, a)
        two_v, v_sum = (2 * v).unsqueeze(-1), v.sum(-1).view(1, -1, 1)  # (H, a, 1), (1, H, 1)
        invalid = ~memory.valid_mask[:, None, :]  # (B, 1, T_enc)
        return lambda query: additive_weights(doubled_keys, query, two_v, v_sum, invalid)  # (B, H, T_enc)
    valid = memory.valid_mask[:, None, None, :]  # (B, 1, 1, T_enc)

    def weigh(query: Tensor) -> Tensor:
        scores = attention.score_projected(attention.split_query(query.unsqueeze(1)), memory.projected_keys)
        return masked_softmax(scores, valid).squeeze(2)  # (B, H, T_enc)

    return weigh


def bahdanau_decoding(decoder, memory: Memory, reweigh: Reweigh | None = None) -> Stepper:
    """``BahdanauDecoder.step`` bound to ``memory``, as ``bahdanau``'s loop computes it: per step one matmul
    of s_{t-1} (hidden gates and W_q s_{t-1}), the scores, the context, its share of the input gates (the
    embedding's taken from a per-token table) and the cell; the readout of s_t, c_t and E y_{t-1}. The
    same tokens as ``step`` (tested); values within float rounding of it. ``reweigh``: each step's weights
    swapped before the context is taken from them (``Reweigh``)."""
    attention: Attention = decoder.attention
    table, weight_context, weight_hh, bias_hh = _token_input_gates(decoder)
    query_weight = attention.query_weight()  # (rows, d_s) or None
    state_weight_t = _and_query(weight_hh, query_weight).T  # (d_s, G·d [+ rows])
    state_bias = bias_hh if query_weight is None else torch.cat([bias_hh, bias_hh.new_zeros(query_weight.shape[0])])
    gates = weight_hh.shape[0]  # G·d
    weight_context_t = weight_context.T  # (d_k, G·d)
    weigh = _step_weights(attention, memory, reweigh)

    def step(prev_tokens: Tensor, state: DecoderState):
        current = split_state(state.rnn)
        projected = torch.addmm(state_bias, current.h, state_weight_t)  # (B, G·d [+ rows]): W_hh s_{t-1}, W_q s_{t-1}
        weights = weigh(projected[:, gates:] if query_weight is not None else current.h)  # (B, H, T_enc)
        context = attention.average(weights.unsqueeze(2), memory.keys, memory.projected_keys).squeeze(1)  # (B, d_k)
        x_gates = torch.addmm(table.index_select(0, prev_tokens), context, weight_context_t)  # (B, G·d)
        current = cell(x_gates, projected[:, :gates], current)
        logits = decoder.read_out(current.h, context, decoder.embedding(prev_tokens))  # (B, V)
        return logits, weights, DecoderState(_rnn_state(current), step=state.step + 1)

    return step


def luong_decoding(decoder, memory: Memory, reweigh: Reweigh | None = None) -> Stepper:
    """``LuongDecoder.step`` bound to ``memory``, as ``luong_input_feeding``'s loop computes it (with input
    feeding or without): the embedding's share of the input gates from a per-token table, the feed's by one
    matmul, the cell; one matmul of s_t for W_cs s_t and W_q s_t; W_cc c_t straight from the weights
    (``values_through``); h̃_t = tanh(W_cc c_t + W_cs s_t), logits W_s h̃_t. The same tokens as ``step``
    (tested); values within float rounding of it. ``reweigh``: each step's weights swapped before the
    context is taken from them (``Reweigh``)."""
    attention: Attention = decoder.attention
    hidden = decoder.hidden_size
    table, weight_feed, weight_hh, bias_hh = _token_input_gates(decoder)
    weight_cc, weight_cs = decoder.W_c.weight[:, : attention.key_dim], decoder.W_c.weight[:, attention.key_dim :]
    query_weight = attention.query_weight()  # (rows, d_s) or None
    after_weight_t = _and_query(weight_cs, query_weight).T  # (d_s, d_s [+ rows])
    through = attention.values_through(memory.keys, weight_cc)  # (B, H, T_enc, d_s): values × W_cc
    heads = through.shape[1]
    weight_hh_t, weight_feed_t = weight_hh.T, weight_feed.T  # (d_s, G·d), (d_s, G·d)
    weigh = _step_weights(attention, memory, reweigh)

    def step(prev_tokens: Tensor, state: DecoderState):
        current = split_state(state.rnn)
        input_gates = table.index_select(0, prev_tokens)  # (B, G·d): W_ie E y_{t-1} + b_ih
        if decoder.input_feeding:
            input_gates = torch.addmm(input_gates, state.feed, weight_feed_t)  # (B, G·d): + W_if h̃_{t-1}
        current = cell(input_gates, torch.addmm(bias_hh, current.h, weight_hh_t), current)  # s_t
        projected = current.h @ after_weight_t  # (B, d_s [+ rows]): W_cs s_t, W_q s_t
        weights = weigh(projected[:, hidden:] if query_weight is not None else current.h)  # (B, H, T_enc)
        context_part = (weights.unsqueeze(2) @ through).view(weights.shape[0], -1)  # (B, H·d_s): Σ_i α_i W_cc v_i
        if heads > 1:
            context_part = context_part.view(-1, heads, hidden).sum(1)  # (B, d_s): Σ_h W_cc,h c_t,h
        attentional = torch.tanh(context_part + projected[:, :hidden])  # (B, d_s): h̃_t = tanh(W_c [c_t; s_t])
        logits = decoder.W_s(attentional)  # (B, V)
        feed = attentional if decoder.input_feeding else None
        return logits, weights, DecoderState(_rnn_state(current), feed, state.step + 1)

    return step
