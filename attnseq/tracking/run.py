"""``TrackedRun``: one MLflow run, and the only way records reach it.

Training runs, sweep parents, failed sweep jobs, evaluation and comparison runs are all created
and written through it, so its rules hold for every one of them: every run carries the commit it
was made from (``provenance.git_tags``); every param and tag value is redacted by its key before
it is sent (``redaction.redact``); params and tags go in one ``log_batch``, which MLflow's client
splits at the store's limits itself.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

from attnseq.tracking.provenance import git_tags
from attnseq.tracking.redaction import redact

PARAM_LENGTH = 6000
TAG_LENGTH = 5000
"""Values are cut to these lengths, inside MLflow's limits for params and tags."""


class TrackedRun:
    def __init__(self, client: MlflowClient, run_id: str, name: str) -> None:
        self.client = client
        self.run_id = run_id
        self.name = name

    @classmethod
    def create(
        cls,
        client: MlflowClient,
        experiment_id: str,
        name: str,
        tags: Mapping[str, Any],
        parent_run_id: str | None = None,
    ) -> TrackedRun:
        """A new run named ``name``, tagged with ``tags``, the source commit and, when given, its parent."""
        all_tags = {MLFLOW_RUN_NAME: name, **git_tags(), **tags}
        if parent_run_id:
            all_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
        safe = {key: _tag_value(key, value) for key, value in all_tags.items()}
        run = client.create_run(experiment_id, tags=safe, run_name=safe[MLFLOW_RUN_NAME])
        return cls(client, run.info.run_id, run.info.run_name)

    @classmethod
    def reopen(cls, client: MlflowClient, run_id: str) -> TrackedRun:
        """An existing run, RUNNING again (``resume=``)."""
        client.update_run(run_id, status="RUNNING")
        return cls(client, run_id, client.get_run(run_id).info.run_name)

    # -- values ----------------------------------------------------------------------------
    def log_params(self, params: Mapping[str, Any]) -> None:
        self.client.log_batch(
            self.run_id, params=[Param(key, redact(key, value)[:PARAM_LENGTH]) for key, value in params.items()]
        )

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(key, _tag_value(key, value)) for key, value in tags.items()])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(key, float(value), now, step or 0) for key, value in metrics.items()]
        )

    # -- artifacts -------------------------------------------------------------------------
    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_file(self, local_path: str | Path, artifact_folder: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(local_path), artifact_folder)

    def log_table(self, table: Mapping[str, list], artifact_file: str) -> None:
        """Appends to the table already at ``artifact_file``, if any."""
        self.client.log_table(self.run_id, dict(table), artifact_file)

    def log_image(self, image: np.ndarray, artifact_file: str) -> None:
        self.client.log_image(self.run_id, image, artifact_file=artifact_file)

    def log_image_step(self, image: np.ndarray, key: str, step: int) -> None:
        """One step of a time-stepped image: the MLflow UI shows a slider over the steps of ``key``."""
        self.client.log_image(self.run_id, image, key=key, step=step)

    # -- status ----------------------------------------------------------------------------
    def finish(self, status: str) -> None:
        """``FINISHED``, ``FAILED`` or ``KILLED``."""
        self.client.set_terminated(self.run_id, status)


def _tag_value(key: str, value: Any) -> str:
    return redact(key, value)[:TAG_LENGTH]
