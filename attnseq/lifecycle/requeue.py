"""A Slurm job that its scheduler requeues (a preemption, ``scontrol requeue``, Lightning's auto-requeue
on SIGUSR1, a node that failed under ``--requeue``) runs its command again from the start, with the same
job id and ``SLURM_RESTART_COUNT`` raised. Its training continues the MLflow run that the job's earlier
start made, from that run's newest checkpoint, as ``resume=<run id>`` would: the run is found by its
``tags.SLURM_JOB`` tag (``run_identity`` sets it on every run made in a Slurm job).

The earlier start's process has ended when Slurm starts the job again (Slurm waits for every process of
the job), so a run it left RUNNING (a SIGKILL after ``KillWait``) is taken without waiting for its
heartbeat to go stale, as ``resume_force=true`` would.
"""

from __future__ import annotations

import os

from attnseq.tracking import tags
from attnseq.tracking.client import TrackingClient

JOB_ID_ENV = "SLURM_JOB_ID"
RESTART_COUNT_ENV = "SLURM_RESTART_COUNT"
"""Set by Slurm in a job it started again: how many times it did."""


def slurm_job_id() -> str | None:
    """The Slurm job this process runs in, if any (an array task has a job id of its own)."""
    return os.environ.get(JOB_ID_ENV) or None


def restart_count() -> int:
    try:
        return int(os.environ.get(RESTART_COUNT_ENV, "0") or 0)
    except ValueError:
        return 0


def requeued_run(client: TrackingClient, experiment_name: str) -> str | None:
    """The training run the earlier start of this Slurm job left unfinished, when this process is that
    job started again; None otherwise (not a restart, or the earlier start made no run, or finished it)."""
    job = slurm_job_id()
    if job is None or restart_count() < 1:
        return None
    experiment_id = client.experiment_id(experiment_name)
    if experiment_id is None:
        return None
    found = client.runs([experiment_id], filter_string=" and ".join([
        tags.tag_equals(tags.SLURM_JOB, job), tags.tag_equals(tags.KIND, tags.TRAIN)]),
        order_by=["attributes.start_time DESC"])
    unfinished = [run for run in found if run.info.status != "FINISHED"]
    return unfinished[0].info.run_id if unfinished else None
