"""Bad input gets a clear error, crashes lose nothing, sweeps survive failures, secrets stay out.

Through the real CLI (subprocesses with real signals) into a real MLflow store under ``tmp_path``.
"""

from __future__ import annotations

import os
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
    GIVE_UP_BOUND_S,
    TRAIN_PY,
    all_runs,
    artifact_paths,
    clean_env,
    explain,
    outputs_under,
    run_cli,
    runs_in,
    tiny,
    tracking_uri,
    user_env,
    wait_until,
)
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf


def assert_clear_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode != 0, explain(proc)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in proc.stderr, f"{fragment!r} not in:\n{proc.stderr[-3000:]}"


# -- bad input → a clear error before any training ---------------------------------------------------
def test_unknown_group_option_lists_the_valid_ones(tmp_path):
    proc = run_cli(tmp_path, "scorer=dott", *outputs_under(tmp_path), env=user_env())
    assert_clear_error(proc, "scorer/dott", "Available options in 'scorer'", "additive", "scaled_dot")
    assert not (tmp_path / "mlflow.db").exists()


def test_dot_with_a_bidirectional_encoder_names_both_sizes_and_the_fixes(tmp_path):
    proc = run_cli(tmp_path, "encoder=bigru", "scorer=dot", *outputs_under(tmp_path), env=user_env())
    assert_clear_error(proc, "d_q=128", "d_k=256", "scorer=general", "encoder=gru", "Fix:")
    assert proc.returncode == 2
    assert not (tmp_path / "mlflow.db").exists()  # rejected before any run exists


@pytest.mark.parametrize(
    "override,fragments",
    [
        ("model.heads=3", ["model.heads=3", "d_k=128", "Fix:"]),
        ("model.hidden_size=0", ["model.hidden_size=0", "Fix:"]),
        ("dataset.batch_size=0", ["dataset.batch_size=0", "Fix:"]),
        ("dataset.eval_lengths=[10,5]", ["eval_lengths", "Fix:"]),
        ("dataset.bucket_width=0", ["dataset.bucket_width=0", "Fix:"]),
    ],
)
def test_bad_sizes_lengths_and_buckets(tmp_path, override, fragments):
    proc = run_cli(tmp_path, override, *outputs_under(tmp_path), env=user_env())
    assert_clear_error(proc, *fragments)
    assert proc.returncode == 2
    assert not (tmp_path / "mlflow.db").exists()  # rejected before any run exists, so before any training


BAD_TSV = {  # a line without a tab: test_bounds3 (a corpus refused before the store is created)
    "missing": (None, ["does-not-exist.tsv", "not found"]),
    "empty": (b"", ["corpus.tsv", "empty"]),
    "not-utf8": ("hello\tbonjour\n".encode() + b"caf\xe9\tcafe\n", ["corpus.tsv:2", "UTF-8"]),
    "two-tabs": (b"hello\tbonjour\ta\tb\n", ["corpus.tsv:1", "tab"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_TSV))
def test_a_bad_tsv_corpus_names_file_and_line(tmp_path, case):
    content, fragments = BAD_TSV[case]
    path = tmp_path / ("does-not-exist.tsv" if content is None else "corpus.tsv")
    if content is not None:
        path.write_bytes(content)
    proc = run_cli(tmp_path, "dataset=tsv", f"dataset.path={path}", *outputs_under(tmp_path), env=user_env())
    assert_clear_error(proc, *fragments, "Fix:")


def test_an_unreachable_tracking_server_fails_in_seconds(tmp_path):
    uri = "http://127.0.0.1:9"  # the discard port: nothing listens
    start = time.monotonic()
    proc = run_cli(tmp_path, f"mlflow.tracking_uri={uri}", f"hydra.run.dir={tmp_path}/out", env=user_env())
    elapsed = time.monotonic() - start
    assert_clear_error(proc, uri, "cannot be reached", "Fix:")
    assert not (tmp_path / "out" / "checkpoints").exists()  # before any training
    assert elapsed < GIVE_UP_BOUND_S  # the imports are most of it; MLflow's own retries would take minutes


def test_the_full_traceback_is_one_variable_away(tmp_path):
    proc = run_cli(tmp_path, "model.heads=3", *outputs_under(tmp_path), env=user_env(HYDRA_FULL_ERROR="1"))
    assert proc.returncode != 0 and "Traceback" in proc.stderr


# -- crashes lose nothing --------------------------------------------------------------------------
def start_training(root: Path, *overrides: str, log_name: str = "cli.log",
                   env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    log = root / log_name
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN_PY), *overrides, *outputs_under(root, seeded=True)],
        cwd=root, env=clean_env() if env is None else env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    return proc, log


def the_run(root: Path):
    runs = runs_in(root)
    return runs[0] if runs else None


def has_metric(root: Path, key: str) -> bool:
    """Reads the store only once epoch 0's checkpoint exists: a reader that opens a SQLite store
    while the writer is still creating its schema would race it through the same migrations."""
    if not (root / "out" / "checkpoints" / "last.ckpt").exists():
        return False
    run = the_run(root)
    return bool(run) and key in run.data.metrics


@pytest.mark.slow
def test_a_signal_writes_a_checkpoint_and_kills_the_run(tmp_path):
    """A scheduler's SIGTERM mid-training, wherever it lands (Ctrl-C, and signals at known phases:
    test_run_lifecycle): the run is KILLED, the CLI exits 143, the newest checkpoint is uploaded."""
    proc, log = start_training(tmp_path, *tiny(max_epochs=1000, heatmaps=False))
    try:
        wait_until(lambda: has_metric(tmp_path, "val/loss"), "a val/loss in the store", proc, log)
        proc.send_signal(signal.SIGTERM)
        validated = len(MlflowClient(tracking_uri(tmp_path)).get_metric_history(the_run(tmp_path).info.run_id,
                                                                               "val/loss"))
        returncode = proc.wait(timeout=CLI_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert returncode == 143, output[-3000:]
    [run] = all_runs(MlflowClient(tracking_uri(tmp_path)))
    assert run.info.status == "KILLED"
    # it stopped where the signal found it, not after more epochs: at most the validation under way ends
    history = MlflowClient(tracking_uri(tmp_path)).get_metric_history(run.info.run_id, "val/loss")
    assert len(history) <= validated + 1, (validated, len(history))
    assert f"resume={run.info.run_id}" in output
    local = tmp_path / "out" / "checkpoints" / "last.ckpt"
    state = torch.load(local, map_location="cpu", weights_only=True)
    assert state["global_step"] > 0
    assert "checkpoints/last.ckpt" in artifact_paths(MlflowClient(tracking_uri(tmp_path)), run.info.run_id)


@pytest.mark.slow
def test_resume_of_an_unknown_run_is_a_clear_error(tmp_path):
    proc = run_cli(tmp_path, "resume=feedfacefeedface", *outputs_under(tmp_path), env=user_env())
    assert_clear_error(proc, "resume=feedfacefeedface", "no such run", "Fix:")


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_failed_and_keeps_the_last_good_checkpoint(nan_run):
    # epoch 0 trains normally; the schedule then makes the learning rate finite but absurd (conftest)
    proc = nan_run.proc
    assert_clear_error(proc, "NaN or infinite", "epoch 1", "last good checkpoint", "optimizer.lr")
    assert proc.returncode == 1
    run = the_run(nan_run.root)
    assert run.info.status == "FAILED"
    for name in ("last.ckpt", "best.ckpt"):
        state = torch.load(nan_run.root / "out" / "checkpoints" / name, map_location="cpu", weights_only=True)
        assert state["epoch"] == 0
        assert all(torch.isfinite(t).all() for t in state["state_dict"].values()), name


@pytest.mark.slow
def test_in_a_sweep_a_failing_job_is_failed_the_others_finish_and_the_sweep_says_which(sweep_with_a_bad_job):
    proc = sweep_with_a_bad_job.proc
    assert proc.returncode != 0
    runs = sweep_with_a_bad_job.runs
    children = {r.data.params.get("scheduler.gamma"): r for r in runs if r.data.tags.get("attnseq.kind") == "train"}
    assert {k: r.info.status for k, r in children.items()} == {"0.5": "FINISHED", "1e+30": "FAILED", "0.9": "FINISHED"}
    [parent] = [r for r in runs if r.data.tags.get("attnseq.kind") == "sweep"]
    assert parent.info.status == "FAILED"
    summary = proc.stdout + proc.stderr
    assert "NaN or infinite" in summary and "1 not finished" in summary
    [row] = [line for line in summary.splitlines() if line.startswith("scheduler.gamma=1e+30 (#")]  # the job table
    assert row.split()[2] == "FAILED", row


# -- security ----------------------------------------------------------------------------------------
def test_checkpoints_never_unpickle_objects(tmp_path):
    from attnseq.model import load_model_file

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "model.pt"
    torch.save({"model_config": {}, "state_dict": {}, "x": Payload()}, evil)
    with pytest.raises(Exception, match="(?i)weights_only|unpickl"):
        load_model_file(evil)
    assert not marker.exists()


def test_nothing_secret_reaches_params_tags_or_the_saved_config(tmp_path):
    secret = "hunter2-s3cr3t"
    env = clean_env() | {"MLFLOW_TRACKING_PASSWORD": secret, "AWS_SECRET_ACCESS_KEY": secret}
    proc = run_cli(tmp_path, *tiny(max_epochs=1, heatmaps=False), f"+db_password={secret}",
                   f"+tracking.api_token={secret}", *outputs_under(tmp_path, seeded=True), env=env)
    assert proc.returncode == 0, explain(proc)
    client = MlflowClient(tracking_uri(tmp_path))
    run = the_run(tmp_path)
    assert secret not in str(run.data.params) and secret not in str(run.data.tags)
    assert run.data.params["db_password"] == "***"
    saved = client.download_artifacts(run.info.run_id, "config/resolved.yaml", str(tmp_path))
    text = Path(saved).read_text()
    assert secret not in text and yaml.safe_load(text)["db_password"] == "***"
    assert OmegaConf.create(text).tracking.api_token == "***"
