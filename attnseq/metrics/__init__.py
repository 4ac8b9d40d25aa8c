"""Evaluation metrics: length-bucketed accuracy and attention diagnostics."""

from attnseq.metrics.alignment import (
    DIAGNOSTICS,
    SHAPE_DIAGNOSTICS,
    AttentionDiagnostics,
    StepDiagnostics,
    alignment_accuracy,
    attention_entropy,
    step_diagnostics,
    step_entropy,
)
from attnseq.metrics.length_buckets import (
    LengthBucketedAccuracy,
    LengthBuckets,
    bucket_bounds,
    bucket_digits,
    bucket_name,
)

__all__ = [
    "DIAGNOSTICS",
    "SHAPE_DIAGNOSTICS",
    "AttentionDiagnostics",
    "LengthBucketedAccuracy",
    "LengthBuckets",
    "StepDiagnostics",
    "alignment_accuracy",
    "attention_entropy",
    "bucket_bounds",
    "bucket_digits",
    "bucket_name",
    "step_diagnostics",
    "step_entropy",
]
