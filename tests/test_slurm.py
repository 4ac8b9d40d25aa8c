"""Sweeps through a real Slurm scheduler: a single-node cluster (``scripts/slurm_cluster.py``: Debian's
``slurm-wlm`` and ``munge``, no systemd, no cgroups, everything in one folder) is started for this module
and stopped at its end, and nothing of it may be left running. Jobs go through Hydra's
``submitit_slurm`` launcher (sbatch, srun, the job's own pickled call) into a SQLite MLflow store:

- a sweep reaches MLflow as its parent and one child per job, each child tagged with its Slurm job;
- ``scancel`` of a running job leaves its run KILLED with the ``resume=`` command in the job's log (the
  command works), and the sweep's parent FAILED;
- a job preempted with SIGUSR1 (Lightning's SLURMEnvironment saves a checkpoint and requeues it) or
  requeued by ``scontrol requeue`` (SIGTERM) runs again and continues the same MLflow run;
- stopping the cluster ends its jobs and daemons.

One quick test (not slow, no cluster) checks which run a restarted job takes (``lifecycle.requeue``).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import (  # noqa: E402  (tests/ is on sys.path under pytest)
    EXPERIMENT,
    REPO,
    TRAIN_PY,
    all_runs,
    clean_env,
    explain,
    outputs_under,
    run_cli,
    runs_in,
    seeded_store,
    stop_group,
    tiny,
    tracking_uri,
)
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

SLURM_TAG = "attnseq.slurm_job"  # attnseq.tracking.tags.SLURM_JOB
RESUMED_FROM_TAG = "attnseq.resumed_from"
LAUNCHER = [
    "hydra/launcher=submitit_slurm",
    "hydra.launcher.cpus_per_task=1",  # two jobs at once on the node's two cores
    "hydra.launcher.timeout_min=10",
    # submitit asks Slurm for its USR2 this long before the time limit (its default, 90 s, with a short limit
    # fires within seconds: Slurm may signal up to a minute early)
    "hydra.launcher.signal_delay_s=5",
    "threads=1",
]
LONG = ["dataset.train_size=512", "tracking.heatmap_samples=0"]  # ~1 s an epoch: a signal lands mid-training
SWEEP_TIMEOUT_S = 420
RUN_TIMEOUT_S = 240


def load_cluster_module():
    spec = importlib.util.spec_from_file_location("slurm_cluster", REPO / "scripts" / "slurm_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


slurm_cluster = load_cluster_module()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = slurm_cluster.missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)}): {slurm_cluster.INSTALL_HINT}")
    running = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm"))
    with running:
        yield running
    left = running.leftovers()
    assert not left, f"still running after the cluster stopped: {ps(left)}"


def ps(pids: list[int]) -> str:
    return subprocess.run(["ps", "-o", "pid,stat,args", "-p", ",".join(map(str, pids))], capture_output=True,
                          text=True).stdout


def slurm_env(cluster) -> dict[str, str]:
    return cluster.env(clean_env())


def start_sweep(cluster, root: Path, *overrides: str) -> subprocess.Popen:
    """``train.py -m`` through Slurm, in the background (it waits for its jobs), its output in root/sweep.log."""
    root.mkdir(exist_ok=True)
    argv = [sys.executable, str(TRAIN_PY), "-m", *LAUNCHER, *overrides, *outputs_under(root, seeded=True)]
    with (root / "sweep.log").open("w") as log:
        return subprocess.Popen(argv, cwd=root, env=slurm_env(cluster), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def finished(proc: subprocess.Popen, root: Path, timeout: float = SWEEP_TIMEOUT_S) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        raise AssertionError(
            f"the sweep did not end in {timeout} s:\n{(root / 'sweep.log').read_text()[-4000:]}") from None


def training_run(root: Path, proc: subprocess.Popen, epochs: int = 1):
    """The sweep's one training run, once it has logged ``epochs`` epochs (its checkpoint is uploaded)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the sweep ended first:\n{(root / 'sweep.log').read_text()[-4000:]}"
        runs = [r for r in runs_in(root) if r.data.tags.get("attnseq.kind") == "train"]
        if runs and runs[0].data.metrics.get("epoch", -1) >= epochs - 1 and "val/loss" in runs[0].data.metrics:
            return runs[0]
        time.sleep(0.5)
    raise AssertionError(f"no training run logged {epochs} epoch(s) in {RUN_TIMEOUT_S} s:\n"
                         f"{(root / 'sweep.log').read_text()[-4000:]}")


def job_log(root: Path) -> str:
    """What the sweep's one job wrote to stderr (submitit's ``<job>_0_log.err``), every start of it."""
    [log] = (root / "multi" / ".submitit").glob("**/*_log.err")
    return log.read_text(errors="replace")


def slurm_job_field(cluster, job: str, field: str) -> str:
    shown = cluster.run("scontrol", "show", "job", job).stdout
    found = re.search(rf"\b{field}=(\S+)", shown)
    assert found, shown
    return found.group(1)


def ended_state(cluster, job: str, timeout: float = 120) -> str:
    """The job's state once it has ended: its result is written a moment before its process exits."""
    deadline = time.monotonic() + timeout
    while (state := slurm_job_field(cluster, job, "JobState")) in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED"):
        assert time.monotonic() < deadline, f"job {job} still {state} after {timeout} s"
        time.sleep(0.5)
    return state


def sweep_runs(root: Path):
    runs = all_runs(MlflowClient(tracking_uri(root)))
    [parent] = [r for r in runs if MLFLOW_PARENT_RUN_ID not in r.data.tags]
    children = [r for r in runs if MLFLOW_PARENT_RUN_ID in r.data.tags]
    assert all(r.data.tags[MLFLOW_PARENT_RUN_ID] == parent.info.run_id for r in children)
    return parent, children


# -- the tests -------------------------------------------------------------------------------------
def test_a_restarted_slurm_job_finds_the_run_it_left_unfinished(tmp_path, monkeypatch):
    from attnseq.lifecycle.requeue import requeued_run
    from attnseq.tracking.client import TrackingClient

    client = TrackingClient(seeded_store(tmp_path))
    experiment = client.ensure_experiment(EXPERIMENT)

    def run(job: str, status: str, kind: str = "train") -> str:
        made = client.create_run(experiment, f"job {job}", {"attnseq.kind": kind, SLURM_TAG: job})
        made.finish(status)
        return made.run_id

    run("41", "FINISHED")  # an earlier job that happened to get the same id: finished, never continued
    left = run("41", "KILLED")
    run("41", "KILLED", kind="sweep")
    run("42", "FAILED")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert requeued_run(client, EXPERIMENT) is None  # the job's first start makes a new run
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert requeued_run(client, EXPERIMENT) == left
    assert requeued_run(client, "another experiment") is None
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    assert requeued_run(client, EXPERIMENT) is None  # restarted, but its first start made no run
    monkeypatch.delenv("SLURM_JOB_ID")
    assert requeued_run(client, EXPERIMENT) is None  # not in Slurm


@pytest.mark.slow
def test_a_sweep_through_slurm_lands_under_one_parent(cluster, tmp_path):
    proc = run_cli(tmp_path, "-m", *LAUNCHER, "scorer=additive,general", *tiny(max_epochs=1, heatmaps=False),
                   *outputs_under(tmp_path, seeded=True), env=slurm_env(cluster), timeout=SWEEP_TIMEOUT_S)
    assert proc.returncode == 0, explain(proc)
    parent, children = sweep_runs(tmp_path)
    assert sorted(r.data.params["scorer.name"] for r in children) == ["additive", "general"]
    assert parent.info.status == "FINISHED" and all(r.info.status == "FINISHED" for r in children)
    jobs = [r.data.tags[SLURM_TAG] for r in children]
    assert len(set(jobs)) == 2
    for job in jobs:  # each ran as a job of this cluster, and ended there
        assert ended_state(cluster, job) == "COMPLETED"
    [script] = (tmp_path / "multi" / ".submitit").glob("*/*_submission.sh")
    assert "#SBATCH --array=0-1" in script.read_text()  # one sbatch array, one task a job


@pytest.mark.slow
def test_scancel_leaves_the_run_killed_with_its_resume_command_and_the_sweep_failed(cluster, tmp_path):
    proc = start_sweep(cluster, tmp_path, "scorer=additive", *tiny(max_epochs=500, heatmaps=False), *LONG)
    run = training_run(tmp_path, proc, epochs=2)
    job = run.data.tags[SLURM_TAG]
    cluster.run("scancel", job)
    code = finished(proc, tmp_path)
    sweep_log = (tmp_path / "sweep.log").read_text()
    assert code != 0, sweep_log[-3000:]  # the launcher lost a job
    parent, [child] = sweep_runs(tmp_path)
    assert child.info.run_id == run.info.run_id and child.info.status == "KILLED", sweep_log[-3000:]
    assert parent.info.status == "FAILED"
    assert ended_state(cluster, job) == "CANCELLED"
    log = job_log(tmp_path)
    assert f"resume={run.info.run_id}" in log, log[-3000:]  # what the job said as it stopped

    # the command it printed continues the run (one epoch more than its checkpoint holds)
    epochs_done = int(child.data.metrics["epoch"]) + 1
    resumed = run_cli(tmp_path, f"resume={run.info.run_id}", f"trainer.max_epochs={epochs_done + 1}",
                      f"mlflow.tracking_uri={tracking_uri(tmp_path)}", env=clean_env())
    assert resumed.returncode == 0, explain(resumed)
    again = MlflowClient(tracking_uri(tmp_path)).get_run(run.info.run_id)
    assert again.info.status == "FINISHED" and RESUMED_FROM_TAG in again.data.tags


@pytest.mark.slow
@pytest.mark.parametrize("preempt", ["scancel --signal=USR1", "scontrol requeue"])
def test_a_preempted_job_is_requeued_and_continues_its_run(cluster, tmp_path, preempt):
    epochs = 12
    proc = start_sweep(cluster, tmp_path, "scorer=additive", *tiny(max_epochs=epochs, heatmaps=False), *LONG)
    run = training_run(tmp_path, proc, epochs=2)
    job = run.data.tags[SLURM_TAG]
    command, *args = preempt.split()
    cluster.run(command, *args, job)
    code = finished(proc, tmp_path)
    sweep_log = (tmp_path / "sweep.log").read_text()
    assert code == 0, sweep_log[-3000:]
    parent, children = sweep_runs(tmp_path)
    log = job_log(tmp_path)
    assert [c.info.run_id for c in children] == [run.info.run_id], log[-4000:]  # the same run, not a second one
    [child] = children
    assert child.info.status == "FINISHED" and parent.info.status == "FINISHED"
    assert int(slurm_job_field(cluster, job, "Restarts")) == 1  # Slurm really ran it twice
    assert ended_state(cluster, job) == "COMPLETED"
    if "USR1" in preempt:
        assert "auto-requeue signal" in log, log[-4000:]  # Lightning's SLURMEnvironment handled it
    assert f"marked KILLED; continue it with `python train.py resume={run.info.run_id}`" in log, log[-4000:]
    assert RESUMED_FROM_TAG in child.data.tags  # continued from the checkpoint the first start left
    client = MlflowClient(tracking_uri(tmp_path))
    epochs_logged = sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/loss"))
    assert len(epochs_logged) == epochs and len(set(epochs_logged)) == epochs  # every epoch once, none replayed


@pytest.mark.slow
def test_stopping_the_cluster_ends_its_jobs_and_daemons(tmp_path):
    missing = slurm_cluster.missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)}): {slurm_cluster.INSTALL_HINT}")
    small = slurm_cluster.SlurmCluster(tmp_path / "slurm")
    with small:
        submitted = small.run("sbatch", "--parsable", f"--output={tmp_path}/sleep.out", "--wrap", "srun sleep 600")
        job = submitted.stdout.strip()
        deadline = time.monotonic() + 60
        while slurm_job_field(small, job, "JobState") != "RUNNING":
            assert time.monotonic() < deadline, small.run("squeue").stdout
            time.sleep(0.2)
        daemons = [proc.pid for proc in small.procs.values()]
        assert small.leftovers()  # the daemons and the job's processes are found
    assert not small.leftovers(), ps(small.leftovers())
    assert not any(slurm_cluster.alive(pid) for pid in daemons)
