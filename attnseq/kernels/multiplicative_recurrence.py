"""The Bahdanau decoder's recurrence with a multiplicative score, as one autograd function for both cells.

It serves a scorer that declares ``fused_recurrence = "multiplicative"`` (dot, scaled dot, general:
e_t,h = λ K_h q_t,h with K = ``project_keys(keys)`` and the query the previous state itself, q_t = s_{t-1};
``kernels.multiplicative_attention_steps``). Teacher forcing runs, for t = 1..T_dec (one layer; the start
state from the encoder)::

    g_t = W_hh s_{t-1} + b_hh                                                      projected
    c_t = [α_t,1 V_1; …; α_t,H V_H]       α_t = softmax(λ K q_t), q_t = s_{t-1}; V_h the keys' head slice
    x_t = input_gates_t + W_ic c_t        input_gates_t = W_ie E y_{t-1} + b_ih      x_gates
    s_t = cell(x_t, g_t, s_{t-1})         GRU: ``gru_cell``; LSTM: ``lstm_cell(x_t + g_t, c_{t-1})``

— exactly ``BahdanauDecoder.step`` over the target (tested, values and gradients). The backward runs
the recurrence in reverse as ``kernels.additive_recurrence`` does, except that the score's δq_t is the
state's own: δs_{t-1} = (the cell's carry) + δg_t W_hh + δq_t. After the loop every parameter's gradient
for all steps at once (δW_hh, δb_hh, δW_ic, the attention's δV and δK).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from attnseq.kernels.additive_attention_steps import keys_as_values, keys_gradient, weight_gradients
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


class MultiplicativeBahdanauRecurrence(torch.autograd.Function):
    """``(input_gates, s_0, c_0, keys, projected_keys, valid, W_hh, b_hh, W_ic, scale)`` →
    ``(states (B, T_dec, d), contexts (B, T_dec, d_k), weights (B, H, T_dec, T_enc))``.

    - input_gates ``(B, T_dec, G·d)``: ``W_ie E y_{t-1} + b_ih`` for every step, G = 3 (GRU) or 4 (LSTM);
    - s_0 ``(B, d)``; c_0 ``(B, d)`` for an LSTM, None for a GRU;
    - keys ``(B, T_enc, d_k)``: the values, split by head; projected_keys ``(B, H, T_enc, a)``: K, a = d / H
      (dot: each head reads its slice of s) or a = d (general: every head reads all of it);
    - valid ``(B, T_enc)`` bool; W_hh ``(G·d, d)``, b_hh ``(G·d,)``; W_ic ``(G·d, d_k)``; scale λ, a float.
    """

    @staticmethod
    def forward(ctx, input_gates, s0, c0, keys, projected_keys, valid, w_hh, b_hh, w_ic, scale):
        batch, steps, gates = input_gates.shape
        d = s0.shape[-1]
        lstm = c0 is not None
        heads = projected_keys.shape[1]
        ctx.set_materialize_grads(False)
        attention = MultiplicativeAttentionSteps(
            keys_as_values(keys, heads), projected_keys, valid, scale, steps, d, heads_summed=False
        )
        w_hh_t, w_ic_t = w_hh.T, w_ic.T  # (d, G·d), (d_k, G·d)
        states = input_gates.new_empty(steps + 1, batch, d)  # s_0..s_T, time-major while stepping
        projected = input_gates.new_empty(steps, batch, gates)  # g_t
        cell_buffers = step_buffers(input_gates, steps, d, c0)
        cells, activated, cell_tanh = cell_buffers if lstm else (None, None, None)
        reset_update, candidate = (None, None) if lstm else cell_buffers
        states[0] = s0
        for t in range(steps):
            hidden_gates = torch.addmm(b_hh, states[t], w_hh_t, out=projected[t])  # (B, G·d): g_t
            context = attention.step(t, states[t])  # (B, d_k): c_t, q_t = s_{t-1}
            if lstm:
                pre = torch.add(input_gates[:, t], hidden_gates, out=activated[t]).addmm_(context, w_ic_t)  # x_t + g_t
                lstm_cell(pre, cells[t], LSTMActivations(activated[t], cells[t + 1], cell_tanh[t], states[t + 1]))
            else:
                x_gates = torch.addmm(input_gates[:, t], context, w_ic_t)  # (B, 3d): x_t
                gru_cell(x_gates, hidden_gates, states[t], GRUActivations(reset_update[t], candidate[t], states[t + 1]))
        # the intermediates rule out double backward (``once_differentiable``); saved this way, autograd's
        # saved-tensor hooks see them
        ctx.save_for_backward(keys, projected_keys, w_hh, w_ic, states, projected, attention.contexts,
                              attention.weights, *cell_buffers)
        ctx.lstm, ctx.scale = lstm, scale
        return states[1:].transpose(0, 1), attention.contexts_out(), attention.outputs()  # (B, T, d), (B, T, d_k), α

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_states, grad_contexts, grad_weights):
        keys, projected_keys, w_hh, w_ic, states, projected, contexts, weights, *cell_buffers = ctx.saved_tensors
        steps, batch, gates = projected.shape
        d = states.shape[-1]
        heads = projected_keys.shape[1]
        grad_states = grad_states.transpose(0, 1) if grad_states is not None else None  # (T, B, d)
        previous = states[:-1]  # (T, B, d): s_0..s_{T-1}, each step's query and projection's input
        attention = MultiplicativeAttentionStepGradients(
            keys_as_values(keys, heads), projected_keys, ctx.scale, weights, previous, grad_weights,
            grad_contexts, heads_summed=False,
        )
        if ctx.lstm:
            cells, activated, cell_tanh = cell_buffers
            partials = lstm_partials(activated, cell_tanh, cells[:-1])
        else:
            reset_update, candidate = cell_buffers
            partials = gru_partials(reset_update, candidate, projected[..., 2 * d:], previous)
        d_projected = states.new_empty(steps, batch, gates)  # δg_t
        # δx_t; an LSTM's is its δg_t, read in place
        d_x_gates = d_projected if ctx.lstm else states.new_empty(steps, batch, gates)
        d_query = states.new_empty(batch, d)  # δq_t: δs_{t-1}'s share through the score
        dh = states.new_zeros(batch, d)  # δs_t
        dc = states.new_zeros(batch, d)  # LSTM: δc_t, carried
        for t in range(steps - 1, -1, -1):
            if grad_states is not None:
                dh = dh + grad_states[t]
            dp = d_projected[t]
            if ctx.lstm:
                dc = torch.addcmul(dc, dh, partials.state_to_cell[t])  # (B, d): δc_t
                torch.mul(dc.unsqueeze(1), partials.cell_gates[t], out=dp[:, : 3 * d].view(batch, 3, d))  # δi, δf, δg
                torch.mul(dh, partials.output_gate[t], out=dp[:, 3 * d:])  # δo
                carry = None
                dc = dc * partials.carry[t]  # (B, d): δc_{t-1}
            else:
                dx = d_x_gates[t]
                torch.mul(dh.unsqueeze(1), partials.hidden_gates[t], out=dp.view(batch, 3, d))  # δg_t
                dx[:, : 2 * d] = dp[:, : 2 * d]
                torch.mul(dh, partials.input_candidate[t], out=dx[:, 2 * d:])  # δx_t
                carry = dh * partials.carry[t]  # (B, d): through z
            attention.step(t, d_x_gates[t], w_ic, d_query)  # δc_t = δx_t W_ic (+ the output's) → δq_t
            dh = torch.addmm(d_query if carry is None else carry.add_(d_query), dp, w_hh)  # (B, d): δs_{t-1}
        d_w_hh, d_b_hh, d_w_ic = weight_gradients(d_projected, previous, d_x_gates, contexts)
        d_values, d_projected_keys = attention.gradients()
        d_keys = keys_gradient(d_values)  # (B, T_enc, d_k)
        d_input_gates = d_x_gates.transpose(0, 1)  # (B, T, G·d)
        return (d_input_gates, dh, dc if ctx.lstm else None, d_keys, d_projected_keys, None, d_w_hh, d_b_hh, d_w_ic,
                None)
