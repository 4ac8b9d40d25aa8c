"""Transformer-style attention: queries, keys and values each get a learned projection, and every
head compares its own projected query and keys with a scaled dot product (Vaswani et al. 2017).

With ``d_m`` = ``model_dim`` (the key size d_k unless set) split into H heads of ``d_m / H``:

- q = W_Q s + b_Q, k_i = W_K h_i, v_i = W_V h_i + b_V, each ``d_m`` wide, head h owning the
  h-th slice ``q_h``, ``k_{h,i}``, ``v_{h,i}``;
- α_{h,i} = softmax_i(q_h · k_{h,i} / √(d_m / H)) over the real source positions;
- context = W_O [Σ_i α_{1,i} v_{1,i}; …; Σ_i α_{H,i} v_{H,i}] + b_O, ``d_k`` wide (what the
  decoders read).

``torch.nn.MultiheadAttention`` also has a key bias b_K. It adds the same q_h · b_{K,h} to every
score of a query, which the softmax takes away: it changes nothing and never gets a gradient, so
it is left out here (tests/test_multihead.py shows the outputs equal ``nn.MultiheadAttention``'s
whatever its key bias). Keys and values are projected once per batch, by ``project_keys``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnseq.attention.base import Attention


class MultiheadAttention(Attention):
    """Learned W_Q, W_K, W_V, W_O and a scaled dot per head; weights per head ``(B, H, T_dec, T_enc)``."""

    name = "multihead"
    values_are_keys = False

    def __init__(self, query_dim: int, key_dim: int, heads: int = 1, model_dim: int | None = None) -> None:
        super().__init__(query_dim, key_dim, heads)
        self.check_settings(model_dim=model_dim)
        self.model_dim = key_dim if model_dim is None else model_dim
        self.head_dim = self.model_dim // heads  # split_heads splits projected tensors, d_m wide
        self.W_Q = nn.Linear(query_dim, self.model_dim)
        self.W_K = nn.Linear(key_dim, self.model_dim, bias=False)
        self.W_V = nn.Linear(key_dim, self.model_dim)
        self.W_O = nn.Linear(self.model_dim, key_dim)
        for projection in (self.W_Q, self.W_K, self.W_V, self.W_O):  # as nn.MultiheadAttention initialises
            nn.init.xavier_uniform_(projection.weight)
            if projection.bias is not None:
                nn.init.zeros_(projection.bias)

    def query_weight(self) -> Tensor:
        """W_Q ``(d_m, d_q)``; its bias b_Q is added by ``split_query``."""
        return self.W_Q.weight

    def split_query(self, query: Tensor) -> Tensor:
        return self.split_heads(query + self.W_Q.bias)  # (B, H, T_dec, d_m / H)

    def project_keys(self, keys: Tensor) -> Tensor:
        """Each head's projected keys and values side by side: ``(B, H, T_enc, 2 · d_m / H)``."""
        projected_keys = self.split_heads(self.W_K(keys))  # (B, H, T_enc, d_m / H)
        values = self.split_heads(self.W_V(keys))  # (B, H, T_enc, d_m / H)
        return torch.cat([projected_keys, values], dim=-1)  # (B, H, T_enc, 2 · d_m / H)

    def scoring_keys(self, projected_keys: Tensor) -> Tensor:
        """The projected keys without the values: ``(B, H, T_enc, d_m / H)``."""
        return projected_keys[..., : self.head_dim]  # (B, H, T_enc, d_m / H)

    def score_projected(self, projected_query: Tensor, projected_keys: Tensor) -> Tensor:
        keys = projected_keys if projected_keys.shape[-1] == self.head_dim else self.scoring_keys(projected_keys)
        return projected_query @ keys.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, H, T_dec, T_enc)

    def average(self, weights: Tensor, keys: Tensor, projected_keys: Tensor) -> Tensor:
        """W_O over the heads' averaged values, plus b_O; zero where a source has no real token (as
        every scorer's context is)."""
        values = projected_keys[..., self.head_dim :]  # (B, H, T_enc, d_m / H)
        per_head = weights @ values  # (B, H, T_dec, d_m / H)
        batch, _, steps, _ = per_head.shape
        context = self.W_O(per_head.transpose(1, 2).reshape(batch, steps, self.model_dim))  # (B, T_dec, d_k)
        attends = weights[:, 0].sum(-1, keepdim=True) > 0  # (B, T_dec, 1): some real source token
        return torch.where(attends, context, torch.zeros_like(context))  # (B, T_dec, d_k)

    def values_through(self, keys: Tensor, weight: Tensor) -> Tensor:
        """Per head, the values through the head's columns of W_O and then ``weight (d_out, d_k)``, with
        ``weight b_O / H`` added: each head's weights sum to one, so ``Σ_h (weights_h @ this_h)`` is
        ``context @ weight.T``."""
        values = self.split_heads(self.W_V(keys))  # (B, H, T_enc, d_m / H)
        through = weight @ self.W_O.weight  # (d_out, d_m)
        blocks = through.view(through.shape[0], self.heads, self.head_dim)  # (d_out, H, d_m / H)
        bias = weight @ self.W_O.bias / self.heads  # (d_out,)
        return torch.einsum("bhtd,ohd->bhto", values, blocks) + bias  # (B, H, T_enc, d_out)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, model_dim={self.model_dim}"
