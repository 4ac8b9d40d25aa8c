"""The typed config: ``validate_train``/``validate_evaluate`` turn a composed config into a
``TrainConfig``/``EvalConfig`` or one ``ConfigError`` naming every problem. Torch-free; names are
imported on first use (the choices' settings models import ``attnseq.problems``)."""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "EvalConfig": "models", "TrainConfig": "models", "shown": "attnseq.problems", "validate_evaluate": "validate",
    "validate_train": "validate", "closest": "attnseq.registry", "did_you_mean": "attnseq.registry",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOMES[name]
    return getattr(importlib.import_module(home if "." in home else f"attnseq.config.{home}"), name)
