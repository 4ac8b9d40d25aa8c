"""Issue 23, point 10: a training's output folder is its own, and a folder or artifact location that
cannot be written stops the run with one message. Through the real ``train.py`` into a real store."""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.cli_helpers import (
    CLI_TIMEOUT_S,
    TRAIN_PY,
    all_runs,
    clean_env,
    explain,
    outputs_under,
    run_cli,
    tiny,
    tracking_uri,
    user_env,
)

HOLD_HOOK = '''
"""Holds a training mid-epoch (after its first epoch) until the file $ATTNSEQ_TEST_RELEASE exists."""
import importlib.abc, importlib.machinery, os, sys, time

RELEASE = os.environ["ATTNSEQ_TEST_RELEASE"]


def hold(self, trainer, pl_module, outputs, batch, batch_idx):
    if trainer.current_epoch >= 1 and batch_idx == 0 and not os.path.exists(RELEASE):
        print("PHASE held", flush=True)
        deadline = time.monotonic() + 300
        while not os.path.exists(RELEASE) and time.monotonic() < deadline:
            time.sleep(0.05)


class Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "attnseq.lifecycle.guards":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        run = spec.loader.exec_module

        def exec_and_patch(module):
            run(module)
            module.SignalBridge.on_train_batch_end = hold

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, Patch())
'''


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_for_line(proc: subprocess.Popen, line: str) -> list[str]:
    """The process's output up to ``line`` (it fails the test if the process ends first)."""
    seen = []
    for text in proc.stdout:
        seen.append(text)
        if text.strip() == line:
            return seen
    proc.wait(timeout=CLI_TIMEOUT_S)
    pytest.fail(f"the training ended (exit {proc.returncode}) before {line!r}:\n{''.join(seen)[-6000:]}")


@pytest.mark.slow
def test_a_second_training_into_a_held_folder_exits_2_and_the_first_keeps_its_model(tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOLD_HOOK)
    release = tmp_path / "release"
    args = [*outputs_under(tmp_path, seeded=True), *tiny(max_epochs=2, heatmaps=False)]
    env = clean_env()
    held_env = env | {"ATTNSEQ_TEST_RELEASE": str(release),
                      "PYTHONPATH": os.pathsep.join([str(hooks), *filter(None, [env.get("PYTHONPATH")])])}
    first = subprocess.Popen([sys.executable, str(TRAIN_PY), *args], cwd=tmp_path, env=held_env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_line(first, "PHASE held")
        second = run_cli(tmp_path, *args, env=user_env())
        client = MlflowClient(tracking_uri(tmp_path))
        runs_while_held = all_runs(client)
    finally:
        release.touch()
        rest, _ = first.communicate(timeout=CLI_TIMEOUT_S)

    folder = tmp_path / "out"
    assert second.returncode == 2, explain(second)
    assert "Traceback" not in second.stderr, explain(second)
    assert str(folder) in second.stderr and f"pid {first.pid}" in second.stderr, explain(second)
    assert "hydra.run.dir=" in second.stderr, explain(second)
    assert len(runs_while_held) == 1, "the refused training created an MLflow run"

    assert first.returncode == 0, rest[-6000:]
    [run] = all_runs(client)
    assert run.info.status == "FINISHED"
    uploaded = Path(client.download_artifacts(run.info.run_id, "checkpoints/last.ckpt", str(tmp_path / "dl")))
    assert sha(folder / "checkpoints" / "last.ckpt") == sha(uploaded), "the folder's checkpoint is not the run's"


FILE_SIZE_LIMIT = 1_500_000
"""Above what the store and a run's small files reach in the run below (about 1 MB), below one of
its checkpoints (about 2.3 MB with ``model.hidden_size=128``)."""


def small_disk() -> None:
    """In the child: a write past ``FILE_SIZE_LIMIT`` bytes of a file fails with EFBIG, as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


def assert_failed_with_one_message(proc: subprocess.CompletedProcess, client: MlflowClient, path: str) -> None:
    assert proc.returncode == 1, explain(proc)
    assert "Traceback" not in proc.stdout + proc.stderr, explain(proc)
    assert path in proc.stderr, explain(proc)
    [run] = all_runs(client)
    assert run.info.status == "FAILED"
    assert run.info.run_id in proc.stderr, explain(proc)


def test_a_checkpoint_that_does_not_fit_on_the_disk_fails_the_run_with_one_message(tmp_path):
    args = [*outputs_under(tmp_path, seeded=True), *tiny(max_epochs=1, heatmaps=False), "model.hidden_size=128"]
    proc = subprocess.run([sys.executable, str(TRAIN_PY), *args], cwd=tmp_path, env=user_env(),
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S, preexec_fn=small_disk)
    assert_failed_with_one_message(proc, MlflowClient(tracking_uri(tmp_path)), str(tmp_path / "out" / "checkpoints"))


def test_an_artifact_location_that_cannot_be_written_fails_the_run_with_one_message(tmp_path):
    (tmp_path / "mlruns").write_text("a file where the store's artifact root would be")
    proc = run_cli(tmp_path, *outputs_under(tmp_path, seeded=True), *tiny(max_epochs=1, heatmaps=False),
                   env=user_env())
    assert_failed_with_one_message(proc, MlflowClient(tracking_uri(tmp_path)), str(tmp_path / "mlruns"))
