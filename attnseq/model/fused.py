"""The Bahdanau decoder's recurrence with additive attention, as one autograd function.

Teacher forcing runs, for t = 1..T_dec (GRU, one layer; s_0 from the encoder)::

    [W_hh s_{t-1} + b_hh ; W_a s_{t-1}]   = W_state s_{t-1} + b_state      one matmul per step
    e_{t,i} = v_aᵀ tanh(W_a s_{t-1} + U_a h_i)                             per head, U_a h_i once per batch
    α_t     = softmax over the valid i of e_t                              padding gets exactly 0
    c_t     = Σ_i α_{t,i} h_i
    s_t     = GRU(x = [E y_{t-1}; c_t], s_{t-1}),  W_ih x = (W_ie E y_{t-1} + b_ih) + W_ic c_t

— exactly ``BahdanauDecoder.step`` over the target (the tests compare the two, values and
gradients). Under autograd every step leaves ~30 nodes, and the backward pass computes each
step's weight gradients and its share of the keys' gradient as separate small products. Here the
forward runs without recording and keeps only what the backward needs; the backward runs the
recurrence in reverse for the state alone, and computes the weight gradients, the keys' gradient
through the values and the gradient of the projected keys for all steps at once, as a few large
products (U_a h and v_a factor out of every sum over steps).

The forward keeps the (B, H, T_enc, a) activations σ_t of the scores for every step, up to
``KEEP_SIGMA_BYTES`` in all; the backward reads them back instead of recomputing them (past that
size it recomputes each from the stored W_a s_{t-1}, in one buffer). Keeping them is the faster
choice only while freed memory is reused rather than faulted in afresh on every step: training
processes arrange that (``attnseq.training.process.keep_freed_memory``); there it is 8–10% faster
than recomputing (benchmarks/bench.py's loops, side by side). It costs memory: the training step
keeps 80 MiB for the longest copy batch of benchmarks/results.md, against 27 recomputing and 79
stepping under autograd. The cell's local derivatives (r, z, n and the gates) are computed for all
steps at once before the reverse loop, which leaves five products per step for the cell.

Arithmetic identities make each step cheaper with the same function computed: tanh(u) = 2σ(2u) − 1
(ATen's CPU ``tanh`` is ~6× slower than its ``sigmoid``), so with doubled projected keys
``K2 = 2 U_a h`` a step evaluates σ(K2 + 2 W_a s) once and the score as 2 v_aᵀσ − Σ v_a; and the GRU
update (1 − z) ⊙ n + z ⊙ h is computed as n + z ⊙ (h − n).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

KEEP_SIGMA_BYTES = 256 * 2**20
"""Up to this size the σ_t of every step are kept for the backward pass; past it, recomputed."""


class AdditiveGRURecurrence(torch.autograd.Function):
    """``(input_gates, s_0, keys, keys2, valid, W_state, b_state, W_ic, v_a)`` →
    ``(states (B, T_dec, d), contexts (B, T_dec, d_k), weights (B, H, T_dec, T_enc))``.

    - input_gates ``(B, T_dec, 3d)``: ``W_ie E y_{t-1} + b_ih`` for every step;
    - s_0 ``(B, d)``; keys ``(B, T_enc, d_k)``, the values too; keys2 ``(B, H, T_enc, a)``: 2 U_a h;
    - valid ``(B, T_enc)`` bool; W_state ``(3d + H·a, d)`` = [W_hh; W_a], b_state ``(3d + H·a,)`` = [b_hh; 0];
    - W_ic ``(3d, d_k)``: the context's input columns of the GRU; v_a ``(H, a)``.
    """

    @staticmethod
    def supports(input_gates: Tensor) -> bool:
        """Full-precision inputs outside autocast: the function keeps its buffers in the input dtype
        and does not cast (under autocast the decoder's autograd loop runs instead)."""
        return input_gates.dtype in (torch.float32, torch.float64) and not torch.is_autocast_enabled(
            input_gates.device.type
        )

    @staticmethod
    def forward(ctx, input_gates, s0, keys, keys2, valid, w_state, b_state, w_ic, v_a):
        batch, steps, gates = input_gates.shape
        d = gates // 3
        heads, t_enc, a = keys2.shape[1], keys2.shape[2], keys2.shape[3]
        d_h = keys.shape[-1] // heads
        values = keys.view(batch, t_enc, heads, d_h).transpose(1, 2)  # (B, H, T_enc, d_h)
        invalid = ~valid[:, None, :]  # (B, 1, T_enc)
        v2 = (2 * v_a).view(heads, a, 1)  # (H, a, 1)
        v_sum = v_a.sum(-1).view(1, heads, 1)  # (1, H, 1)
        w_state_t, w_ic_t = w_state.T, w_ic.T  # (d, 3d + H·a), (d_k, 3d)
        fill = torch.finfo(keys.dtype).min
        ctx.set_materialize_grads(False)

        states = input_gates.new_empty(steps, batch, d)  # s_1..s_T, time-major while stepping
        contexts = keys.new_empty(steps, batch, heads, d_h)
        weights = keys.new_empty(steps, batch, heads, t_enc)
        projected = input_gates.new_empty(steps, batch, w_state.shape[0])  # [W_hh s_{t-1} + b_hh; W_a s_{t-1}]
        keep = steps * keys2.numel() * keys2.element_size() <= KEEP_SIGMA_BYTES
        sigmas = keys2.new_empty(steps, *keys2.shape) if keep else None  # (T, B, H, T_enc, a): σ_t of every step
        sigma_buffer = None if keep else torch.empty_like(keys2)  # (B, H, T_enc, a): one for every step
        reset_update = input_gates.new_empty(steps, batch, 2 * d)  # r, z
        candidate = input_gates.new_empty(steps, batch, d)  # n
        h = s0
        for t in range(steps):
            step_projected = torch.addmm(b_state, h, w_state_t, out=projected[t])  # (B, 3d + H·a)
            hidden_gates = step_projected[:, :gates]  # (B, 3d)
            query = step_projected[:, gates:].view(batch, heads, 1, a)  # (B, H, 1, a): W_a s_{t-1}
            sigma = torch.add(keys2, query, alpha=2, out=sigmas[t] if keep else sigma_buffer).sigmoid_()  # σ(2 (U_a h + W_a s_{t-1}))
            if heads == 1:
                scores = (sigma.view(-1, a) @ v2.view(a)).view(batch, 1, t_enc)  # (B, 1, T_enc)
            else:
                scores = (sigma @ v2).squeeze(-1)  # (B, H, T_enc)
            scores = scores.sub_(v_sum).masked_fill_(invalid, fill)  # v_aᵀ tanh(·) = 2 v_aᵀσ − Σ v_a
            alpha = torch.softmax(scores, dim=-1).masked_fill_(invalid, 0.0)  # (B, H, T_enc)
            weights[t] = alpha
            context = torch.matmul(alpha.unsqueeze(2), values, out=contexts[t].unsqueeze(2))  # (B, H, 1, d_h)
            x_gates = torch.addmm(input_gates[:, t], context.view(batch, -1), w_ic_t)  # (B, 3d): + W_ic c_t
            rz = torch.add(x_gates[:, : 2 * d], hidden_gates[:, : 2 * d], out=reset_update[t]).sigmoid_()  # (B, 2d)
            n = torch.addcmul(x_gates[:, 2 * d :], rz[:, :d], hidden_gates[:, 2 * d :], out=candidate[t]).tanh_()  # (B, d)
            h = torch.addcmul(n, rz[:, d:], h - n, out=states[t])  # (B, d): (1 − z) n + z s_{t-1}
        # The intermediates (made here, neither inputs nor outputs) rule out double backward, which
        # ``once_differentiable`` states; saved this way, autograd's saved-tensor hooks see them.
        ctx.save_for_backward(
            s0, keys, keys2, w_state, w_ic, v_a, states, contexts, weights, projected, sigmas, reset_update, candidate
        )
        out_states = states.transpose(0, 1)  # (B, T_dec, d)
        out_contexts = contexts.view(steps, batch, heads * d_h).transpose(0, 1)  # (B, T_dec, d_k)
        out_weights = weights.permute(1, 2, 0, 3)  # (B, H, T_dec, T_enc)
        return out_states, out_contexts, out_weights

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_states, grad_contexts, grad_weights):
        s0, keys, keys2, w_state, w_ic, v_a, states, contexts, weights, projected, sigmas, reset_update, candidate = (
            ctx.saved_tensors
        )
        steps, batch, d = states.shape
        heads, t_enc, a = keys2.shape[1], keys2.shape[2], keys2.shape[3]
        d_h = contexts.shape[-1]
        gates = 3 * d
        values = keys.view(batch, t_enc, heads, d_h).transpose(1, 2)  # (B, H, T_enc, d_h)
        v2 = (2 * v_a).view(1, heads, 1, a)  # (1, H, 1, a)
        v4_row = (4 * v_a).view(1, heads, a)  # (1, H, a)
        grad_states = grad_states.transpose(0, 1) if grad_states is not None else None  # (T, B, d)
        grad_contexts = (
            grad_contexts.transpose(0, 1).reshape(steps, batch, heads, d_h) if grad_contexts is not None else None
        )
        grad_weights = grad_weights.permute(2, 0, 1, 3) if grad_weights is not None else None  # (T, B, H, T_enc)

        # The cell's local derivatives for every step at once (they depend on the forward pass only):
        # d n_pre = d s_t ⊙ (1 − z)(1 − n²), d r_pre = d n_pre ⊙ g_n ⊙ r(1 − r), d z_pre = d s_t ⊙ (s_{t-1} − n) ⊙ z(1 − z).
        previous = torch.cat([s0.unsqueeze(0), states[:-1]])  # (T, B, d): s_0..s_{T-1}
        r, z, n = reset_update[..., :d], reset_update[..., d:], candidate  # (T, B, d) each
        slope_n = (1 - z).mul_(1 - n * n)  # (T, B, d): d n_pre / d s_t
        slope_r = projected[..., 2 * d : gates] * r * (1 - r)  # (T, B, d): d r_pre / d n_pre
        slope_z = (previous - n).mul_(z * (1 - z))  # (T, B, d)

        d_projected = states.new_empty(steps, batch, w_state.shape[0])  # d[hidden gates; query] per step
        d_x_gates = states.new_empty(steps, batch, gates)
        d_contexts = contexts.new_empty(steps, batch, heads, d_h)
        # d u_t = (d score_t ⊗ 2 v_a) ⊙ σ'_t with σ' = σ(1 − σ): v_a factors out of every sum over
        # steps and keys, so only Σ_t d score_t ⊙ σ'_t (for K2) is accumulated at full size.
        slope = torch.empty_like(keys2)  # (B, H, T_enc, a): σ'_t, one buffer for every step
        sigma_buffer = torch.empty_like(keys2) if sigmas is None else None
        d_keys2_acc = torch.zeros_like(keys2)  # Σ_t d score_t ⊙ σ'_t
        d_v_sigma = v_a.new_zeros(heads, a)  # Σ d score · σ, accumulated while σ_t is in cache
        d_score_sum = v_a.new_zeros(heads)  # Σ d score
        dh = s0.new_zeros(batch, d)
        for t in range(steps - 1, -1, -1):
            if grad_states is not None:
                dh = dh + grad_states[t]
            dx, dp = d_x_gates[t], d_projected[t]
            d_n_pre = torch.mul(dh, slope_n[t], out=dx[:, 2 * d :])  # (B, d)
            torch.mul(d_n_pre, r[t], out=dp[:, 2 * d : gates])  # d g_n
            torch.mul(d_n_pre, slope_r[t], out=dx[:, :d])  # d r_pre
            torch.mul(dh, slope_z[t], out=dx[:, d : 2 * d])  # d z_pre
            dp[:, : 2 * d] = dx[:, : 2 * d]
            d_context = torch.mm(dx, w_ic, out=d_contexts[t].view(batch, -1)).view(batch, heads, 1, d_h)  # (B, H, 1, d_h)
            if grad_contexts is not None:
                d_context += grad_contexts[t].unsqueeze(2)
            d_alpha = (d_context @ values.transpose(-1, -2)).squeeze(2)  # (B, H, T_enc)
            if grad_weights is not None:
                d_alpha += grad_weights[t]
            alpha = weights[t]
            d_score = alpha * (d_alpha - (alpha * d_alpha).sum(-1, keepdim=True))  # (B, H, T_enc): through softmax
            # score = 2 v_aᵀσ(u) − Σ v_a, u = K2 + 2 W_a s: d u = (d score ⊗ 2 v_a) ⊙ σ'
            if sigmas is not None:
                sigma = sigmas[t]  # (B, H, T_enc, a)
            else:  # recomputed from the stored W_a s_{t-1}, into one buffer
                query = projected[t, :, gates:].view(batch, heads, 1, a)  # (B, H, 1, a)
                sigma = torch.add(keys2, query, alpha=2, out=sigma_buffer).sigmoid_()  # (B, H, T_enc, a)
            torch.addcmul(sigma, sigma, sigma, value=-1, out=slope)  # σ' = σ − σ²
            d_keys2_acc.addcmul_(slope, d_score.unsqueeze(-1))
            mixed = (d_score.unsqueeze(2) @ slope).squeeze(2)  # (B, H, a): Σ_i d score_i σ'_i
            torch.mul(mixed, v4_row, out=dp[:, gates:].view(batch, heads, a))  # d (W_a s) = 2 Σ_i d u_i
            if heads == 1:
                d_v_sigma[0].addmv_(sigma.view(-1, a).T, d_score.view(-1))  # (a,)
            else:
                d_v_sigma += torch.einsum("bhia,bhi->ha", sigma, d_score)  # (H, a)
            d_score_sum += d_score.sum((0, 2))  # (H,)
            dh = torch.addmm(dh * z[t], dp, w_state)  # (B, d): d s_{t-1}
        # Every step's parameter and key gradients at once.
        d_w_state = d_projected.view(-1, w_state.shape[0]).T @ previous.view(-1, d)  # (3d + H·a, d)
        d_b_state = d_projected.sum((0, 1))
        d_w_ic = d_x_gates.view(-1, gates).T @ contexts.view(steps * batch, -1)  # (3d, d_k)
        d_input_gates = d_x_gates.transpose(0, 1)  # (B, T, 3d)
        # keys: Σ_t α_tᵀ d c_t (the values) + the scores' share through K2 is returned separately
        d_values = weights.permute(1, 2, 3, 0) @ d_contexts.permute(1, 2, 0, 3)  # (B, H, T_enc, d_h)
        d_keys = d_values.transpose(1, 2).reshape(batch, t_enc, heads * d_h)  # (B, T_enc, d_k)
        d_v = 2 * d_v_sigma - d_score_sum.unsqueeze(-1)  # (H, a): Σ d score (2σ − 1) over batch, steps and keys
        d_keys2 = d_keys2_acc.mul_(v2)  # (B, H, T_enc, a): Σ_t d u_t
        return d_input_gates, dh, d_keys, d_keys2, None, d_w_state, d_b_state, d_w_ic, d_v
