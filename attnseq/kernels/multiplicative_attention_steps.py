"""The multiplicative attention of a fused decoder recurrence (Luong's dot, scaled dot and general
scores), one step at a time, forward and backward: the half of ``kernels.luong_recurrence`` that does
not depend on the RNN cell, as ``kernels.additive_attention_steps`` is for the additive score.

Per step t and head h (K_h the head's projected keys ``(T_enc, a)``, ``Attention.project_keys``; V_h
its values ``(T_enc, d_v)``; λ the score's scale)::

    e_t,h = λ K_h q_t,h                 q_t,h: head h's slice of q_t (dot: a = d_q / H), or
                                        all of q_t for every head (general: a = d_q)    scores
    α_t   = masked softmax(e_t)         padding gets exactly 0                          weights
    c_t   = Σ_h α_t,h V_h               heads summed (Luong: V_h through W_cc)          contexts
      or    [α_t,1 V_1; …; α_t,H V_H]   heads concatenated (Bahdanau: V_h the keys' slice, ``heads_summed=False``)

Backward, step by step in reverse, from the recurrence's δc_t (δ· the loss's gradient; Bahdanau's
δc_t = δx_t W_ic, ``step``, plus the output's δc_t)::

    δα_t = δc_t Vᵀ                      (+ the output's δα_t)
    δe_t = α_t ⊙ (δα_t − Σ_i α_{t,i} δα_{t,i})       through the softmax
    δq_t,h = λ δe_t,h K_h               (general: summed over the heads)

and, after the loop, for all steps at once::

    δV_h = Σ_t α_t,hᵀ δc_t
    δK_h = λ Σ_t δe_t,hᵀ q_t,h
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnseq.kernels.additive_attention_steps import grouped


def query_heads(keys: Tensor, query_width: int) -> int:
    """How many slices the query is cut into: H when each head reads its own slice (K's last size ×
    H = the query's width: dot, scaled dot), 1 when every head reads all of it (general)."""
    heads, a = keys.shape[1], keys.shape[-1]
    if a * heads == query_width:
        return heads
    if a == query_width:
        return 1
    raise ValueError(f"keys of width {a} in {heads} heads match no query of width {query_width}")


class MultiplicativeAttentionSteps:
    """The forward of one fused recurrence's attention: ``step`` per decoder step, writing α_t and
    c_t into buffers for every step."""

    def __init__(self, values: Tensor, keys: Tensor, valid: Tensor, scale: float, steps: int, query_width: int,
                 heads_summed: bool = True):
        """values ``(B, H, T_enc, d_v)``: V; keys ``(B, H, T_enc, a)``: K; valid ``(B, T_enc)`` bool;
        scale λ; the query's width d_q. c_t sums the heads ``(B, d_v)``, or (not ``heads_summed``)
        concatenates them ``(B, H·d_v)``."""
        batch, heads, t_enc, a = keys.shape
        self.shape = batch, heads, t_enc, a
        self.query_heads = query_heads(keys, query_width)
        self.scaled_keys = keys * scale if scale != 1.0 else keys  # (B, H, T_enc, a): λK, once per batch
        self.values = grouped(values, heads_summed)  # (B, M, L, d_v): M = 1 (summed) or H
        groups = self.values.shape[1]
        self.invalid = ~valid[:, None, :]  # (B, 1, T_enc)
        self.contexts = values.new_empty(steps, batch, groups, values.shape[-1])  # c_t
        self.weights = values.new_empty(steps, batch, heads, t_enc)  # α_t

    def step(self, t: int, query: Tensor) -> Tensor:
        """Step t from q_t ``(B, d_q)`` → c_t ``(B, M·d_v)``."""
        batch, heads, t_enc, a = self.shape
        q = query.reshape(batch, self.query_heads, a, 1)  # (B, H or 1, a, 1)
        scores = (self.scaled_keys @ q).view(batch, heads, t_enc)  # (B, H, T_enc): e_t
        scores = scores.masked_fill_(self.invalid, torch.finfo(scores.dtype).min)
        alpha = torch.softmax(scores, dim=-1).masked_fill_(self.invalid, 0.0)  # (B, H, T_enc)
        self.weights[t] = alpha
        groups = self.values.shape[1]
        context = torch.matmul(
            alpha.view(batch, groups, 1, -1), self.values, out=self.contexts[t].unsqueeze(2)
        )  # (B, M, 1, d_v)
        return context.view(batch, -1)  # (B, M·d_v)

    def outputs(self) -> Tensor:
        """Every step's weights ``(B, H, T_dec, T_enc)``."""
        return self.weights.permute(1, 2, 0, 3)  # (B, H, T_dec, T_enc)

    def contexts_out(self) -> Tensor:
        """Every step's contexts ``(B, T_dec, M·d_v)``."""
        steps, batch = self.contexts.shape[:2]
        return self.contexts.view(steps, batch, -1).transpose(0, 1)  # (B, T_dec, M·d_v)


class MultiplicativeAttentionStepGradients:
    """The backward of ``MultiplicativeAttentionSteps``: ``context_step`` per decoder step in reverse,
    from a δc_t written into ``d_contexts[t]`` to δq_t; ``gradients`` after the loop."""

    def __init__(self, values: Tensor, keys: Tensor, scale: float, weights: Tensor, queries: Tensor,
                 grad_weights: Tensor | None, grad_contexts: Tensor | None = None, heads_summed: bool = True):
        """The forward's values, keys, scale, ``heads_summed`` and buffers (weights ``(T, B, H, T_enc)``, the
        queries q_t ``(T, B, d_q)``), and the outputs' gradients as the recurrence got them: weights
        ``(B, H, T_dec, T_enc)``, contexts ``(B, T_dec, M·d_v)`` (Bahdanau's, an output), either None."""
        batch, heads, t_enc, a = keys.shape
        steps = weights.shape[0]
        self.shape = batch, heads, t_enc, a
        self.scale, self.weights, self.queries = scale, weights, queries
        self.query_heads = query_heads(keys, queries.shape[-1])
        self.scaled_keys = keys * scale if scale != 1.0 else keys  # (B, H, T_enc, a): λK
        self.values_t = grouped(values, heads_summed).transpose(2, 3)  # (B, M, d_v, L): Vᵀ
        groups, d_v = self.values_t.shape[1:3]
        self.grad_weights = grad_weights.permute(2, 0, 1, 3) if grad_weights is not None else None  # (T, B, H, T_enc)
        self.grad_contexts = (
            grad_contexts.transpose(0, 1).reshape(steps, batch, groups, d_v) if grad_contexts is not None else None
        )  # (T, B, M, d_v)
        self.d_contexts = values.new_empty(steps, batch, groups, d_v)  # δc_t
        self.d_scores = values.new_empty(steps, batch, heads, t_enc)  # δe_t, for δK after the loop

    def step(self, t: int, d_x_gates: Tensor, w_ic: Tensor, d_query: Tensor) -> None:
        """Step t of a recurrence that reads c_t through its input gates (Bahdanau): the cell's δx_t
        ``(B, G·d)`` and W_ic ``(G·d, M·d_v)`` → δq_t, written into ``d_query`` ``(B, d_q)``."""
        d_context = torch.mm(d_x_gates, w_ic, out=self.d_contexts[t].view(d_x_gates.shape[0], -1))  # (B, M·d_v)
        if self.grad_contexts is not None:
            d_context += self.grad_contexts[t].view_as(d_context)  # δc_t, the output's share too
        self.context_step(t, d_query)

    def context_step(self, t: int, d_query: Tensor) -> None:
        """Step t from δc_t, already in ``d_contexts[t]`` ``(B, M, d_v)``, → δq_t, written into
        ``d_query`` ``(B, d_q)``."""
        batch, heads, t_enc, a = self.shape
        d_alpha = (self.d_contexts[t].unsqueeze(2) @ self.values_t).view(batch, heads, t_enc)  # (B, H, T_enc): δα_t
        if self.grad_weights is not None:
            d_alpha += self.grad_weights[t]
        alpha = self.weights[t]
        d_score = self.d_scores[t]  # (B, H, T_enc): δe_t, written here
        torch.mul(alpha, d_alpha - (alpha * d_alpha).sum(-1, keepdim=True), out=d_score)
        d_q = d_score.unsqueeze(2) @ self.scaled_keys  # (B, H, 1, a): λ δe_t,h K_h
        if self.query_heads == 1 and heads > 1:
            torch.sum(d_q.view(batch, heads, a), dim=1, out=d_query)  # (B, a = d_q): every head read all of q_t
        else:
            d_query.copy_(d_q.view(batch, -1))  # (B, H·a = d_q)

    def gradients(self) -> tuple[Tensor, Tensor]:
        """After every step: δV ``(B, H, T_enc, d_v)`` and δK ``(B, H, T_enc, a)``."""
        batch, heads, t_enc, a = self.shape
        steps = self.weights.shape[0]
        groups = self.d_contexts.shape[2]
        weights = self.weights.permute(1, 2, 3, 0).reshape(batch, groups, -1, steps)  # (B, M, L, T)
        d_values = weights @ self.d_contexts.permute(1, 2, 0, 3)  # (B, M, L, d_v): Σ_t α_tᵀ δc_t
        queries = self.queries.permute(1, 0, 2).reshape(batch, steps, self.query_heads, a)  # (B, T, H|1, a)
        queries = queries.transpose(1, 2)  # (B, H|1, T, a)
        d_scores = self.d_scores.permute(1, 2, 3, 0)  # (B, H, T_enc, T)
        d_keys = (d_scores @ queries).mul_(self.scale) if self.scale != 1.0 else d_scores @ queries  # (B, H, T_enc, a)
        return d_values.view(batch, heads, t_enc, -1), d_keys  # (B, H, T_enc, d_v), (B, H, T_enc, a)
