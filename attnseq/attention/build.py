"""Building a scorer by its registered name."""

from __future__ import annotations

from typing import Any

import attnseq.attention.multihead  # noqa: F401  (registers the built-in scorers)
import attnseq.attention.scorers  # noqa: F401
from attnseq.attention.base import Attention
from attnseq.attention.registry import scorer_class


def build_attention(scorer: str, query_dim: int, key_dim: int, heads: int = 1, **options: Any) -> Attention:
    """Build the scorer registered as ``scorer`` with its own ``options`` (e.g. ``attn_dim=64``);
    an unknown name, an unknown option or sizes that cannot work raise ``ConfigError`` here, at once."""
    cls = scorer_class(scorer)
    return cls(query_dim, key_dim, heads=heads, **cls.settings(options))
