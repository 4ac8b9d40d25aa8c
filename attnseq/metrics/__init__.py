"""Evaluation metrics: length-bucketed accuracy and attention diagnostics."""

from attnseq.metrics.alignment import (
    AttentionDiagnostics,
    alignment_accuracy,
    alignment_counts,
    attention_entropy,
    entropy_sums,
    step_entropy,
)
from attnseq.metrics.length_buckets import LengthBucketedAccuracy, bucket_bounds, bucket_digits, bucket_name

__all__ = [
    "AttentionDiagnostics",
    "LengthBucketedAccuracy",
    "alignment_accuracy",
    "alignment_counts",
    "attention_entropy",
    "bucket_bounds",
    "bucket_digits",
    "bucket_name",
    "entropy_sums",
    "step_entropy",
]
