"""Asynchronous logging to a tracking server loses nothing: at the run's end, on SIGTERM, and when the
server dies mid-run (then the run stops with the retry message instead of failing silently).

A real ``mlflow server`` (SQLite backend, one worker, no job runner) is started on loopback for
these tests; what reached it is read back from its SQLite file directly, so a test can look even
after the server is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from cli_helpers import (
    CLI_TIMEOUT_S,
    GIVE_UP_BOUND_S,
    TRAIN_PY,
    all_runs,
    clean_env,
    explain,
    mlflow_server,
    run_cli,
    tiny,
    user_env,
)
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient
from pauses import pause_at  # noqa: E402  (tests/ is on sys.path under pytest)

from attnseq.tracking import paths
from attnseq.tracking.retry import TrackingUnavailable, retry_settings
from attnseq.tracking.run import TrackedRun, logs_asynchronously, merged
from attnseq.tracking.store import ensure_experiment

NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
"""The servers here run no job runner."""
OUTAGE_BUDGET_S = 20
"""``mlflow.retry_budget_s`` where a test kills the server. A killed server refuses connections, which
is given up on after the budget's sleeps (0, 2 and 4 s here); a server that is alive but slow on a
busy machine (an answer late by seconds, its process not scheduled for a while) must not pass for a
dead one. With 4 s (no retry, 4 s per attempt) it did: a stall of the server before epoch 0's
checkpoint stopped the training on its own, with the retry message and no checkpoint to resume from."""
STEPPED = [*tiny(max_epochs=2, heatmaps=False), "trainer.log_every_n_steps=1", "dataset.train_size=256"]
"""Four training steps per epoch, each step's metrics logged."""


# -- the decision -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("uri", "env", "expected"),
    [
        ("http://127.0.0.1:5000", None, True),
        ("https://mlflow.example.org", None, True),
        ("sqlite:///mlflow.db", None, False),
        ("postgresql://u@db/mlflow", None, False),
        ("http://127.0.0.1:5000", "false", False),
        ("sqlite:///mlflow.db", "true", True),
    ],
)
def test_asynchronous_for_a_server_unless_told(monkeypatch, uri, env, expected):
    if env is None:
        monkeypatch.delenv("MLFLOW_ENABLE_ASYNC_LOGGING", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_ENABLE_ASYNC_LOGGING", env)
    assert logs_asynchronously(uri) is expected


# -- a real server --------------------------------------------------------------------------------
@pytest.fixture
def server(tmp_path):
    """A server of the test's own, which the test may kill."""
    with mlflow_server(tmp_path, env=NO_JOBS) as running:
        yield running


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for the tests that leave it running; each trains into an experiment of its own."""
    with mlflow_server(tmp_path_factory.mktemp("shared_server"), env=NO_JOBS) as running:
        yield running


def steps_by_key(client: MlflowClient, run_id: str) -> dict[str, list[int]]:
    run = client.get_run(run_id)
    return {key: sorted(m.step for m in client.get_metric_history(run_id, key)) for key in run.data.metrics}


def train_into(root: Path, uri: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(root, *STEPPED, *extra, f"mlflow.tracking_uri={uri}", f"hydra.run.dir={root}/out",
                   env=(clean_env() | (env or {})))


# -- a run's records, queued and sent --------------------------------------------------------------
@pytest.mark.slow
def test_queued_records_are_stored_at_flush_and_failures_surface(server, monkeypatch):
    for name, value in retry_settings(OUTAGE_BUDGET_S).items():  # the test's process: a dead server is given up on
        monkeypatch.setenv(name, value)
    client = MlflowClient(server.url)
    run = TrackedRun.create(client, ensure_experiment(client, "queued"), "queued", {})
    assert run.asynchronous
    for step in range(50):
        run.log_metrics({"m": float(step)}, step)
    run.flush()
    assert [m.step for m in server.backend.get_metric_history(run.run_id, "m")] == list(range(50))
    server.kill()
    gone = time.monotonic()
    for step in range(50, 100):  # queued: the failure is the flush's to report
        run.log_metrics({"m": float(step)}, step)
    with pytest.raises(TrackingUnavailable, match="stopped answering"):
        run.flush()
    # the first of them waits out the budget, the 49 behind it fail with it at once (one budget each: 100 s)
    assert time.monotonic() - gone < 2 * OUTAGE_BUDGET_S
    with pytest.raises(TrackingUnavailable):  # and every later call at once
        run.finish("FINISHED")
    assert len(server.backend.get_metric_history(run.run_id, "m")) == 50
    assert server.backend.get_run(run.run_id).info.status == "RUNNING"


@pytest.mark.slow
def test_records_queued_while_the_server_stalls_reach_it_in_a_few_calls_in_order(shared_server):
    """The server stops answering for a while (SIGSTOP) as 300 records are logged: once it answers again the
    backlog goes in a few calls, not 300 round trips, and the store holds every record in order; a param
    logged twice with one value and a tag set twice keep MLflow's meaning (the later tag wins)."""
    client = MlflowClient(shared_server.url)
    run = TrackedRun.create(client, ensure_experiment(client, "stalled"), "stalled", {})
    calls: list[int] = []
    sent = client.log_batch

    def counted(*args, **kwargs):
        calls.append(sum(len(kwargs.get(kind, ())) for kind in ("metrics", "params", "tags")))
        return sent(*args, **kwargs)

    client.log_batch = counted  # the real client, its calls counted
    os.killpg(shared_server.proc.pid, signal.SIGSTOP)
    try:
        run.log_params({"p": 1})
        for step in range(300):
            run.log_metrics({"m": float(step), "n": float(-step)}, step)
            if step == 100:
                run.set_tags({"t": "first"})
                run.log_params({"p": 1})
            if step == 200:
                run.set_tags({"t": "second"})
        time.sleep(0.5)
    finally:
        os.killpg(shared_server.proc.pid, signal.SIGCONT)
    run.finish("FINISHED")
    stored = shared_server.backend.get_run(run.run_id)
    history = shared_server.backend.get_metric_history(run.run_id, "m")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(s, float(s)) for s in range(300)]
    assert len(shared_server.backend.get_metric_history(run.run_id, "n")) == 300
    assert stored.data.params["p"] == "1" and stored.data.tags["t"] == "second"
    assert stored.info.status == "FINISHED"
    assert sum(calls) == 1 + 600 + 1 + 1 + 1, calls  # every record sent once
    assert len(calls) <= 10, calls  # one call before the stall, then the backlog merged (split where p repeats)


@pytest.mark.slow
def test_every_step_of_a_training_reaches_the_server(shared_server, tmp_path):
    """The same training into the server (asynchronous) and into an SQLite store (every call waited
    for): the same metrics at the same steps, and the run FINISHED."""
    local = tmp_path / "local"
    local.mkdir()
    direct = train_into(local, f"sqlite:///{local}/mlflow.db")
    assert direct.returncode == 0, explain(direct)
    remote = train_into(tmp_path, shared_server.url, "mlflow.experiment_name=every_step")
    assert remote.returncode == 0, explain(remote)
    [expected] = all_runs(MlflowClient(f"sqlite:///{local}/mlflow.db"))
    [run] = all_runs(shared_server.backend, "every_step")
    assert run.info.status == "FINISHED"
    logged = steps_by_key(shared_server.backend, run.info.run_id)
    assert logged == steps_by_key(MlflowClient(f"sqlite:///{local}/mlflow.db"), expected.info.run_id)
    assert logged["train/loss_step"] == list(range(8))  # 2 epochs of 4 steps, each logged


@pytest.mark.slow
def test_sigterm_keeps_every_step_logged_before_it(shared_server, tmp_path):
    """SIGTERM mid-way through the second epoch: the run is KILLED, and it holds the loss of every
    step the interrupted checkpoint counts, and the first epoch's validation."""
    log = tmp_path / "train.log"
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN_PY), *STEPPED, f"mlflow.tracking_uri={shared_server.url}",
         "mlflow.experiment_name=sigterm", f"hydra.run.dir={tmp_path}/out"],
        cwd=tmp_path, env=pause_at("training", clean_env()), stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + CLI_TIMEOUT_S
        while "PHASE training\n" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    [run] = all_runs(shared_server.backend, "sigterm")
    assert run.info.status == "KILLED"
    checkpoint = torch.load(tmp_path / "out" / paths.LAST_CHECKPOINT, map_location="cpu", weights_only=True)
    logged = steps_by_key(shared_server.backend, run.info.run_id)
    assert logged["train/loss_step"] == list(range(checkpoint["global_step"])), checkpoint["global_step"]
    assert len(logged["val/loss"]) == 1


@pytest.mark.slow
def test_server_dying_mid_run_stops_the_run_with_the_retry_message(server, tmp_path):
    """The server is killed once two epochs are in it: training stops with the retry message within
    the budget; what the server stored before stays. What was queued or in flight when it died, and
    everything after, never reached it: those records are lost, and the message says so (the run
    is left RUNNING, the local checkpoint and the resume command are named). Run as a user runs it
    (no HYDRA_FULL_ERROR): one message, no traceback."""
    log = tmp_path / "train.log"
    checkpoint = tmp_path / "out" / paths.LAST_CHECKPOINT
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN_PY), *STEPPED, "trainer.max_epochs=200", f"mlflow.retry_budget_s={OUTAGE_BUDGET_S}",
         f"mlflow.tracking_uri={server.url}", f"hydra.run.dir={tmp_path}/out"],
        cwd=tmp_path, env=user_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + CLI_TIMEOUT_S
        stored: list[int] = []
        while len(stored) < 2:
            assert proc.poll() is None, f"training stopped before the server was killed:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
            with contextlib.suppress(AssertionError, IndexError):
                run_id = all_runs(server.backend)[0].info.run_id
                stored = [m.step for m in server.backend.get_metric_history(run_id, "val/loss")]
        server.kill()
        killed_at = time.monotonic()
        try:
            returncode = proc.wait(timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {CLI_TIMEOUT_S} s after the server died:\n{log.read_text()[-3000:]}")
        stopped_after = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert returncode == 1, output[-3000:]
    assert "stopped answering" in output and "mlflow.retry_budget_s" in output, output[-3000:]
    assert f"resume={run_id}" in output, output[-3000:]
    assert stopped_after < GIVE_UP_BOUND_S, stopped_after  # bounded by the budget, not MLflow's minutes of retries
    assert "Traceback" not in output, output[-3000:]
    assert f"python train.py resume={run_id}" in output and f"kept locally: {checkpoint}" in output, output[-3000:]
    assert checkpoint.is_file()
    [run] = all_runs(server.backend)
    assert run.info.status == RunStatus.to_string(RunStatus.RUNNING)
    after = [m.step for m in server.backend.get_metric_history(run_id, "val/loss")]
    assert after[: len(stored)] == stored


def test_records_merge_in_order_until_a_param_or_tag_repeats():
    records = [("logging params", {"params": [Param("p", "1")]}),
               ("logging metrics", {"metrics": [Metric("m", 0, 0, 0)]}),
               ("setting tags", {"tags": [RunTag("t", "a")]}),
               ("logging metrics", {"metrics": [Metric("m", 1, 0, 1)]}),
               ("setting tags", {"tags": [RunTag("t", "b")]}),  # t again: a batch of its own
               ("logging params", {"params": [Param("q", "2")]})]
    sends = [Future() for _ in records]
    batches = merged([(action, batch, sent) for (action, batch), sent in zip(records, sends)])
    assert [action for action, _, _ in batches] == ["logging params and logging metrics and setting tags",
                                                   "setting tags and logging params"]
    assert [[m.step for m in batch["metrics"]] for _, batch, _ in batches] == [[0, 1], []]
    assert [[t.value for t in batch["tags"]] for _, batch, _ in batches] == [["a"], ["b"]]
    assert [[p.key for p in batch["params"]] for _, batch, _ in batches] == [["p"], ["q"]]
    assert [sent for _, _, group in batches for sent in group] == sends


def test_a_finished_runs_sender_thread_ends(tmp_path, monkeypatch):
    """A sweep makes many runs in one process: each run's sender thread ends with the run, its records stored."""
    import threading

    monkeypatch.setenv("MLFLOW_ENABLE_ASYNC_LOGGING", "true")  # queued through the sender on SQLite too
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = ensure_experiment(client, "senders")
    for index in range(3):
        run = TrackedRun.create(client, experiment, f"run{index}", {})
        assert run.asynchronous
        run.log_metrics({"m": float(index)}, index)
        run.finish("FINISHED")
        assert [m.value for m in client.get_metric_history(run.run_id, "m")] == [float(index)]
    senders = [t for t in threading.enumerate() if t.name.startswith("attnseq-tracking")]
    for thread in senders:
        thread.join(timeout=10)
    assert not [t for t in senders if t.is_alive()]
