"""The portable model file: the model's config and weights as tensors and plain values, nothing
pickled. Training writes it; evaluation and the MLflow model rebuild the model from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnseq.model.config import ModelConfig
from attnseq.model.seq2seq import Seq2Seq, build_seq2seq


def load_model_file(path: str | Path) -> dict[str, Any]:
    """``{"model_config": ..., "state_dict": ...}``: tensors and plain values only — never arbitrary objects."""
    return torch.load(path, map_location="cpu", weights_only=True)


def load_saved_model(path: str | Path) -> Seq2Seq:
    """The model a model file describes, its weights strictly loaded, in eval mode."""
    saved = load_model_file(path)
    model = build_seq2seq(ModelConfig.from_saved(saved["model_config"]))
    model.load_state_dict(saved["state_dict"], strict=True)
    return model.eval()
