"""A run's life from the first line of ``train.py`` to its last upload, through the real CLI.

- Signals at every phase (a test hook, ``ATTNSEQ_TEST_PAUSE_AT=<phase>``, makes the process print
  ``PHASE <phase>`` and wait there, so each signal lands at a known moment): the exit code is
  143 / 130, the run (once it exists) is KILLED with its newest checkpoint uploaded, and a resume
  continues its validation and loss accounting exactly.
- Two trainings started at the same instant keep their own output folders.
- Resume refuses a run that is still alive, applies or refuses overrides, carries every metric's
  state, and falls back to the run's copy of an unreadable local checkpoint.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import (  # noqa: E402  (tests/ is on sys.path under pytest)
    CLI_TIMEOUT_S,
    TRAIN_PY,
    all_runs,
    artifact_paths,
    clean_env,
    explain,
    outputs_under,
    run_cli,
    tiny,
    tracking_uri,
)
from mlflow.tracking import MlflowClient

from attnseq.tracking import paths, tags
from attnseq.training.signals import PAUSE_ENV

EPOCHS = 3
PHASED = [*tiny(max_epochs=EPOCHS, heatmaps=False), "dataset.train_size=256", "dataset.val_size=128",
          "trainer.log_every_n_steps=1"]
"""Four training batches and several validation batches per epoch: a phase inside either is mid-way."""


def client_for(root: Path) -> MlflowClient:
    return MlflowClient(tracking_uri(root))


def runs_in(root: Path) -> list:
    if not (root / "mlflow.db").exists():
        return []
    try:
        return all_runs(client_for(root))
    except AssertionError:  # no experiment yet
        return []


def start_paused(root: Path, phase: str, *overrides: str) -> tuple[subprocess.Popen, Path]:
    log = root / f"{phase}.log"
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN_PY), *overrides, *outputs_under(root)],
        cwd=root, env=clean_env() | {PAUSE_ENV: phase}, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    return proc, log


def signal_at_phase(root: Path, phase: str, signum: int, *overrides: str) -> tuple[int, str]:
    """Start a training that pauses at ``phase``, send ``signum`` once it says it is there; its
    exit code and output."""
    proc, log = start_paused(root, phase, *overrides)
    try:
        deadline = time.monotonic() + CLI_TIMEOUT_S
        while f"PHASE {phase}\n" not in log.read_text():
            assert proc.poll() is None, f"ended before phase {phase}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"never reached phase {phase}:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
        proc.send_signal(signum)
        returncode = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return returncode, log.read_text()


def metric_values(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def resume(root: Path, run_id: str, *extra: str) -> subprocess.CompletedProcess:
    return run_cli(root, f"resume={run_id}", *extra, f"mlflow.tracking_uri={tracking_uri(root)}",
                   f"hydra.run.dir={root}/resumed")


def assert_uploaded_equals_local(client: MlflowClient, run_id: str, local: Path, into: Path) -> None:
    into.mkdir(exist_ok=True)
    uploaded = Path(client.download_artifacts(run_id, paths.LAST_CHECKPOINT, str(into)))
    assert uploaded.read_bytes() == local.read_bytes(), "the run's last.ckpt is not the newest local one"


def assert_accounting_complete(client: MlflowClient, run_id: str, epochs: int) -> None:
    """One validation and one training loss per epoch, none zero, no step logged twice."""
    run = client.get_run(run_id)
    for key in set(run.data.metrics) - {"epoch"}:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
    val_loss = metric_values(client, run_id, "val/loss")
    train_loss = metric_values(client, run_id, "train/loss")
    assert len(val_loss) == epochs, val_loss
    assert len(train_loss) == epochs, train_loss
    assert all(value > 0.0 for _, value in train_loss), train_loss
    best = [value for _, value in metric_values(client, run_id, "val/acc_best")]
    acc = [value for _, value in metric_values(client, run_id, "val/acc")]
    assert best == [max(acc[: i + 1]) for i in range(len(acc))], (best, acc)  # the best survives the resume


# -- signals at every phase -----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_before_the_run_exists_exits_non_zero(tmp_path, signum, code):
    returncode, output = signal_at_phase(tmp_path, "start", signum, *PHASED)
    assert returncode == code, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert runs_in(tmp_path) == []


@pytest.mark.slow
def test_a_signal_after_the_trainer_is_built_kills_the_run(tmp_path):
    returncode, output = signal_at_phase(tmp_path, "trainer", signal.SIGTERM, *PHASED)
    assert returncode == 143, output[-3000:]
    [run] = runs_in(tmp_path)
    assert run.info.status == "KILLED", output[-3000:]
    assert f"resume={run.info.run_id}" in output


@pytest.mark.slow
@pytest.mark.parametrize(
    "phase,signum,code",
    [("training", signal.SIGTERM, 143), ("validation", signal.SIGTERM, 143), ("validation", signal.SIGINT, 130),
     ("uploads", signal.SIGTERM, 143)],
    ids=["training-SIGTERM", "validation-SIGTERM", "validation-SIGINT", "uploads-SIGTERM"],
)
def test_a_signal_in_fit_kills_the_run_with_its_newest_checkpoint_and_resume_continues_exactly(
    tmp_path, phase, signum, code
):
    returncode, output = signal_at_phase(tmp_path, phase, signum, *PHASED)
    assert returncode == code, output[-3000:]
    client = client_for(tmp_path)
    [run] = runs_in(tmp_path)
    run_id = run.info.run_id
    assert run.info.status == "KILLED", output[-3000:]
    assert f"resume={run_id}" in output
    local = tmp_path / "out" / paths.LAST_CHECKPOINT
    assert_uploaded_equals_local(client, run_id, local, tmp_path / "uploaded")
    if phase == "validation":  # validation finished first: epoch 0 is whole, in the run and the checkpoint
        assert len(metric_values(client, run_id, "val/loss")) == 1
        assert torch.load(local, map_location="cpu", weights_only=True)["epoch"] == 1  # epoch 0 ended first

    resumed = resume(tmp_path, run_id)
    assert resumed.returncode == 0, explain(resumed)
    assert [r.info.run_id for r in runs_in(tmp_path)] == [run_id]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert_accounting_complete(client, run_id, EPOCHS)
    assert paths.MODEL_FILE in artifact_paths(client, run_id)
    if phase != "training":  # stopped at an epoch's end: the same numbers as a run never stopped
        straight = tmp_path / "straight"
        straight.mkdir()
        proc = run_cli(straight, *PHASED, *outputs_under(straight))
        assert proc.returncode == 0, explain(proc)
        [other] = runs_in(straight)
        for key in ("val/acc", "val/loss", "train/loss", "val/acc_best"):
            ours = [v for _, v in metric_values(client, run_id, key)]
            theirs = [v for _, v in metric_values(client_for(straight), other.info.run_id, key)]
            assert ours == pytest.approx(theirs, rel=1e-5), key
