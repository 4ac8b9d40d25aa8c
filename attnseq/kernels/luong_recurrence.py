"""The Luong decoder's input-feeding recurrence, as one autograd function per score family.

``AdditiveLuongRecurrence`` serves a scorer that declares ``fused_recurrence = "additive"`` (e = vᵀ
tanh(q + K) per head, q = W_q s, K = ``project_keys(keys)``); ``MultiplicativeLuongRecurrence`` one
that declares ``"multiplicative"`` (e_h = λ K_h q_h with q = s itself: dot, scaled dot, general;
``kernels.multiplicative_attention_steps``), where W_state has no query rows and δq_t joins δs_t
directly. The cell's half of both is the same code (``luong_forward``, ``luong_backward``). Teacher
forcing runs, for t = 1..T_dec (one layer; s_0
from the encoder, h̃_0 = 0 from ``LuongDecoder.init_state``)::

    x_t = input_gates_t + W_f h̃_{t-1}          input_gates_t = W_ie E y_{t-1} + b_ih         x_gates
    s_t = cell(x_t, g_t, s_{t-1})              GRU: ``gru_cell``; LSTM: ``lstm_cell(x_t + g_t, c_{t-1})``
    [g_{t+1}; W_cs s_t; q_t] = W_state s_t + b_state                  (g_1 from s_0 alike)  projected
    c_t = Σ_h α_t,h V_h                        ``kernels.additive_attention_steps``, heads summed
    h̃_t = tanh(c_t + W_cs s_t)                                                              feeds

with the values V_h = the head's keys × its block of W_cc (``Attention.values_through``, computed
once per batch under autograd), so that c_t is W_cc [c_t,1; …; c_t,H] — exactly
``LuongDecoder.step`` over the target (tested, values and gradients). The backward runs the
recurrence in reverse, with δ· the loss's gradient; per step t = T..1::

    δh̃_t  = the output's δh̃_t + δx_{t+1} W_f
    δc_t  = δh̃_t ⊙ (1 − h̃_t²) = δ(W_cs s_t)  → the attention's δq_t (``AdditiveAttentionStepGradients``)
    δs_t  = (the cell's carry from t+1) + [δg_{t+1}; δ(W_cs s_t); δq_t] W_state
    the cell at t: δs_t → δg_t = δx_t's hidden side, δx_t, and the carry to s_{t-1}
                   (as in ``kernels.additive_recurrence``: GRU through ``gru_partials``, LSTM
                   through ``lstm_partials`` with its cell state)

and after the loop δs_0 and δh̃_0, and every parameter's gradient for all steps at once
(δW_state = Σ_t δp_tᵀ s_t over t = 0..T, δb_state, δW_f = Σ_t δx_tᵀ h̃_{t-1}, the attention's δV,
δK2, δv). σ_t of every step is kept (in blocks of steps) or recomputed as
``additive_attention_steps.keeps_sigmas`` says.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from attnseq.kernels.additive_attention_steps import (
    AdditiveAttentionStepGradients,
    AdditiveAttentionSteps,
    weight_gradients,
)
from attnseq.kernels.cells import (
    GRUActivations,
    LSTMActivations,
    gru_cell,
    gru_partials,
    lstm_cell,
    lstm_partials,
    step_buffers,
)
from attnseq.kernels.multiplicative_attention_steps import (
    MultiplicativeAttentionStepGradients,
    MultiplicativeAttentionSteps,
)


class AdditiveLuongRecurrence(torch.autograd.Function):
    """``(input_gates, s_0, c_0, h̃_0, values, doubled_keys, valid, W_state, b_state, W_f, v)`` →
    ``(feeds h̃_1..h̃_T (B, T_dec, d), weights (B, H, T_dec, T_enc))``.

    - input_gates ``(B, T_dec, G·d)``: ``W_ie E y_{t-1} + b_ih`` for every step, G = 3 (GRU) or 4 (LSTM);
    - s_0 ``(B, d)``; c_0 ``(B, d)`` for an LSTM, None for a GRU; h̃_0 ``(B, d)``;
    - values ``(B, H, T_enc, d)``: V_h, each head's keys through its block of W_cc;
    - doubled_keys ``(B, H, T_enc, a)``: K2 = 2K; valid ``(B, T_enc)`` bool;
    - W_state ``(G·d + d + H·a, d)`` = [W_hh; W_cs; W_q], b_state = [b_hh; 0; 0];
    - W_f ``(G·d, d)``: the feed's input columns of the RNN; v ``(H, a)``.
    """

    @staticmethod
    def forward(ctx, input_gates, s0, c0, feed0, values, doubled_keys, valid, w_state, b_state, w_f, v):
        ctx.set_materialize_grads(False)
        attention = AdditiveAttentionSteps(values, doubled_keys, valid, v, input_gates.shape[1], heads_summed=True)
        loop = luong_forward(input_gates, s0, c0, feed0, w_state, b_state, w_f, attention, query_is_state=False)
        # The intermediates (made here, neither inputs nor outputs) rule out double backward, which
        # ``once_differentiable`` states; saved this way, autograd's saved-tensor hooks see them.
        ctx.save_for_backward(values, doubled_keys, w_state, w_f, v, attention.weights, *loop, *attention.sigmas)
        ctx.lstm, ctx.sigma_blocks = c0 is not None, len(attention.sigmas)
        return loop[1][1:].transpose(0, 1), attention.outputs()[1]  # (B, T_dec, d), (B, H, T_dec, T_enc)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_feeds, grad_weights):
        values, doubled_keys, w_state, w_f, v, weights, *loop = ctx.saved_tensors
        loop, sigmas = loop[: len(loop) - ctx.sigma_blocks], tuple(loop[len(loop) - ctx.sigma_blocks :])
        gates, d = w_f.shape[0], w_f.shape[1]
        attention = AdditiveAttentionStepGradients(
            values, doubled_keys, v, weights, sigmas, loop[2][1:, :, gates + d :], None, grad_weights,
            heads_summed=True,
        )
        grads = luong_backward(grad_feeds, attention, w_state, w_f, loop, ctx.lstm, query_is_state=False)
        d_input_gates, d_s0, d_c0, d_feed, d_w_state, d_b_state, d_w_f = grads
        d_values, d_doubled_keys, d_v = attention.gradients()
        return d_input_gates, d_s0, d_c0, d_feed, d_values, d_doubled_keys, None, d_w_state, d_b_state, d_w_f, d_v


class MultiplicativeLuongRecurrence(torch.autograd.Function):
    """``(input_gates, s_0, c_0, h̃_0, values, keys, valid, W_state, b_state, W_f, scale)`` →
    ``(feeds h̃_1..h̃_T (B, T_dec, d), weights (B, H, T_dec, T_enc))``: the recurrence with a
    multiplicative score e_t,h = λ K_h q_t,h whose query is the state itself, q_t = s_t
    (``kernels.multiplicative_attention_steps``).

    - input_gates, s_0, c_0, h̃_0, values, valid and W_f as ``AdditiveLuongRecurrence`` takes them;
    - keys ``(B, H, T_enc, a)``: K = ``project_keys``, a = d / H (dot: each head reads its slice of s_t)
      or a = d (general: every head reads all of it); scale λ, a float;
    - W_state ``(G·d + d, d)`` = [W_hh; W_cs], b_state = [b_hh; 0].
    """

    @staticmethod
    def forward(ctx, input_gates, s0, c0, feed0, values, keys, valid, w_state, b_state, w_f, scale):
        ctx.set_materialize_grads(False)
        attention = MultiplicativeAttentionSteps(values, keys, valid, scale, input_gates.shape[1], s0.shape[-1])
        loop = luong_forward(input_gates, s0, c0, feed0, w_state, b_state, w_f, attention, query_is_state=True)
        ctx.save_for_backward(values, keys, w_state, w_f, attention.weights, *loop)
        ctx.lstm, ctx.scale = c0 is not None, scale
        return loop[1][1:].transpose(0, 1), attention.outputs()  # (B, T_dec, d), (B, H, T_dec, T_enc)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_feeds, grad_weights):
        values, keys, w_state, w_f, weights, *loop = ctx.saved_tensors
        attention = MultiplicativeAttentionStepGradients(values, keys, ctx.scale, weights, loop[0][1:], grad_weights)
        grads = luong_backward(grad_feeds, attention, w_state, w_f, loop, ctx.lstm, query_is_state=True)
        d_input_gates, d_s0, d_c0, d_feed, d_w_state, d_b_state, d_w_f = grads
        d_values, d_keys = attention.gradients()
        return d_input_gates, d_s0, d_c0, d_feed, d_values, d_keys, None, d_w_state, d_b_state, d_w_f, None


def luong_forward(input_gates, s0, c0, feed0, w_state, b_state, w_f, attention, query_is_state: bool) -> tuple:
    """The recurrence's forward with ``attention`` (``step(t, q_t) → c_t``): q_t is s_t itself
    (``query_is_state``) or the last rows of s_t's projection. Returns the buffers the backward reads:
    states s_0..s_T, feeds h̃_0..h̃_T, projections, then the cell's own (an LSTM's c, activations and
    tanh(c); a GRU's r, z and n), each ``(T or T + 1, B, ·)``."""
    batch, steps, gates = input_gates.shape
    d = s0.shape[-1]
    lstm = c0 is not None
    w_f = w_f.contiguous()  # a column block of the RNN's input weight, read every step
    w_state_t, w_f_t = w_state.T, w_f.T  # (d, G·d + d [+ H·a]), (d, G·d)
    states = input_gates.new_empty(steps + 1, batch, d)  # s_0..s_T, time-major while stepping
    feeds = input_gates.new_empty(steps + 1, batch, d)  # h̃_0..h̃_T
    projected = input_gates.new_empty(steps + 1, batch, w_state.shape[0])  # [g_{t+1}; W_cs s_t (; q_t)]
    cell_buffers = step_buffers(input_gates, steps, d, c0)
    cells, activated, cell_tanh = cell_buffers if lstm else (None, None, None)
    reset_update, candidate = (None, None) if lstm else cell_buffers
    states[0], feeds[0] = s0, feed0
    torch.addmm(b_state, s0, w_state_t, out=projected[0])  # (B, rows): g_1 (the rest unread)
    for t in range(1, steps + 1):
        x_gates = torch.addmm(input_gates[:, t - 1], feeds[t - 1], w_f_t)  # (B, G·d): x_t
        hidden_gates = projected[t - 1, :, :gates]  # (B, G·d): g_t
        if lstm:
            pre = torch.add(x_gates, hidden_gates, out=activated[t - 1])  # (B, 4d): x_t + g_t
            lstm_cell(pre, cells[t - 1], LSTMActivations(activated[t - 1], cells[t], cell_tanh[t - 1], states[t]))
        else:
            activations = GRUActivations(reset_update[t - 1], candidate[t - 1], states[t])
            gru_cell(x_gates, hidden_gates, states[t - 1], activations)
        step_projected = torch.addmm(b_state, states[t], w_state_t, out=projected[t])  # (B, rows)
        query = states[t] if query_is_state else step_projected[:, gates + d :]  # (B, d) or (B, H·a)
        context = attention.step(t - 1, query)  # (B, d): c_t
        torch.add(context, step_projected[:, gates : gates + d], out=feeds[t]).tanh_()  # (B, d): h̃_t
    return states, feeds, projected, *cell_buffers


def luong_backward(grad_feeds, attention, w_state, w_f, loop, lstm: bool, query_is_state: bool) -> tuple:
    """The recurrence's backward from the feeds' gradient ``(B, T, d)`` (or None) and ``attention``'s
    gradients (``context_step(t, δq_t)`` from the δc_t in its ``d_contexts[t]``) over ``luong_forward``'s
    buffers: δinput_gates, δs_0, δc_0 (LSTM; else None), δh̃_0, δW_state, δb_state, δW_f."""
    states, feeds, projected, *cell_buffers = loop
    steps, batch, d = states.shape[0] - 1, states.shape[1], states.shape[2]
    gates = w_f.shape[0]
    grad_feeds = grad_feeds.transpose(0, 1) if grad_feeds is not None else None  # (T, B, d)
    if lstm:
        cells, activated, cell_tanh = cell_buffers
        partials = lstm_partials(activated, cell_tanh, cells[:-1])
    else:
        reset_update, candidate = cell_buffers
        partials = gru_partials(reset_update, candidate, projected[:-1, :, 2 * d : gates], states[:-1])
    d_projected = states.new_empty(steps + 1, batch, w_state.shape[0])  # [δg_{t+1}; δ(W_cs s_t) (; δq_t)]
    d_projected[steps, :, :gates] = 0  # no g_{T+1}
    d_projected[0, :, gates:] = 0  # s_0 reaches neither h̃ nor a score
    d_query = states.new_empty(batch, d) if query_is_state else None  # δq_t = δs_t's share through the score
    # δx_t; an LSTM's is its δg_t, read in place
    d_x_gates = d_projected[:-1, :, :gates] if lstm else states.new_empty(steps, batch, gates)
    d_feed = feeds.new_zeros(batch, d)  # δh̃_t from x_{t+1}
    carry = states.new_zeros(batch, d)  # the cell's δs_t from step t+1: GRU δs ⊙ z; LSTM none
    d_cell = states.new_zeros(batch, d)  # LSTM: δc_t, carried
    for t in range(steps, 0, -1):
        if grad_feeds is not None:
            d_feed = d_feed + grad_feeds[t - 1]
        dp = d_projected[t]
        d_context = attention.d_contexts[t - 1].view(batch, d)  # (B, d): δc_t
        torch.mul(d_feed, 1 - feeds[t] * feeds[t], out=d_context)  # δc_t = δh̃_t ⊙ (1 − h̃_t²)
        dp[:, gates : gates + d] = d_context  # δ(W_cs s_t)
        if query_is_state:
            attention.context_step(t - 1, d_query)  # δq_t = δs_t through the score
            d_state = torch.addmm(carry + d_query, dp, w_state)  # (B, d): δs_t
        else:
            attention.context_step(t - 1, dp[:, gates + d :])  # δq_t, a row block of δp_t
            d_state = torch.addmm(carry, dp, w_state)  # (B, d): δs_t
        dp_cell = d_projected[t - 1]  # δg_t goes into s_{t-1}'s projection
        if lstm:
            d_cell = torch.addcmul(d_cell, d_state, partials.state_to_cell[t - 1])  # (B, d): δc_t
            torch.mul(
                d_cell.unsqueeze(1), partials.cell_gates[t - 1], out=dp_cell[:, : 3 * d].view(batch, 3, d)
            )  # δi, δf, δg
            torch.mul(d_state, partials.output_gate[t - 1], out=dp_cell[:, 3 * d : gates])  # δo
            d_cell = d_cell * partials.carry[t - 1]  # (B, d): δc_{t-1}
        else:
            dx = d_x_gates[t - 1]
            torch.mul(
                d_state.unsqueeze(1), partials.hidden_gates[t - 1], out=dp_cell[:, :gates].view(batch, 3, d)
            )  # δg_t
            dx[:, : 2 * d] = dp_cell[:, : 2 * d]
            torch.mul(d_state, partials.input_candidate[t - 1], out=dx[:, 2 * d :])  # δx_t
            carry = d_state * partials.carry[t - 1]  # (B, d)
        d_feed = d_x_gates[t - 1] @ w_f  # (B, d): δh̃_{t-1}
    d_s0 = torch.addmm(carry, d_projected[0, :, :gates], w_state[:gates])  # (B, d): δs_0
    d_w_state, d_b_state, d_w_f = weight_gradients(d_projected, states, d_x_gates, feeds[:-1])
    d_input_gates = d_x_gates.transpose(0, 1)  # (B, T, G·d)
    return d_input_gates, d_s0, d_cell if lstm else None, d_feed, d_w_state, d_b_state, d_w_f
