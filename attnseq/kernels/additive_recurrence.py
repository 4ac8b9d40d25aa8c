"""The Bahdanau decoder's recurrence with an additive score, as one autograd function per cell.

It serves a scorer that declares ``fused_recurrence = "additive"``: its score is
e = vᵀ tanh(q + K) with q = W_q s (``query_weight``), K = ``project_keys(keys)`` and v = ``v_a``,
per head. Teacher forcing runs, for t = 1..T_dec (one layer; the start state from the encoder)::

    [g_t; q_t] = W_state s_{t-1} + b_state      g_t = W_hh s_{t-1} + b_hh, q_t = W_q s_{t-1}   projected
    c_t        = attention(q_t)                 ``kernels.additive_attention_steps``          contexts
    x_t        = input_gates_t + W_ic c_t       input_gates_t = W_ie E y_{t-1} + b_ih          x_gates
    s_t        = cell(x_t, g_t, s_{t-1})        GRU: ``gru_cell``; LSTM: ``lstm_cell(x_t + g_t, c_{t-1})``

— exactly ``BahdanauDecoder.step`` over the target (tested, values and gradients). The backward
runs the recurrence in reverse for the state alone, with δ· the loss's gradient and δs_t the sum
of the output's and the recurrence's; per step the cell turns δs_t into [δg_t; δx_t], the
attention turns δx_t into δq_t (``AdditiveAttentionStepGradients``), and::

    GRU (P = gru_partials):   δg_t = δs_t ⊙ P_t.hidden_gates
                              δx_t = [δg_t's r, z blocks; δs_t ⊙ P_t.input_candidate]
                              δs_{t-1} = δs_t ⊙ z_t + [δg_t; δq_t] W_state
    LSTM (P = lstm_partials): δc_t = δc_t(carried) + δh_t ⊙ P_t.state_to_cell
                              δa_t = [δc_t ⊙ P_t.cell_gates; δh_t ⊙ P_t.output_gate] = δg_t = δx_t
                              δh_{t-1} = [δa_t; δq_t] W_state,  δc_{t-1} = δc_t ⊙ σ(f_t)

After the loop, every parameter's gradient for all steps at once, as a few large products
(δW_state = Σ_t [δg_t; δq_t]ᵀ s_{t-1}, δb_state = Σ_t [δg_t; δq_t], δW_ic = Σ_t δx_tᵀ c_t, and the
attention's δkeys, δK2, δv).

The forward keeps σ_t of every step, up to ``additive_attention_steps.KEEP_SIGMA_BYTES`` in all
(in blocks of steps, ``kernels.buffers``); the backward reads them back instead of recomputing
them (past that size it recomputes each from the stored q_t, into one buffer).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnseq.kernels.additive_attention_steps import (
    AdditiveAttentionStepGradients,
    AdditiveAttentionSteps,
    keys_as_values,
    keys_gradient,
    weight_gradients,
)
from attnseq.kernels.cells import GRUActivations, LSTMActivations, gru_cell, gru_partials, lstm_cell, lstm_partials


def supports(input_gates: Tensor) -> bool:
    """Full-precision inputs outside autocast: the function keeps its buffers in the input dtype and
    does not cast (under autocast the decoder's autograd loop runs instead)."""
    return input_gates.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(
        input_gates.device.type
    )


class AdditiveGRURecurrence(torch.autograd.Function):
    """``(input_gates, s_0, keys, doubled_keys, valid, W_state, b_state, W_ic, v)`` →
    ``(states (B, T_dec, d), contexts (B, T_dec, d_k), weights (B, H, T_dec, T_enc))``.

    - input_gates ``(B, T_dec, 3d)``: ``W_ie E y_{t-1} + b_ih`` for every step;
    - s_0 ``(B, d)``; keys ``(B, T_enc, d_k)``, the values too; doubled_keys ``(B, H, T_enc, a)``: K2 = 2K;
    - valid ``(B, T_enc)`` bool; W_state ``(3d + H·a, d)`` = [W_hh; W_q], b_state ``(3d + H·a,)`` = [b_hh; 0];
    - W_ic ``(3d, d_k)``: the context's input columns of the GRU; v ``(H, a)``.
    """

    @staticmethod
    def forward(ctx, input_gates, s0, keys, doubled_keys, valid, w_state, b_state, w_ic, v):
        batch, steps, gates = input_gates.shape
        d = gates // 3
        w_state_t, w_ic_t = w_state.T, w_ic.T  # (d, 3d + H·a), (d_k, 3d)
        ctx.set_materialize_grads(False)
        attention = AdditiveAttentionSteps(
            keys_as_values(keys, v.shape[0]), doubled_keys, valid, v, steps
        )
        states = input_gates.new_empty(steps, batch, d)  # s_1..s_T, time-major while stepping
        projected = input_gates.new_empty(steps, batch, w_state.shape[0])  # [g_t; q_t]
        reset_update = input_gates.new_empty(steps, batch, 2 * d)  # r, z
        candidate = input_gates.new_empty(steps, batch, d)  # n
        h = s0
        for t in range(steps):
            step_projected = torch.addmm(b_state, h, w_state_t, out=projected[t])  # (B, 3d + H·a): [g_t; q_t]
            context = attention.step(t, step_projected[:, gates:])  # (B, d_k): c_t
            x_gates = torch.addmm(input_gates[:, t], context, w_ic_t)  # (B, 3d): x_t
            h = gru_cell(
                x_gates, step_projected[:, :gates], h, GRUActivations(reset_update[t], candidate[t], states[t])
            )  # (B, d)
        # The intermediates (made here, neither inputs nor outputs) rule out double backward, which
        # ``once_differentiable`` states; saved this way, autograd's saved-tensor hooks see them.
        ctx.save_for_backward(
            s0, keys, doubled_keys, w_state, w_ic, v,
            states, attention.contexts, attention.weights, projected, reset_update, candidate, *attention.sigmas,
        )
        return states.transpose(0, 1), *attention.outputs()  # (B, T_dec, d), (B, T_dec, d_k), (B, H, T_dec, T_enc)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_states, grad_contexts, grad_weights):
        (s0, keys, doubled_keys, w_state, w_ic, v, states, contexts, weights, projected, reset_update, candidate,
         *sigmas) = ctx.saved_tensors
        steps, batch, d = states.shape
        gates = 3 * d
        grad_states = grad_states.transpose(0, 1) if grad_states is not None else None  # (T, B, d)
        previous = torch.cat([s0.unsqueeze(0), states[:-1]])  # (T, B, d): s_0..s_{T-1}
        partials = gru_partials(reset_update, candidate, projected[..., 2 * d : gates], previous)
        attention = AdditiveAttentionStepGradients(
            keys_as_values(keys, v.shape[0]), doubled_keys, v, weights, tuple(sigmas), projected[..., gates:],
            grad_contexts, grad_weights,
        )

        d_projected = states.new_empty(steps, batch, w_state.shape[0])  # [δg_t; δq_t]
        d_x_gates = states.new_empty(steps, batch, gates)  # δx_t
        dh = s0.new_zeros(batch, d)  # δs_t
        for t in range(steps - 1, -1, -1):
            if grad_states is not None:
                dh = dh + grad_states[t]
            dx, dp = d_x_gates[t], d_projected[t]
            torch.mul(dh.unsqueeze(1), partials.hidden_gates[t], out=dp[:, :gates].view(batch, 3, d))  # δg_t
            dx[:, : 2 * d] = dp[:, : 2 * d]
            torch.mul(dh, partials.input_candidate[t], out=dx[:, 2 * d :])  # δx_t
            attention.step(t, dx, w_ic, dp[:, gates:])  # δq_t
            dh = torch.addmm(dh * partials.carry[t], dp, w_state)  # (B, d): δs_{t-1}
        d_w_state, d_b_state, d_w_ic = weight_gradients(d_projected, previous, d_x_gates, contexts)
        d_values, d_doubled_keys, d_v = attention.gradients()
        d_keys = keys_gradient(d_values)  # (B, T_enc, d_k)
        d_input_gates = d_x_gates.transpose(0, 1)  # (B, T, 3d)
        return d_input_gates, dh, d_keys, d_doubled_keys, None, d_w_state, d_b_state, d_w_ic, d_v


class AdditiveLSTMRecurrence(torch.autograd.Function):
    """``(input_gates, h_0, c_0, keys, doubled_keys, valid, W_state, b_state, W_ic, v)`` →
    ``(states (B, T_dec, d), contexts (B, T_dec, d_k), weights (B, H, T_dec, T_enc))``, the states
    h_1..h_T (an LSTM's cells are not read outside the recurrence).

    As ``AdditiveGRURecurrence`` with 4d gates (i, f, g, o): input_gates ``(B, T_dec, 4d)``,
    h_0, c_0 ``(B, d)``, W_state ``(4d + H·a, d)`` = [W_hh; W_q], b_state = [b_hh; 0], W_ic ``(4d, d_k)``.
    """

    @staticmethod
    def forward(ctx, input_gates, h0, c0, keys, doubled_keys, valid, w_state, b_state, w_ic, v):
        batch, steps, gates = input_gates.shape
        d = gates // 4
        w_state_t, w_ic_t = w_state.T, w_ic.T  # (d, 4d + H·a), (d_k, 4d)
        ctx.set_materialize_grads(False)
        attention = AdditiveAttentionSteps(
            keys_as_values(keys, v.shape[0]), doubled_keys, valid, v, steps
        )
        states = input_gates.new_empty(steps + 1, batch, d)  # h_0..h_T, time-major while stepping
        cells = input_gates.new_empty(steps + 1, batch, d)  # c_0..c_T
        activated = input_gates.new_empty(steps, batch, gates)  # σ(i), σ(f), tanh(g), σ(o)
        cell_tanh = input_gates.new_empty(steps, batch, d)  # tanh(c_1)..tanh(c_T)
        projected = input_gates.new_empty(steps, batch, w_state.shape[0])  # [g_t; q_t]
        states[0], cells[0] = h0, c0
        for t in range(steps):
            step_projected = torch.addmm(b_state, states[t], w_state_t, out=projected[t])  # (B, 4d + H·a)
            context = attention.step(t, step_projected[:, gates:])  # (B, d_k): c_t
            pre = torch.add(input_gates[:, t], step_projected[:, :gates], out=activated[t]).addmm_(
                context, w_ic_t
            )  # (B, 4d): x_t + g_t
            lstm_cell(pre, cells[t], LSTMActivations(activated[t], cells[t + 1], cell_tanh[t], states[t + 1]))
        ctx.save_for_backward(
            keys, doubled_keys, w_state, w_ic, v,
            states, cells, activated, cell_tanh, projected, attention.contexts, attention.weights, *attention.sigmas,
        )
        return states[1:].transpose(0, 1), *attention.outputs()  # (B, T_dec, d), (B, T_dec, d_k), (B, H, T, T_enc)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_states, grad_contexts, grad_weights):
        (keys, doubled_keys, w_state, w_ic, v, states, cells, activated, cell_tanh, projected, contexts, weights,
         *sigmas) = ctx.saved_tensors
        steps, batch, d = cell_tanh.shape
        gates = 4 * d
        grad_states = grad_states.transpose(0, 1) if grad_states is not None else None  # (T, B, d)
        partials = lstm_partials(activated, cell_tanh, cells[:-1])
        attention = AdditiveAttentionStepGradients(
            keys_as_values(keys, v.shape[0]), doubled_keys, v, weights, tuple(sigmas), projected[..., gates:],
            grad_contexts, grad_weights,
        )

        d_projected = states.new_empty(steps, batch, w_state.shape[0])  # [δa_t; δq_t]
        dh = states.new_zeros(batch, d)  # δh_t
        dc = states.new_zeros(batch, d)  # δc_t, carried
        for t in range(steps - 1, -1, -1):
            if grad_states is not None:
                dh = dh + grad_states[t]
            dc = torch.addcmul(dc, dh, partials.state_to_cell[t])  # (B, d): δc_t
            dp = d_projected[t]
            torch.mul(dc.unsqueeze(1), partials.cell_gates[t], out=dp[:, : 3 * d].view(batch, 3, d))  # δi, δf, δg
            torch.mul(dh, partials.output_gate[t], out=dp[:, 3 * d : gates])  # δo
            attention.step(t, dp[:, :gates], w_ic, dp[:, gates:])  # δq_t
            dc = dc * partials.carry[t]  # (B, d): δc_{t-1}
            dh = dp @ w_state  # (B, d): δh_{t-1}
        d_x_gates = d_projected[..., :gates]  # (T, B, 4d): δa_t, the input side's and the hidden side's
        d_w_state, d_b_state, d_w_ic = weight_gradients(d_projected, states[:-1], d_x_gates, contexts)
        d_values, d_doubled_keys, d_v = attention.gradients()
        d_keys = keys_gradient(d_values)  # (B, T_enc, d_k)
        d_input_gates = d_x_gates.transpose(0, 1)  # (B, T, 4d)
        return d_input_gates, dh, dc, d_keys, d_doubled_keys, None, d_w_state, d_b_state, d_w_ic, d_v
