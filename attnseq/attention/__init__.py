"""Attention mechanisms with one call signature: ``context, weights = attention(query, keys, valid_mask)``.

Scorers register themselves by name (``attnseq.attention.registry``); the maths: docs/attention.md.
"""

from __future__ import annotations

from typing import Any

from attnseq.attention.base import Attention
from attnseq.attention.masking import lengths_to_valid_mask, masked_softmax
from attnseq.attention.multihead import MultiheadAttention
from attnseq.attention.registry import NO_ATTENTION, SCORERS, import_plugins, scorer_class, scorer_names
from attnseq.attention.scorers import (
    AdditiveAttention,
    ConcatAttention,
    DotAttention,
    GeneralAttention,
    ScaledDotAttention,
)


def build_attention(scorer: str, query_dim: int, key_dim: int, heads: int = 1, **options: Any) -> Attention:
    """Build the scorer registered as ``scorer`` with its own ``options`` (e.g. ``attn_dim=64``);
    an unknown name, an unknown option or sizes that cannot work raise ``ConfigError`` here, at once."""
    cls = scorer_class(scorer)
    return cls(query_dim, key_dim, heads=heads, **cls.settings(options))


__all__ = [
    "Attention",
    "AdditiveAttention",
    "ConcatAttention",
    "DotAttention",
    "GeneralAttention",
    "MultiheadAttention",
    "NO_ATTENTION",
    "SCORERS",
    "ScaledDotAttention",
    "build_attention",
    "import_plugins",
    "lengths_to_valid_mask",
    "masked_softmax",
    "scorer_class",
    "scorer_names",
]
