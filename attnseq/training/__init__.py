"""The training service: ``train(cfg)`` (``pipeline``), the builders it uses (``build``), the
LightningModule, sweeps; every record goes through ``attnseq.tracking``, and what keeps a run safe
(signals, guards, heartbeat, resume) is ``attnseq.lifecycle``.

The names below are imported on first use, so that importing ``attnseq.training`` loads nothing heavy."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_datamodule": "attnseq.training.build",
    "build_module": "attnseq.training.build",
    "model_config": "attnseq.training.build",
    "validate": "attnseq.training.build",
    "Seq2SeqLitModule": "attnseq.training.lit_module",
    "train": "attnseq.training.pipeline",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
