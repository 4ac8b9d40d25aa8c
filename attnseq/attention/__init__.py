"""Attention mechanisms with one call signature: ``context, weights = attention(query, keys, valid_mask)``."""

from __future__ import annotations

from attnseq.attention.base import Attention
from attnseq.attention.masking import lengths_to_valid_mask, masked_softmax
from attnseq.attention.scorers import (
    AdditiveAttention,
    ConcatAttention,
    DotAttention,
    GeneralAttention,
    ScaledDotAttention,
)
from attnseq.errors import ConfigError

SCORERS: dict[str, type[Attention]] = {
    "additive": AdditiveAttention,
    "dot": DotAttention,
    "general": GeneralAttention,
    "concat": ConcatAttention,
    "scaled_dot": ScaledDotAttention,
}
"""Every attention scorer by the name users pick it with (``scorer=...``)."""

NO_ATTENTION = "none"
"""The scorer name of the fixed-vector baseline: no attention at all."""


def build_attention(
    scorer: str, query_dim: int, key_dim: int, attn_dim: int | None = None, heads: int = 1
) -> Attention:
    """Build an attention mechanism by name; invalid sizes raise ``ConfigError`` here, at once."""
    if scorer not in SCORERS:
        raise ConfigError(
            f"unknown attention scorer {scorer!r}.",
            f"use one of {sorted(SCORERS)} (or '{NO_ATTENTION}' for the no-attention baseline).",
        )
    cls = SCORERS[scorer]
    if issubclass(cls, AdditiveAttention):
        return cls(query_dim, key_dim, attn_dim=attn_dim, heads=heads)
    return cls(query_dim, key_dim, heads=heads)


__all__ = [
    "Attention",
    "AdditiveAttention",
    "ConcatAttention",
    "DotAttention",
    "GeneralAttention",
    "NO_ATTENTION",
    "SCORERS",
    "ScaledDotAttention",
    "build_attention",
    "lengths_to_valid_mask",
    "masked_softmax",
]
