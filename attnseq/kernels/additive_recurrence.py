"""The Bahdanau decoder's recurrence with an additive score, as one autograd function.

It serves a scorer that declares ``fused_recurrence = "additive"``: its score is
e = vᵀ tanh(q + K) with q = W_q s (``query_weight``), K = ``project_keys(keys)`` and v = ``v_a``,
per head. Teacher forcing runs, for t = 1..T_dec (GRU, one layer; s_0 from the encoder; per head,
a = d_attn / H; V the keys split by head, which are also the values)::

    [g_t; q_t] = W_state s_{t-1} + b_state      g_t = W_hh s_{t-1} + b_hh, q_t = W_q s_{t-1}   projected
    σ_t  = σ(K2 + 2 q_t)                        K2 = 2K, once per batch                        sigma
    e_t  = 2 σ_t v − Σ v                        = vᵀ tanh(q_t + K), since tanh(u) = 2σ(2u) − 1  scores
    α_t  = masked softmax(e_t)                  padding gets exactly 0                         weights
    c_t  = α_t V                                                                               contexts
    x_t  = input_gates_t + W_ic c_t             input_gates_t = W_ie E y_{t-1} + b_ih          x_gates
    s_t  = gru_cell(x_t, g_t, s_{t-1})                                                         states

— exactly ``BahdanauDecoder.step`` over the target (tested, values and gradients). The backward
runs the recurrence in reverse for the state alone, with δ· the loss's gradient, δs_t the sum of
the output's and the recurrence's, and P = ``gru_partials`` of the stored activations::

    δg_t      = δs_t ⊙ P_t.hidden_gates                   δx_t = [δg_t's r, z blocks; δs_t ⊙ P_t.input_candidate]
    δc_t      = δx_t W_ic  (+ the output's δc_t)
    δα_t      = δc_t Vᵀ    (+ the output's δα_t)
    δe_t      = α_t ⊙ (δα_t − Σ_i α_{t,i} δα_{t,i})       through the softmax
    σ'_t      = σ_t ⊙ (1 − σ_t)                           sigma_slope
    ρ_t       = Σ_i δe_{t,i} σ'_{t,i}                     (B, H, a): slope_sum
    δq_t      = 4 v ⊙ ρ_t                                 (u = K2 + 2q: δu = (δe ⊗ 2v) ⊙ σ', δq = 2 Σ_i δu_i)
    δs_{t-1}  = δs_t ⊙ z_t + [δg_t; δq_t] W_state

and, after the loop, every parameter's gradient for all steps at once, as a few large products::

    δW_state = Σ_t [δg_t; δq_t]ᵀ s_{t-1}     δb_state = Σ_t [δg_t; δq_t]     δW_ic = Σ_t δx_tᵀ c_t
    δkeys    = Σ_t α_tᵀ δc_t                  (through the values)
    δK2      = 2v ⊙ Σ_t δe_t ⊗ σ'_t           (v factors out of every sum over steps)
    δv       = Σ_{t,i} δe_{t,i} (2σ_{t,i} − 1)

The forward keeps σ_t of every step, up to ``KEEP_SIGMA_BYTES`` in all; the backward reads them
back instead of recomputing them (past that size it recomputes each from the stored q_t, into one
buffer). Keeping them is the faster choice only while freed memory is reused rather than faulted
in afresh on every step: training processes arrange that
(``attnseq.training.process.keep_freed_memory``); the measurements are in benchmarks/results.md.
The σ form of tanh is used because ATen's CPU ``tanh`` is slower than its ``sigmoid``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnseq.kernels.cells import GRUActivations, gru_cell, gru_partials

KEEP_SIGMA_BYTES = 256 * 2**20
"""Up to this size the σ_t of every step are kept for the backward pass; past it, recomputed."""


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
        heads, t_enc, a = doubled_keys.shape[1], doubled_keys.shape[2], doubled_keys.shape[3]
        d_h = keys.shape[-1] // heads
        values = keys.view(batch, t_enc, heads, d_h).transpose(1, 2)  # (B, H, T_enc, d_h): V
        invalid = ~valid[:, None, :]  # (B, 1, T_enc)
        two_v = (2 * v).view(heads, a, 1)  # (H, a, 1)
        v_sum = v.sum(-1).view(1, heads, 1)  # (1, H, 1): Σ v
        w_state_t, w_ic_t = w_state.T, w_ic.T  # (d, 3d + H·a), (d_k, 3d)
        fill = torch.finfo(keys.dtype).min
        ctx.set_materialize_grads(False)

        states = input_gates.new_empty(steps, batch, d)  # s_1..s_T, time-major while stepping
        contexts = keys.new_empty(steps, batch, heads, d_h)  # c_t
        weights = keys.new_empty(steps, batch, heads, t_enc)  # α_t
        projected = input_gates.new_empty(steps, batch, w_state.shape[0])  # [g_t; q_t]
        keep = steps * doubled_keys.numel() * doubled_keys.element_size() <= KEEP_SIGMA_BYTES
        sigmas = doubled_keys.new_empty(steps, *doubled_keys.shape) if keep else None  # (T, B, H, T_enc, a): σ_t
        sigma_buffer = None if keep else torch.empty_like(doubled_keys)  # (B, H, T_enc, a): one for every step
        reset_update = input_gates.new_empty(steps, batch, 2 * d)  # r, z
        candidate = input_gates.new_empty(steps, batch, d)  # n
        h = s0
        for t in range(steps):
            step_projected = torch.addmm(b_state, h, w_state_t, out=projected[t])  # (B, 3d + H·a): [g_t; q_t]
            hidden_gates = step_projected[:, :gates]  # (B, 3d): g_t
            query = step_projected[:, gates:].view(batch, heads, 1, a)  # (B, H, 1, a): q_t
            sigma = torch.add(
                doubled_keys, query, alpha=2, out=sigmas[t] if keep else sigma_buffer
            ).sigmoid_()  # (B, H, T_enc, a)
            if heads == 1:
                scores = (sigma.view(-1, a) @ two_v.view(a)).view(batch, 1, t_enc)  # (B, 1, T_enc)
            else:
                scores = (sigma @ two_v).squeeze(-1)  # (B, H, T_enc)
            scores = scores.sub_(v_sum).masked_fill_(invalid, fill)  # e_t = 2 σ_t v − Σ v
            alpha = torch.softmax(scores, dim=-1).masked_fill_(invalid, 0.0)  # (B, H, T_enc)
            weights[t] = alpha
            context = torch.matmul(alpha.unsqueeze(2), values, out=contexts[t].unsqueeze(2))  # (B, H, 1, d_h)
            x_gates = torch.addmm(input_gates[:, t], context.view(batch, -1), w_ic_t)  # (B, 3d): x_t
            h = gru_cell(x_gates, hidden_gates, h, GRUActivations(reset_update[t], candidate[t], states[t]))  # (B, d)
        # The intermediates (made here, neither inputs nor outputs) rule out double backward, which
        # ``once_differentiable`` states; saved this way, autograd's saved-tensor hooks see them.
        ctx.save_for_backward(
            s0, keys, doubled_keys, w_state, w_ic, v,
            states, contexts, weights, projected, sigmas, reset_update, candidate,
        )
        out_states = states.transpose(0, 1)  # (B, T_dec, d)
        out_contexts = contexts.view(steps, batch, heads * d_h).transpose(0, 1)  # (B, T_dec, d_k)
        out_weights = weights.permute(1, 2, 0, 3)  # (B, H, T_dec, T_enc)
        return out_states, out_contexts, out_weights

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_states, grad_contexts, grad_weights):
        (s0, keys, doubled_keys, w_state, w_ic, v, states, contexts, weights, projected, sigmas, reset_update,
         candidate) = ctx.saved_tensors
        steps, batch, d = states.shape
        heads, t_enc, a = doubled_keys.shape[1], doubled_keys.shape[2], doubled_keys.shape[3]
        d_h = contexts.shape[-1]
        gates = 3 * d
        values = keys.view(batch, t_enc, heads, d_h).transpose(1, 2)  # (B, H, T_enc, d_h): V
        two_v = (2 * v).view(1, heads, 1, a)  # (1, H, 1, a)
        four_v = (4 * v).view(1, heads, a)  # (1, H, a)
        grad_states = grad_states.transpose(0, 1) if grad_states is not None else None  # (T, B, d)
        grad_contexts = (
            grad_contexts.transpose(0, 1).reshape(steps, batch, heads, d_h) if grad_contexts is not None else None
        )  # (T, B, H, d_h)
        grad_weights = grad_weights.permute(2, 0, 1, 3) if grad_weights is not None else None  # (T, B, H, T_enc)

        previous = torch.cat([s0.unsqueeze(0), states[:-1]])  # (T, B, d): s_0..s_{T-1}
        partials = gru_partials(reset_update, candidate, projected[..., 2 * d : gates], previous)

        d_projected = states.new_empty(steps, batch, w_state.shape[0])  # [δg_t; δq_t]
        d_x_gates = states.new_empty(steps, batch, gates)  # δx_t
        d_contexts = contexts.new_empty(steps, batch, heads, d_h)  # δc_t
        sigma_slope = torch.empty_like(doubled_keys)  # (B, H, T_enc, a): σ'_t, one buffer for every step
        sigma_buffer = torch.empty_like(doubled_keys) if sigmas is None else None
        d_score_slope_sum = torch.zeros_like(doubled_keys)  # Σ_t δe_t ⊗ σ'_t
        d_score_sigma_sum = v.new_zeros(heads, a)  # Σ δe σ, accumulated while σ_t is in cache
        d_score_sum = v.new_zeros(heads)  # Σ δe
        dh = s0.new_zeros(batch, d)  # δs_t
        for t in range(steps - 1, -1, -1):
            if grad_states is not None:
                dh = dh + grad_states[t]
            dx, dp = d_x_gates[t], d_projected[t]
            torch.mul(dh.unsqueeze(1), partials.hidden_gates[t], out=dp[:, :gates].view(batch, 3, d))  # δg_t
            dx[:, : 2 * d] = dp[:, : 2 * d]
            torch.mul(dh, partials.input_candidate[t], out=dx[:, 2 * d :])  # δx_t
            d_context = torch.mm(
                dx, w_ic, out=d_contexts[t].view(batch, -1)
            ).view(batch, heads, 1, d_h)  # (B, H, 1, d_h)
            if grad_contexts is not None:
                d_context += grad_contexts[t].unsqueeze(2)
            d_alpha = (d_context @ values.transpose(-1, -2)).squeeze(2)  # (B, H, T_enc): δα_t
            if grad_weights is not None:
                d_alpha += grad_weights[t]
            alpha = weights[t]
            d_score = alpha * (d_alpha - (alpha * d_alpha).sum(-1, keepdim=True))  # (B, H, T_enc): δe_t
            if sigmas is not None:
                sigma = sigmas[t]  # (B, H, T_enc, a)
            else:  # recomputed from the stored q_t, into one buffer
                query = projected[t, :, gates:].view(batch, heads, 1, a)  # (B, H, 1, a)
                sigma = torch.add(doubled_keys, query, alpha=2, out=sigma_buffer).sigmoid_()  # (B, H, T_enc, a)
            torch.addcmul(sigma, sigma, sigma, value=-1, out=sigma_slope)  # σ' = σ − σ²
            d_score_slope_sum.addcmul_(sigma_slope, d_score.unsqueeze(-1))
            slope_sum = (d_score.unsqueeze(2) @ sigma_slope).squeeze(2)  # (B, H, a): ρ_t
            torch.mul(slope_sum, four_v, out=dp[:, gates:].view(batch, heads, a))  # δq_t = 4 v ⊙ ρ_t
            if heads == 1:
                d_score_sigma_sum[0].addmv_(sigma.view(-1, a).T, d_score.view(-1))  # (a,)
            else:
                d_score_sigma_sum += torch.einsum("bhia,bhi->ha", sigma, d_score)  # (H, a)
            d_score_sum += d_score.sum((0, 2))  # (H,)
            dh = torch.addmm(dh * partials.carry[t], dp, w_state)  # (B, d): δs_{t-1}
        # Every step's parameter and key gradients at once.
        d_w_state = d_projected.view(-1, w_state.shape[0]).T @ previous.view(-1, d)  # (3d + H·a, d)
        d_b_state = d_projected.sum((0, 1))  # (3d + H·a,)
        d_w_ic = d_x_gates.view(-1, gates).T @ contexts.view(steps * batch, -1)  # (3d, d_k)
        d_input_gates = d_x_gates.transpose(0, 1)  # (B, T, 3d)
        d_values = weights.permute(1, 2, 3, 0) @ d_contexts.permute(1, 2, 0, 3)  # (B, H, T_enc, d_h): Σ_t α_tᵀ δc_t
        d_keys = d_values.transpose(1, 2).reshape(batch, t_enc, heads * d_h)  # (B, T_enc, d_k)
        d_v = 2 * d_score_sigma_sum - d_score_sum.unsqueeze(-1)  # (H, a): Σ δe (2σ − 1)
        d_doubled_keys = d_score_slope_sum.mul_(two_v)  # (B, H, T_enc, a): δK2
        return d_input_gates, dh, d_keys, d_doubled_keys, None, d_w_state, d_b_state, d_w_ic, d_v
