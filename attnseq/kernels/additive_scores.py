"""The additive score of every decoder step at once, with a hand-written backward that never holds
the whole ``(B, H, T_dec, T_enc, a)`` activation.

For queries q ``(B, H, T_dec, a)`` (W_q s_t, split by head), projected keys K ``(B, H, T_enc, a)``
and v ``(H, a)``, per head::

    e_{t,i} = vᵀ tanh(q_t + K_i) = 2 vᵀ σ_{t,i} − Σ v,     σ_{t,i} = σ(2 q_t + 2 K_i)

(tanh(u) = 2σ(2u) − 1; ATen's CPU ``tanh`` is slower than its ``sigmoid``). Written with autograd,
the score materialises tanh(q_t + K_i) for every t and i, keeps it for the backward, and the
backward makes several more tensors of that size; with a 2d-wide key projection (a bidirectional
encoder) each is tens of MiB. Here the forward keeps nothing of that size (only q, K and v), and
both passes work through the steps in chunks of at most ``buffers.BLOCK_BYTES`` of σ on the CPU (the backward
recomputes σ and reads each chunk for all three gradients): a chunk that size is reused from the
heap on every call and stays in the caches, where one chunk of all steps would be faulted in afresh
on every call (measured: ``benchmarks/kernel_blocks.py``). With δe the incoming gradient and
σ' = σ(1 − σ)::

    δq_t = 4 v ⊙ Σ_i δe_{t,i} σ'_{t,i}
    δK_i = 4 v ⊙ Σ_t δe_{t,i} σ'_{t,i}
    δv   = Σ_{t,i} δe_{t,i} (2 σ_{t,i} − 1)

The same maths as ``AdditiveAttention.score_projected`` (tested: values, gradients, gradcheck).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnseq.kernels.buffers import steps_per_block


def supports(projected_query: Tensor, projected_keys: Tensor, v: Tensor) -> bool:
    """Full-precision tensors alike, outside autocast (under autocast autograd's score runs)."""
    tensors = (projected_query, projected_keys, v)
    return (
        projected_query.dtype in (torch.float32, torch.float64)
        and all(t.dtype == projected_query.dtype for t in tensors)
        and not torch.is_autocast_enabled(projected_query.device.type)
    )


def additive_scores(projected_query: Tensor, projected_keys: Tensor, v: Tensor) -> Tensor:
    """``(B, H or 1, T_dec, a)``, ``(B, H, T_enc, a)``, ``v (H, a)`` → scores ``(B, H, T_dec, T_enc)``."""
    heads = projected_keys.shape[1]
    query = projected_query.expand(-1, heads, -1, -1)  # (B, H, T_dec, a)
    return AdditiveScores.apply(query, projected_keys, v)


def _chunk_steps(query: Tensor, t_enc: int) -> int:
    batch, heads, _, a = query.shape
    return steps_per_block(batch * heads * t_enc * a * query.element_size(), query.device)


def _sigma(doubled_keys: Tensor, query: Tensor, buffer: Tensor) -> Tensor:
    """σ(2K_i + 2q_t) for a chunk of steps, contiguous at the front of the flat ``buffer``:
    ``(B, H, T_c, T_enc, a)``."""
    batch, heads, t_enc, a = doubled_keys.shape
    out = buffer[: batch * heads * query.shape[2] * t_enc * a].view(batch, heads, query.shape[2], t_enc, a)
    return torch.add(doubled_keys.unsqueeze(2), query.unsqueeze(3), alpha=2, out=out).sigmoid_()


class AdditiveScores(torch.autograd.Function):
    """``(query (B, H, T_dec, a), keys (B, H, T_enc, a), v (H, a))`` → scores ``(B, H, T_dec, T_enc)``."""

    @staticmethod
    def forward(ctx, query, keys, v):
        batch, heads, steps, a = query.shape
        t_enc = keys.shape[2]
        chunk = _chunk_steps(query, t_enc)
        doubled_keys = 2 * keys  # (B, H, T_enc, a)
        two_v = (2 * v).view(heads, a, 1)  # (H, a, 1)
        scores = query.new_empty(batch, heads, steps, t_enc)
        buffer = query.new_empty(batch * heads * min(chunk, steps) * t_enc * a)  # σ of one chunk
        for start in range(0, steps, chunk):
            stop = min(start + chunk, steps)
            sigma = _sigma(doubled_keys, query[:, :, start:stop], buffer)  # (B, H, T_c, T_enc, a)
            if heads == 1:  # a matrix-vector product: cheaper than a batched one
                chunk_scores = sigma.view(-1, a) @ two_v.view(a)  # (B·T_c·T_enc,)
            else:
                chunk_scores = sigma.view(batch, heads, -1, a) @ two_v  # (B, H, T_c·T_enc, 1)
            scores[:, :, start:stop] = chunk_scores.view(batch, heads, stop - start, t_enc)  # 2 vᵀσ
        scores -= v.sum(-1).view(1, heads, 1, 1)  # e = 2 vᵀσ − Σ v
        ctx.save_for_backward(query, keys, v)
        return scores

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_scores):
        query, keys, v = ctx.saved_tensors
        batch, heads, steps, a = query.shape
        t_enc = keys.shape[2]
        chunk = _chunk_steps(query, t_enc)
        doubled_keys = 2 * keys  # (B, H, T_enc, a)
        sigma_buffer = query.new_empty(batch * heads * min(chunk, steps) * t_enc * a)  # σ of one chunk
        slope_buffer = torch.empty_like(sigma_buffer)  # σ' of one chunk
        d_query = torch.empty_like(query)  # Σ_i δe σ', scaled by 4v at the end
        d_keys = torch.zeros_like(keys)  # Σ_t δe σ'
        d_sigma_sum = v.new_zeros(heads, a)  # Σ δe σ
        for start in range(0, steps, chunk):
            stop = min(start + chunk, steps)
            length = stop - start
            sigma = _sigma(doubled_keys, query[:, :, start:stop], sigma_buffer)  # (B, H, T_c, T_enc, a)
            d_score = grad_scores[:, :, start:stop]  # (B, H, T_c, T_enc)
            if heads == 1:
                d_sigma_sum[0].addmv_(sigma.view(-1, a).T, d_score.reshape(-1))  # (a,): Σ δe σ
            else:
                flat_score = d_score.reshape(batch, heads, 1, length * t_enc)  # (B, H, 1, T_c·T_enc)
                d_sigma_sum += (flat_score @ sigma.view(batch, heads, -1, a)).sum((0, 2))  # (H, a): Σ δe σ
            slope = torch.addcmul(
                sigma, sigma, sigma, value=-1, out=slope_buffer[: sigma.numel()].view_as(sigma)
            )  # σ' = σ − σ²
            slope.mul_(d_score.unsqueeze(-1))  # (B, H, T_c, T_enc, a): δe σ'
            d_query[:, :, start:stop] = slope.sum(3)  # (B, H, T_c, a)
            d_keys += slope.sum(2)  # (B, H, T_enc, a)
        four_v = (4 * v).view(1, heads, 1, a)  # (1, H, 1, a)
        d_v = 2 * d_sigma_sum - grad_scores.sum((0, 2, 3)).unsqueeze(-1)  # (H, a): Σ δe (2σ − 1)
        return d_query.mul_(four_v), d_keys.mul_(four_v), d_v
