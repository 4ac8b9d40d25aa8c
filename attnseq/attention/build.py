"""Building a scorer by its registered name; importing this module registers the built-in scorers."""

from __future__ import annotations

from typing import Any

import attnseq.attention.multihead  # noqa: F401  (registers the built-in scorers)
import attnseq.attention.scorers  # noqa: F401
from attnseq.attention.base import Attention
from attnseq.attention.local import build_window
from attnseq.attention.registry import SCORERS
from attnseq.attention.settings import GlobalSettings, LocalSettings


def scorer_class(name: str) -> type[Attention]:
    """The class registered as ``name``; an unknown name raises ``ConfigError`` listing the known ones."""
    return SCORERS.lookup(name)


def scorer_names(**capabilities: object) -> list[str]:
    """The registered names whose classes have every given capability, e.g.
    ``scorer_names(same_size=True)``; all of them without arguments."""
    return SCORERS.names(**capabilities)


GLOBAL = GlobalSettings()
"""Global attention: every real source position (``attention.local=none``)."""


def build_attention(scorer: str, query_dim: int, key_dim: int, heads: int = 1,
                    local: LocalSettings = GLOBAL, **options: Any) -> Attention:
    """Build the scorer registered as ``scorer`` with its own ``options`` (e.g. ``attn_dim=64``), global or
    within the window ``local`` describes (``attention.*``: Luong's local-m or local-p); an unknown name, an
    unknown option or sizes that cannot work raise ``ConfigError`` here, at once."""
    cls = scorer_class(scorer)
    attention = cls(query_dim, key_dim, heads=heads, **cls.settings(options))
    attention.window = build_window(local, query_dim)
    return attention
