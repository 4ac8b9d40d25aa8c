"""Accuracy and exact match by source length as MLflow metrics, so MLflow's own charts overlay runs'
curves.

Each curve is one metric (``val/acc_by_length``, ``eval/exact_by_length``, …) whose *step* is a length
bucket's upper length and whose value is the bucket's score: in MLflow's chart view, a line chart of
the metric over steps is the accuracy-vs-length curve, and selecting runs draws theirs on one chart.
The per-bucket keys (``val/acc_len/01-05``) keep each bucket's history over training.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from attnseq.tracking.run import TrackedRun

ACC_BY_LENGTH = "acc_by_length"
EXACT_BY_LENGTH = "exact_by_length"
CURVES = {ACC_BY_LENGTH: "acc", EXACT_BY_LENGTH: "exact_match"}
"""Each curve's metric name → the bucket rows' column it plots."""


def length_curve_points(stage: str, rows: Sequence[Mapping]) -> dict[int, dict[str, float]]:
    """Bucket rows (``hi`` and the ``CURVES`` columns) → ``{upper length: {"<stage>/acc_by_length": …}}``;
    a bucket without a score (no sequences) is left out of that curve."""
    points: dict[int, dict[str, float]] = {}
    for row in rows:
        values = {f"{stage}/{name}": float(row[column]) for name, column in CURVES.items()
                  if row.get(column) is not None}
        if values:
            points[int(row["hi"])] = values
    return points


def log_length_curves(run: TrackedRun, stage: str, rows: Sequence[Mapping]) -> None:
    """Log ``stage``'s curves on ``run``: one batch per bucket, stepped by the bucket's upper length."""
    for upper_length, metrics in length_curve_points(stage, rows).items():
        run.log_metrics(metrics, step=upper_length)
