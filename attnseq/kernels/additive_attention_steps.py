"""The additive attention of a fused decoder recurrence, one step at a time, forward and backward:
the half of ``kernels.additive_recurrence`` and ``kernels.luong_recurrence`` that does not depend
on the RNN cell.

Per step t and head h (a = d_attn / H; V_h the head's values, ``(T_enc, d_v)``; K2 = 2K, the
projected keys doubled once per batch)::

    σ_t  = σ(K2 + 2 q_t)                        q_t = W_q s                                    sigma
    e_t  = 2 σ_t v − Σ v                        = vᵀ tanh(q_t + K), since tanh(u) = 2σ(2u) − 1  scores
    α_t  = masked softmax(e_t)                  padding gets exactly 0                         weights
    c_t  = [α_t,1 V_1; …; α_t,H V_H]            heads concatenated, ``(H·d_v)``               contexts
      or   Σ_h α_t,h V_h                        heads summed (``heads_summed``), ``(d_v)``

Bahdanau's values are the keys split by head and its heads concatenated: the cell reads c_t
through its input gates, x_t = input_gates_t + W_ic c_t. Luong's are each head's keys through its
block of W_c (``Attention.values_through``), summed: c_t = W_cc [c_t,1; …; c_t,H]. Summing is
concatenating with the heads as one group, H·T_enc long, so both run as M groups of L sources
(M = H, L = T_enc; or M = 1, L = H·T_enc). Backward, step by step in reverse, from the
recurrence's δc_t (with δ· the loss's gradient)::

    δc_t = δx_t W_ic  (Bahdanau; Luong: its own)  (+ the output's δc_t)
    δα_t = δc_t Vᵀ    (+ the output's δα_t)
    δe_t = α_t ⊙ (δα_t − Σ_i α_{t,i} δα_{t,i})       through the softmax
    σ'_t = σ_t ⊙ (1 − σ_t)                           sigma_slope
    ρ_t  = Σ_i δe_{t,i} σ'_{t,i}                     (B, H, a): slope_sum
    δq_t = 4 v ⊙ ρ_t                                 (u = K2 + 2q: δu = (δe ⊗ 2v) ⊙ σ', δq = 2 Σ_i δu_i)

and, after the loop, for all steps at once (v factors out of every sum over steps)::

    δV    = Σ_t α_tᵀ δc_t
    δK2   = 2v ⊙ Σ_t δe_t ⊗ σ'_t
    δv    = Σ_{t,i} δe_{t,i} (2σ_{t,i} − 1)

σ_t of every step is either kept by the forward (``sigmas``, in blocks of steps below the allocator's
mmap threshold: ``kernels.buffers``) or recomputed by the backward from the stored q_t into one
buffer: kept up to ``KEEP_SIGMA_BYTES`` in all. The σ form of tanh is used because ATen's CPU
``tanh`` is slower than its ``sigmoid``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnseq.kernels.buffers import block_step, step_blocks

KEEP_SIGMA_BYTES = 256 * 2**20
"""Up to this size the σ_t of every step are kept for the backward pass; past it, recomputed. Keeping
them is the faster choice in training, where freed memory is kept for reuse
(``attnseq.training.process.keep_freed_memory``); a 30 MiB limit, recomputing on every long batch,
trained slower (benchmarks/README.md, "Where the speed comes from")."""


def keeps_sigmas(steps: int, doubled_keys: Tensor) -> bool:
    """Whether σ_t of ``steps`` steps, each the size of ``doubled_keys``, fit ``KEEP_SIGMA_BYTES``."""
    return steps * doubled_keys.numel() * doubled_keys.element_size() <= KEEP_SIGMA_BYTES


def additive_weights(doubled_keys: Tensor, query: Tensor, two_v: Tensor, v_sum: Tensor, invalid: Tensor,
                     sigma: Tensor | None = None) -> Tensor:
    """One step's α_t ``(B, H, T_enc)`` from K2 ``(B, H, T_enc, a)`` and q_t ``(B, H·a)``: σ_t = σ(K2 + 2 q_t)
    (written into ``sigma`` where given), e_t = σ_t (2v) − Σ v with ``two_v`` ``(H, a, 1)`` and ``v_sum``
    ``(1, H, 1)``, and the softmax over the positions that ``invalid`` ``(B, 1, T_enc)`` leaves (padding: 0)."""
    batch, heads, t_enc, a = doubled_keys.shape
    sigma = torch.add(doubled_keys, query.view(batch, heads, 1, a), alpha=2, out=sigma).sigmoid_()  # σ_t
    if heads == 1:
        scores = (sigma.view(-1, a) @ two_v.view(a)).view(batch, 1, t_enc)  # (B, 1, T_enc)
    else:
        scores = (sigma @ two_v).squeeze(-1)  # (B, H, T_enc)
    scores = scores.sub_(v_sum).masked_fill_(invalid, torch.finfo(scores.dtype).min)  # e_t = 2 σ_t v − Σ v
    return torch.softmax(scores, dim=-1).masked_fill_(invalid, 0.0)  # (B, H, T_enc)


class AdditiveAttentionSteps:
    """The forward of one fused recurrence's attention: ``step`` per decoder step, writing σ_t
    (when kept), α_t and c_t into buffers for every step."""

    def __init__(
        self,
        values: Tensor,
        doubled_keys: Tensor,
        valid: Tensor,
        v: Tensor,
        steps: int,
        heads_summed: bool = False,
    ):
        """values ``(B, H, T_enc, d_v)``: V; doubled_keys ``(B, H, T_enc, a)``: K2; valid ``(B, T_enc)``
        bool; v ``(H, a)``; ``heads_summed``: c_t = Σ_h α_t,h V_h ``(B, d_v)`` rather than the heads
        concatenated ``(B, H·d_v)``. σ_t of every step is kept where ``keeps_sigmas`` says so."""
        batch, heads, t_enc, a = doubled_keys.shape
        self.shape = batch, heads, t_enc, a
        self.doubled_keys = doubled_keys
        self.values = grouped(values, heads_summed)  # (B, M, L, d_v)
        groups, d_v = self.values.shape[1], self.values.shape[-1]
        self.invalid = ~valid[:, None, :]  # (B, 1, T_enc)
        self.two_v = (2 * v).view(heads, a, 1)  # (H, a, 1)
        self.v_sum = v.sum(-1).view(1, heads, 1)  # (1, H, 1): Σ v
        self.contexts = values.new_empty(steps, batch, groups, d_v)  # c_t
        self.weights = values.new_empty(steps, batch, heads, t_enc)  # α_t
        keep = keeps_sigmas(steps, doubled_keys)
        self.sigmas = step_blocks(steps, doubled_keys) if keep else ()  # σ_t: blocks (k, B, H, T_enc, a)
        self.sigma_buffer = None if keep else torch.empty_like(doubled_keys)  # one for every step

    def step(self, t: int, query: Tensor) -> Tensor:
        """Step t from q_t ``(B, H·a)`` → c_t ``(B, M·d_v)``."""
        batch = self.shape[0]
        sigma = block_step(self.sigmas, t) if self.sigmas else self.sigma_buffer  # (B, H, T_enc, a): σ_t, written here
        alpha = additive_weights(self.doubled_keys, query, self.two_v, self.v_sum, self.invalid, sigma)  # (B, H, T_enc)
        self.weights[t] = alpha
        groups = self.values.shape[1]
        context = torch.matmul(
            alpha.view(batch, groups, 1, -1), self.values, out=self.contexts[t].unsqueeze(2)
        )  # (B, M, 1, d_v)
        return context.view(batch, -1)  # (B, M·d_v)

    def outputs(self) -> tuple[Tensor, Tensor]:
        """Every step's contexts ``(B, T_dec, M·d_v)`` and weights ``(B, H, T_dec, T_enc)``."""
        steps, batch = self.contexts.shape[:2]
        return (
            self.contexts.view(steps, batch, -1).transpose(0, 1),  # (B, T_dec, M·d_v)
            self.weights.permute(1, 2, 0, 3),  # (B, H, T_dec, T_enc)
        )


class AdditiveAttentionStepGradients:
    """The backward of ``AdditiveAttentionSteps``: ``step`` per decoder step in reverse, from
    Bahdanau's δx_t (or ``context_step`` from a δc_t written into ``d_contexts[t]``) to δq_t;
    ``gradients`` after the loop."""

    def __init__(
        self,
        values: Tensor,
        doubled_keys: Tensor,
        v: Tensor,
        weights: Tensor,
        sigmas: tuple[Tensor, ...],
        queries: Tensor,
        grad_contexts: Tensor | None,
        grad_weights: Tensor | None,
        heads_summed: bool = False,
    ):
        """The forward's values, doubled_keys, v, ``heads_summed`` and buffers (weights
        ``(T, B, H, T_enc)``, sigmas: its blocks ``(k, B, H, T_enc, a)``, none where not kept, the
        queries q_t ``(T, B, H·a)``, read to recompute σ_t), and the outputs' gradients as the
        recurrence got them: contexts ``(B, T_dec, M·d_v)``, weights ``(B, H, T_dec, T_enc)``, either None."""
        batch, heads, t_enc, a = doubled_keys.shape
        steps = weights.shape[0]
        self.shape = batch, heads, t_enc, a
        self.doubled_keys, self.weights, self.sigmas, self.queries = doubled_keys, weights, sigmas, queries
        self.values_t = grouped(values, heads_summed).transpose(2, 3)  # (B, M, d_v, L): Vᵀ
        groups, d_v = self.values_t.shape[1:3]
        self.two_v = (2 * v).view(1, heads, 1, a)  # (1, H, 1, a)
        self.four_v = (4 * v).view(1, heads, a)  # (1, H, a)
        self.grad_contexts = (
            grad_contexts.transpose(0, 1).reshape(steps, batch, groups, 1, d_v) if grad_contexts is not None else None
        )  # (T, B, M, 1, d_v)
        self.grad_weights = grad_weights.permute(2, 0, 1, 3) if grad_weights is not None else None  # (T, B, H, T_enc)
        self.d_contexts = values.new_empty(steps, batch, groups, d_v)  # δc_t
        self.sigma_slope = torch.empty_like(doubled_keys)  # (B, H, T_enc, a): σ'_t, one buffer for every step
        self.sigma_buffer = None if sigmas else torch.empty_like(doubled_keys)
        self.d_score_slope_sum = torch.zeros_like(doubled_keys)  # Σ_t δe_t ⊗ σ'_t
        self.d_score_sigma_sum = v.new_zeros(heads, a)  # Σ δe σ, accumulated while σ_t is in cache
        self.d_score_sum = v.new_zeros(heads)  # Σ δe

    def step(self, t: int, d_x_gates: Tensor, w_ic: Tensor, d_query: Tensor) -> None:
        """Step t of a recurrence that reads c_t through its input gates: the cell's δx_t ``(B, 3d or 4d)``
        and W_ic ``(3d or 4d, M·d_v)`` → δq_t, written into ``d_query`` ``(B, H·a)``."""
        torch.mm(d_x_gates, w_ic, out=self.d_contexts[t].view(d_x_gates.shape[0], -1))  # (B, M·d_v): δc_t
        self.context_step(t, d_query)

    def context_step(self, t: int, d_query: Tensor) -> None:
        """Step t from δc_t, already in ``d_contexts[t]`` ``(B, M, d_v)``, → δq_t, written into
        ``d_query`` ``(B, H·a)``."""
        batch, heads, t_enc, a = self.shape
        d_context = self.d_contexts[t].unsqueeze(2)  # (B, M, 1, d_v)
        if self.grad_contexts is not None:
            d_context += self.grad_contexts[t]
        d_alpha = (d_context @ self.values_t).view(batch, heads, t_enc)  # (B, H, T_enc): δα_t
        if self.grad_weights is not None:
            d_alpha += self.grad_weights[t]
        alpha = self.weights[t]
        d_score = alpha * (d_alpha - (alpha * d_alpha).sum(-1, keepdim=True))  # (B, H, T_enc): δe_t
        if self.sigmas:
            sigma = block_step(self.sigmas, t)  # (B, H, T_enc, a)
        else:  # recomputed from the stored q_t, into one buffer
            sigma = torch.add(
                self.doubled_keys, self.queries[t].view(batch, heads, 1, a), alpha=2, out=self.sigma_buffer
            ).sigmoid_()  # (B, H, T_enc, a)
        sigma_slope = torch.addcmul(sigma, sigma, sigma, value=-1, out=self.sigma_slope)  # σ' = σ − σ²
        self.d_score_slope_sum.addcmul_(sigma_slope, d_score.unsqueeze(-1))
        slope_sum = (d_score.unsqueeze(2) @ sigma_slope).squeeze(2)  # (B, H, a): ρ_t
        torch.mul(slope_sum, self.four_v, out=d_query.view(batch, heads, a))  # δq_t = 4 v ⊙ ρ_t
        if heads == 1:
            self.d_score_sigma_sum[0].addmv_(sigma.view(-1, a).T, d_score.view(-1))  # (a,)
        else:
            self.d_score_sigma_sum += torch.einsum("bhia,bhi->ha", sigma, d_score)  # (H, a)
        self.d_score_sum += d_score.sum((0, 2))  # (H,)

    def gradients(self) -> tuple[Tensor, Tensor, Tensor]:
        """After every step: δV ``(B, H, T_enc, d_v)``, δK2 ``(B, H, T_enc, a)`` and δv ``(H, a)``."""
        batch, heads, t_enc, a = self.shape
        groups = self.d_contexts.shape[2]
        weights = self.weights.permute(1, 2, 3, 0).reshape(batch, groups, -1, self.weights.shape[0])  # (B, M, L, T)
        d_values = weights @ self.d_contexts.permute(1, 2, 0, 3)  # (B, M, L, d_v): Σ_t α_tᵀ δc_t
        d_v = 2 * self.d_score_sigma_sum - self.d_score_sum.unsqueeze(-1)  # (H, a): Σ δe (2σ − 1)
        d_doubled_keys = self.d_score_slope_sum.mul_(self.two_v)  # (B, H, T_enc, a): δK2
        return d_values.view(batch, heads, t_enc, -1), d_doubled_keys, d_v  # (B, H, T_enc, d_v)


def grouped(values: Tensor, heads_summed: bool) -> Tensor:
    """values ``(B, H, T_enc, d_v)`` as M groups of L sources ``(B, M, L, d_v)``: the heads
    themselves (M = H), or one group of every head's sources (M = 1, L = H·T_enc) when c_t sums them."""
    if not heads_summed:
        return values
    batch, heads, t_enc, d_v = values.shape
    return values.reshape(batch, 1, heads * t_enc, d_v)  # (B, 1, H·T_enc, d_v)


def keys_as_values(keys: Tensor, heads: int) -> Tensor:
    """Bahdanau's values: keys ``(B, T_enc, d_k)`` split by head ``(B, H, T_enc, d_k / H)``."""
    batch, t_enc, d_k = keys.shape
    return keys.view(batch, t_enc, heads, d_k // heads).transpose(1, 2)  # (B, H, T_enc, d_h)


def keys_gradient(d_values: Tensor) -> Tensor:
    """``keys_as_values``' backward: δV ``(B, H, T_enc, d_h)`` → δkeys ``(B, T_enc, d_k)``."""
    return d_values.transpose(1, 2).reshape(d_values.shape[0], d_values.shape[2], -1)  # (B, T_enc, d_k)


def weight_gradients(
    d_projected: Tensor, previous: Tensor, d_x_gates: Tensor, extra_inputs: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """δW_state = Σ_t δp_tᵀ s_t, δb_state = Σ_t δp_t and δW_x = Σ_t δx_tᵀ u_t, from ``(T, B, ·)``
    tensors: d_projected δp_t ``(T, B, rows)`` and the states it was projected from ``(T, B, d)``;
    d_x_gates δx_t ``(T', B, G·d)`` (a view will do) and the inputs the cell read through W_x
    besides the embedding, ``(T', B, ·)``: Bahdanau's contexts (W_ic), Luong's feeds h̃_{t-1} (W_f)."""
    steps, batch, rows = d_projected.shape
    flat = d_projected.view(steps * batch, rows)  # (T·B, rows)
    d_w_state = flat.T @ previous.reshape(steps * batch, -1)  # (rows, d)
    d_b_state = flat.sum(0)  # (rows,)
    cell_steps = d_x_gates.shape[0] * batch
    d_w_x = d_x_gates.reshape(cell_steps, -1).T @ extra_inputs.reshape(cell_steps, -1)  # (G·d, ·)
    return d_w_state, d_b_state, d_w_x  # (rows, d), (rows,), (G·d, ·)
