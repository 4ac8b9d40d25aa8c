"""Evaluation metrics: length-bucketed accuracy, attention diagnostics, text scores, and the suite
of registered metrics that validation and evaluation share (``attnseq.metrics.suite``).

The names below are imported on first use, so that the metrics' names and capabilities
(``attnseq.metrics.declarations``) load without torch: the config is checked against them first."""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    **dict.fromkeys(("DIAGNOSTICS", "METRICS", "SHAPE_DIAGNOSTICS", "SuiteSpec", "bucket_bounds", "bucket_digits",
                     "bucket_name", "lower_is_better", "names"), "declarations"),
    **dict.fromkeys(("AttentionDiagnostics", "StepDiagnostics", "alignment_accuracy", "attention_entropy",
                     "step_diagnostics", "step_entropy"), "alignment"),
    **dict.fromkeys(("LengthBucketedAccuracy", "LengthBuckets"), "length_buckets"),
    **dict.fromkeys(("BatchOutputs", "SuiteMetric"), "members"), "MetricSuite": "suite",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"attnseq.metrics.{_HOMES[name]}"), name)
