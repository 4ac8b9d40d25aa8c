"""The tags attnseq sets on its MLflow runs, and the kinds of run, each named once.

MLflow's own tags (run name, parent run, source commit) keep MLflow's names, from
``mlflow.utils.mlflow_tags``. The runtime a run was made with is recorded as ``runtime.*`` params,
named in ``provenance``.
"""

from __future__ import annotations

from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NOTE

KIND = "attnseq.kind"
"""What a run is: one of the kinds below."""
TRAIN = "train"
SWEEP = "sweep"
EVALUATION = "eval"
COMPARISON = "comparison"

CHOICES = "attnseq.choices"
"""A training run's config choices, ``copy-gru-additive-bahdanau-h1``."""
OVERRIDES = "attnseq.overrides"
"""A training run's command-line overrides, secrets masked."""
ERROR = "attnseq.error"
"""Why a sweep job was rejected before training."""
RESUMED_FROM = "attnseq.resumed_from"
"""The checkpoint a resumed training run continued from."""
RESUME_OVERRIDES = "attnseq.resume_overrides"
"""The overrides a resume applied on top of the run's own config (``trainer.max_epochs=10``)."""
RESUME_RUNTIME = "attnseq.resume_runtime"
"""What the latest resume ran with that differs from the run's ``runtime.*`` params (those record its
first start; a param cannot change), as ``provenance.runtime_changes`` writes it: ``unchanged`` when nothing does."""
DDP_RENDEZVOUS = "attnseq.ddp_rendezvous"
"""A multi-node training run's ``MASTER_ADDR:MASTER_PORT``: the other nodes find rank 0's run by it
(``lifecycle.nodes``)."""
SLURM_JOB = "attnseq.slurm_job"
"""The Slurm job (``SLURM_JOB_ID``) a training run was started in: the job, when Slurm requeues it,
continues the run it finds by this tag (``lifecycle.requeue``)."""
HEARTBEAT = "attnseq.heartbeat"
"""A training run's last sign of life (Unix time), refreshed while its process trains."""
FIRST_STEP_S = "attnseq.first_step_s"
"""Seconds from the training process's start to its first training step (``training.startup``); a
resumed run holds its latest start's."""
AVERAGED = "attnseq.averaged"
"""Which checkpoints a training run's averaged model (``paths.AVERAGED_MODEL``) is the mean of."""
NOTE = MLFLOW_RUN_NOTE
"""A run's description, Markdown, shown on its page's Overview: what the run is, where its pictures are."""

CREATE_ID = "attnseq.create_id"
"""A random id sent with a run's creation, so a creation whose answer was lost (a slow server) is
looked up, not made again (``TrackedRun.create``)."""

SWEEP_ID = "attnseq.sweep_id"
"""The sweep's parent run id, on the parent and on every job."""
JOB_NUM = "attnseq.job_num"
SWEEP_DIR = "attnseq.sweep_dir"
SWEEP_OVERRIDES = "attnseq.sweep_overrides"
SWEEP_KEYS = "attnseq.sweep_keys"
"""The override keys whose values vary across the sweep, comma-separated."""
STUDY = "attnseq.study"
"""A shared Optuna study's name, on its one parent run (``training.study``); its jobs' ``JOB_NUM`` is
their trial number."""

EVALUATED_RUN = "attnseq.evaluated_run"
COMPARED_RUNS = "attnseq.compared_runs"


def tag_equals(key: str, value: str) -> str:
    """A clause of MLflow's run search: ``tags.`attnseq.kind` = 'train'``."""
    return f"tags.`{key}` = '{value}'"


def children_of(parent_run_id: str) -> str:
    """The search clause for the runs nested under ``parent_run_id``."""
    return tag_equals(MLFLOW_PARENT_RUN_ID, parent_run_id)
