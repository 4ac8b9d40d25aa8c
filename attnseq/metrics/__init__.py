"""Evaluation metrics: length-bucketed accuracy, attention diagnostics, text scores, and the suite
of registered metrics that validation and evaluation share (``attnseq.metrics.suite``)."""

from attnseq.metrics import families  # noqa: F401  (registers the built-in metrics)
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
from attnseq.metrics.suite import (
    METRICS,
    BatchOutputs,
    MetricSuite,
    SuiteMetric,
    SuiteSpec,
    lower_is_better,
    names,
)

__all__ = [
    "DIAGNOSTICS",
    "METRICS",
    "SHAPE_DIAGNOSTICS",
    "AttentionDiagnostics",
    "BatchOutputs",
    "LengthBucketedAccuracy",
    "LengthBuckets",
    "MetricSuite",
    "StepDiagnostics",
    "SuiteMetric",
    "SuiteSpec",
    "alignment_accuracy",
    "attention_entropy",
    "bucket_bounds",
    "bucket_digits",
    "bucket_name",
    "lower_is_better",
    "names",
    "step_diagnostics",
    "step_entropy",
]
