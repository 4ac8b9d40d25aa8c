"""Evaluating saved runs: rebuild from MLflow artifacts, measure past the training lengths,
check attention counterfactually, compare runs side by side."""

from attnseq.evaluation.pipeline import evaluate

__all__ = ["evaluate"]
