"""The built-in attention scores; their formulas, shapes and multi-head rules: docs/attention.md.

| scorer     | score e_{t,i}               | parameters                                            |
|------------|-----------------------------|-------------------------------------------------------|
| additive   | v_aᵀ tanh(W_a s + U_a h_i)  | W_a (d_attn, d_q), U_a (d_attn, d_k/H), v_a (d_attn,) |
| dot        | sᵀ h_i                      | — (d_q == d_k)                                        |
| scaled_dot | sᵀ h_i / √d_h               | — (d_q == d_k)                                        |
| general    | sᵀ W h_i                    | W (d_q, d_k)                                          |
| concat     | v_aᵀ tanh(W_a [s; h_i])     | W_a (d_attn, d_q + d_k/H), v_a (d_attn,)              |
| uniform    | 0 (α_i = 1/|x|, c = mean h) | —                                                     |

Each class registers itself by its ``name`` and declares what it needs (``fused_recurrence``); its
settings and ``same_size`` are its model in ``attnseq.attention.settings``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnseq.attention.base import Attention
from attnseq.kernels.activations import fast_tanh


def _uniform_(tensor: Tensor, fan_in: int) -> Tensor:
    """The default initialisation of ``nn.Linear``: U(-1/√fan_in, 1/√fan_in)."""
    bound = 1.0 / math.sqrt(fan_in)
    return nn.init.uniform_(tensor, -bound, bound)


class DotAttention(Attention):
    """Luong dot: e = sᵀh; each head compares its slice of the query with its slice of the keys."""

    name = "dot"
    fused_recurrence = "multiplicative"

    def score_scale(self) -> float:
        """λ of a multiplicative score e_h = λ q_hᵀ K_h (``fused_recurrence = "multiplicative"``)."""
        return 1.0

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.split_heads(keys)  # (B, H, T_enc, d_h)

    def split_query(self, query: Tensor) -> Tensor:
        return self.split_heads(query)  # (B, H, T_dec, d_h)

    def score_projected(self, projected_query: Tensor, projected_keys: Tensor) -> Tensor:
        return projected_query @ projected_keys.transpose(-1, -2)  # (B, H, T_dec, T_enc)


class ScaledDotAttention(DotAttention):
    """Scaled dot product: e = sᵀh / √d_h, the transformer's score (d_h = d_k with one head)."""

    name = "scaled_dot"
    fused_recurrence = "multiplicative"

    def score_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def score_projected(self, projected_query: Tensor, projected_keys: Tensor) -> Tensor:
        scores = super().score_projected(projected_query, projected_keys)  # (B, H, T_dec, T_enc)
        return scores / math.sqrt(self.head_dim)


class GeneralAttention(Attention):
    """Luong general: e = sᵀ W h with W of shape (d_q, d_k); head h owns W's h-th column block."""

    name = "general"
    fused_recurrence = "multiplicative"

    def __init__(self, query_dim: int, key_dim: int, heads: int = 1) -> None:
        super().__init__(query_dim, key_dim, heads)
        self.W = nn.Parameter(_uniform_(torch.empty(query_dim, key_dim), key_dim))

    def project_keys(self, keys: Tensor) -> Tensor:
        blocks = self.W.view(self.query_dim, self.heads, self.head_dim)  # (d_q, H, d_h)
        # W_h k_h for every head: the keys brought into query space, once per batch.
        return torch.einsum("bhtd,qhd->bhtq", self.split_heads(keys), blocks)  # (B, H, T_enc, d_q)

    def split_query(self, query: Tensor) -> Tensor:
        return query.unsqueeze(1)  # (B, 1, T_dec, d_q): every head compares the whole query

    def score_scale(self) -> float:
        """λ of a multiplicative score e_h = λ qᵀ K_h (``fused_recurrence = "multiplicative"``)."""
        return 1.0

    def score_projected(self, projected_query: Tensor, projected_keys: Tensor) -> Tensor:
        return projected_query @ projected_keys.transpose(-1, -2)  # (B, H, T_dec, T_enc)


class AdditiveAttention(Attention):
    """Bahdanau additive: e = v_aᵀ tanh(W_a s + U_a h); head h owns the h-th row block of W_a,
    U_a and v_a (``attn_dim / heads`` rows each)."""

    name = "additive"
    fused_recurrence = "additive"

    def __init__(self, query_dim: int, key_dim: int, heads: int = 1, attn_dim: int | None = None) -> None:
        super().__init__(query_dim, key_dim, heads)
        self.check_settings(attn_dim=attn_dim)
        self.attn_dim = key_dim if attn_dim is None else attn_dim
        self.head_attn_dim = self.attn_dim // heads
        self._init_parameters()

    def _init_parameters(self) -> None:
        self.W_a = nn.Parameter(_uniform_(torch.empty(self.attn_dim, self.query_dim), self.query_dim))
        self.U_a = nn.Parameter(_uniform_(torch.empty(self.attn_dim, self.head_dim), self.head_dim))
        self.v_a = nn.Parameter(_uniform_(torch.empty(self.attn_dim), self.attn_dim))

    def query_weight(self) -> Tensor:
        """The matrix applied to the query: ``(d_attn, d_q)``."""
        return self.W_a

    def key_weight(self) -> Tensor:
        """The matrix applied to each head's key slice: ``(d_attn, d_k / H)``."""
        return self.U_a

    def project_keys(self, keys: Tensor) -> Tensor:
        blocks = self.key_weight().view(self.heads, self.head_attn_dim, self.head_dim)  # (H, a, d_h)
        return torch.einsum("bhtd,had->bhta", self.split_heads(keys), blocks)  # (B, H, T_enc, a)

    def split_query(self, query: Tensor) -> Tensor:
        batch, steps, _ = query.shape  # query: W_a s, (B, T_dec, d_attn)
        return query.view(batch, steps, self.heads, self.head_attn_dim).transpose(1, 2)  # (B, H, T_dec, a)

    def score_projected(self, projected_query: Tensor, projected_keys: Tensor) -> Tensor:
        hidden = fast_tanh(projected_query.unsqueeze(3) + projected_keys.unsqueeze(2))  # (B, H, T_dec, T_enc, a)
        if self.heads == 1:  # a matrix-vector product: cheaper than einsum's batched one, with its backward
            return (hidden.reshape(-1, self.head_attn_dim) @ self.v_a).view(hidden.shape[:-1])  # (B, 1, T_dec, T_enc)
        v_a = self.v_a.view(self.heads, self.head_attn_dim)  # (H, a)
        return torch.einsum("bhsta,ha->bhst", hidden, v_a)  # (B, H, T_dec, T_enc)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, attn_dim={self.attn_dim}"


class ConcatAttention(AdditiveAttention):
    """Luong concat: e = v_aᵀ tanh(W_a [s; h]), one matrix over the concatenated pair.

    W_a's first d_q columns act on the query, the rest on the key slice, so the maths is the
    additive score with W_a = [W_s | W_h] (and the same fused recurrence computes it); keys are
    still projected once per batch.
    """

    name = "concat"
    fused_recurrence = "additive"

    def _init_parameters(self) -> None:
        fan_in = self.query_dim + self.head_dim
        self.W_a = nn.Parameter(_uniform_(torch.empty(self.attn_dim, fan_in), fan_in))
        self.v_a = nn.Parameter(_uniform_(torch.empty(self.attn_dim), self.attn_dim))

    def query_weight(self) -> Tensor:
        return self.W_a[:, : self.query_dim]  # (d_attn, d_q)

    def key_weight(self) -> Tensor:
        return self.W_a[:, self.query_dim :]  # (d_attn, d_h)


class UniformAttention(Attention):
    """Wiegreffe & Pinter's (2019) baseline: every score is 0, so the weights are 1/|x| at each real source
    position and 0 on padding, and the context is the mean of the real encoder states (per head: the mean of
    the head's slice). No parameters; the query is never read (``content_based = False``)."""

    name = "uniform"
    content_based = False

    def project_keys(self, keys: Tensor) -> Tensor:
        batch, length, _ = keys.shape
        return keys.new_zeros(batch, self.heads, length, 0)  # (B, H, T_enc, 0): nothing to compare

    def split_query(self, query: Tensor) -> Tensor:
        return query[..., :0].unsqueeze(1)  # (B, 1, T_dec, 0): the query is not read

    def score_projected(self, projected_query: Tensor, projected_keys: Tensor) -> Tensor:
        batch, heads, length, _ = projected_keys.shape
        steps = projected_query.shape[2]
        return projected_keys.new_zeros(batch, heads, steps, length)  # (B, H, T_dec, T_enc): e = 0
