"""Resuming a run into the same MLflow run: ``python train.py resume=<run id>``.

The run's own config (its resolved-config artifact) is used, so no overrides need repeating; the
newest checkpoint — the local ``last.ckpt`` in the run's output folder, else the copy uploaded
to the run's artifacts every epoch — restores weights, optimizer, schedule and loop counters;
and ``RunLogger`` drops any metric at a step the run already holds (``Resumption.logged_through``),
so replayed steps are never logged twice.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from attnseq.errors import ConfigError
from attnseq.tracking import paths, tags


@dataclass
class Resumption:
    run_id: str
    checkpoint: Path
    logged_through: dict[str, int]  # metric → the highest step the run already holds


def prepare_resume(client: MlflowClient, run_id: str, current: DictConfig) -> tuple[DictConfig, Resumption]:
    """The run's saved config (with ``resume`` set) and where to resume from."""
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ConfigError(
            f"resume={run_id}: no such run in {client.tracking_uri}.",
            "copy the run id from the MLflow UI, and check mlflow.tracking_uri points at its store.",
        ) from None
    if run.data.tags.get(tags.KIND) != tags.TRAIN:
        raise ConfigError(
            f"resume={run_id}: run '{run.info.run_name}' is not a training run.",
            "pass a training run's id.",
        )
    if run.info.status == "FINISHED":
        raise ConfigError(
            f"resume={run_id}: run '{run.info.run_name}' already FINISHED.",
            "start a new run instead; to train longer, pass trainer.max_epochs to a new run.",
        )
    saved = OmegaConf.create(yaml.safe_load(_download(client, run_id, paths.RESOLVED_CONFIG, "its config")))
    saved.resume = run_id
    saved.mlflow.tracking_uri = current.mlflow.tracking_uri  # the saved one may be redacted
    local = Path(saved.paths.output_dir) / paths.LAST_CHECKPOINT
    if local.is_file():
        checkpoint = local
    else:
        saved.paths.output_dir = current.paths.output_dir
        target = Path(saved.paths.output_dir)
        target.mkdir(parents=True, exist_ok=True)
        checkpoint = Path(_download(client, run_id, paths.LAST_CHECKPOINT, "a checkpoint", target, text=False))
    logged = {key: max(m.step for m in client.get_metric_history(run_id, key)) for key in run.data.metrics}
    return saved, Resumption(run_id, checkpoint, logged)


def _download(client: MlflowClient, run_id: str, artifact: str, what: str, target: Path | None = None,
              text: bool = True) -> str:
    folder = str(target) if target is not None else tempfile.mkdtemp()
    try:
        path = client.download_artifacts(run_id, artifact, folder)
    except (MlflowException, OSError):
        raise ConfigError(
            f"resume={run_id}: the run has no '{artifact}' artifact, so {what} cannot be restored.",
            "a run killed before its first epoch ended has nothing to resume: start it again.",
        ) from None
    return Path(path).read_text() if text else path
