"""``SweepParentRun``: a Hydra callback that gives every multirun one MLflow parent run.

Registered in ``conf/train.yaml`` under ``hydra.callbacks``. In the launching process it
creates the experiment (and so the store's schema) and the parent run, then hands the parent's
id and the varying override keys to the jobs through the environment; jobs become its children
(``mlflow.parentRunId``) and are named after the overrides that vary. At the end it marks the
parent FINISHED when every child finished, FAILED otherwise, and prints a summary.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from omegaconf import DictConfig, OmegaConf

from attnseq.training.tracking import (
    PARENT_RUN_ENV,
    SWEEP_KEYS_ENV,
    check_tracking_uri,
    create_run,
    ensure_experiment,
    git_commit,
    redact,
)

log = logging.getLogger(__name__)


def sweep_keys(config: DictConfig) -> list[str]:
    """Keys whose value varies across the sweep: comma/range overrides and a sweeper's search space."""
    overrides = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
    keys = [o.get_key_element().lstrip("+~") for o in overrides if o.is_sweep_override()]
    params = OmegaConf.select(config, "hydra.sweeper.params")
    if params:
        keys += [str(k) for k in params.keys() if str(k) not in keys]
    return keys


class SweepParentRun(Callback):
    def __init__(self) -> None:
        self.client: MlflowClient | None = None
        self.parent_run_id: str | None = None
        self.experiment_id: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        uri = config.mlflow.tracking_uri
        check_tracking_uri(uri)
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = ensure_experiment(self.client, config.mlflow.experiment_name)
        keys = sweep_keys(config)
        sweep_dir = str(config.hydra.sweep.dir)
        commit, dirty = git_commit()
        tags = {
            "attnseq.kind": "sweep",
            "attnseq.sweep_dir": sweep_dir,
            "attnseq.sweep_overrides": redact("overrides", " ".join(config.hydra.overrides.task)),
            "attnseq.sweep_keys": ",".join(keys),
        }
        if commit:
            tags.update({"git_commit": commit, "git_dirty": str(dirty)})
        name = f"sweep {os.path.basename(sweep_dir.rstrip('/'))}: {', '.join(keys) or 'jobs'}"
        self.parent_run_id = create_run(self.client, self.experiment_id, name, tags, parent_run_id=None)
        self.client.set_tag(self.parent_run_id, "attnseq.sweep_id", self.parent_run_id)
        os.environ[PARENT_RUN_ENV] = self.parent_run_id
        os.environ[SWEEP_KEYS_ENV] = json.dumps(keys)
        atexit.register(self._close, "FAILED")  # a job that raised skips on_multirun_end
        log.info("MLflow parent run %s for this sweep (%s)", self.parent_run_id, uri)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._close(None)

    def _close(self, forced_status: str | None) -> None:
        if self.client is None or self.parent_run_id is None:
            return
        client, parent = self.client, self.parent_run_id
        self.client = None  # close once
        os.environ.pop(PARENT_RUN_ENV, None)
        os.environ.pop(SWEEP_KEYS_ENV, None)
        children = client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent}'"
        )
        rows = sorted((c.info.run_name or c.info.run_id, c.info.status) for c in children)
        failed = [name for name, status in rows if status != "FINISHED"]
        summary = "\n".join(f"{status:9s} {name}" for name, status in rows)
        client.log_text(parent, summary + "\n", "sweep_summary.txt")
        client.log_metric(parent, "sweep/jobs", len(rows))
        client.log_metric(parent, "sweep/failed_jobs", len(failed))
        status = forced_status or ("FAILED" if failed or not rows else "FINISHED")
        client.set_terminated(parent, status)
        print(f"\nSweep parent run {parent}: {len(rows)} jobs, {len(failed)} not finished\n{summary}")
