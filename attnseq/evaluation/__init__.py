"""Evaluating saved runs: rebuild from MLflow artifacts, measure past the training lengths,
check attention counterfactually, compare runs side by side; and translating with one
(``attnseq.evaluation.translate``, which loads neither Lightning nor the evaluation pipeline)."""

from __future__ import annotations

from typing import Any

__all__ = ["evaluate"]


def __getattr__(name: str) -> Any:
    if name == "evaluate":  # on first use: the pipeline imports Lightning (the data module), seconds
        from attnseq.evaluation.pipeline import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
