"""Attention mechanisms with one call signature: ``context, weights = attention(query, keys, valid_mask)``.

Scorers register themselves by name (``attnseq.attention.registry``); the maths: docs/attention.md.
Names are imported on first use, so that the config (``attnseq.attention.settings``) is read
without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "Attention": "base", "lengths_to_valid_mask": "masking", "masked_softmax": "masking",
    "MultiheadAttention": "multihead", "NO_ATTENTION": "settings", "SCORERS": "registry",
    "import_plugins": "registry", "scorer_class": "build", "scorer_names": "build",
    "AdditiveAttention": "scorers", "ConcatAttention": "scorers", "DotAttention": "scorers",
    "GeneralAttention": "scorers", "ScaledDotAttention": "scorers",
    "UniformAttention": "scorers", "build_attention": "build",
    "LOCAL_ATTENTION": "settings", "LocalSettings": "settings", "GlobalSettings": "settings",
    "MonotonicSettings": "settings", "PredictiveSettings": "settings", "LocalWindow": "local", "WINDOWS": "local",
    "build_window": "local",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    importlib.import_module("attnseq.attention.scorers")  # the built-in scorers registered before any lookup
    importlib.import_module("attnseq.attention.multihead")
    return getattr(importlib.import_module(f"attnseq.attention.{_HOMES[name]}"), name)
