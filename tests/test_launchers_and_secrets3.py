"""Sweeps on Hydra's launchers, secrets on error paths and sweeps that end badly, through the real
``train.py``:

- a 2-job joblib sweep against a real ``mlflow server`` whose URI carries credentials (a password
  holding ``@``; the server ignores the userinfo) runs both jobs under a FINISHED parent, and no
  secret is in any file under the sweep folder, on the server or on the console; submitit's
  pickles hold none either;
- the error paths (``resume=<unknown>``, an unreachable server with ``HYDRA_FULL_ERROR=1``: Hydra's
  failure line, MLflow's request error, the traceback) mask the whole userinfo;
- a SIGTERM while a sweep closes, and a joblib worker killed with SIGKILL, leave the parent and
  every child KILLED or FAILED, never RUNNING.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import (
    CLI_TIMEOUT_S,
    TRAIN_PY,
    all_runs,
    clean_env,
    explain,
    free_port,
    mlflow_server,
    outputs_under,
    run_cli,
    tiny,
    tracking_uri,
    user_env,
    wait_until,
)
from mlflow.tracking import MlflowClient

URI_PASSWORD = "se@cr@et-Uri-77"  # two @: the userinfo runs to the last one before the host
DB_SECRET = "hunter2-Db-Qx31"
OTHER_DB_SECRET = "other-Db-Wk58"
SECRETS = (URI_PASSWORD, "cr@et-Uri-77", "et-Uri-77", DB_SECRET, OTHER_DB_SECRET)
"""Every piece that must never show, the password's tails after each ``@`` included."""
WAIT_S = 240


def leaks(texts: list[str], *roots: Path) -> list[str]:
    """Where any piece of ``SECRETS`` shows: every file under ``roots`` (as bytes) and each text."""
    found = []
    for secret in SECRETS:
        needle = secret.encode()
        for root in roots:
            found += [f"{secret!r} in {p}" for p in sorted(root.rglob("*")) if p.is_file() and needle in p.read_bytes()]
        found += [f"{secret!r} in console #{i}" for i, text in enumerate(texts) if secret in text]
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``mlflow server`` on loopback over a SQLite file; yields ``(url with credentials, its folder)``."""
    root = tmp_path_factory.mktemp("server")
    with mlflow_server(root, env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}) as running:
        yield running.url.replace("http://", f"http://alice:{URI_PASSWORD}@"), root


def runs_by_kind(uri: str) -> tuple[list, list]:
    runs = all_runs(MlflowClient(uri))
    return ([r for r in runs if r.data.tags.get("attnseq.kind") == "sweep"],
            [r for r in runs if r.data.tags.get("attnseq.kind") == "train"])


# -- point 3: the README's scale-out path ------------------------------------------------------------
@pytest.mark.slow
def test_a_joblib_sweep_against_a_server_with_credentials_runs_and_writes_no_secret(server, tmp_path):
    uri, server_root = server
    proc = run_cli(
        tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
        f"+db.password={DB_SECRET},{OTHER_DB_SECRET}", f"mlflow.tracking_uri={uri}",
        "mlflow.experiment_name=joblib_sweep", f"hydra.sweep.dir={tmp_path}/multi",
        *tiny(max_epochs=1, heatmaps=False), env=user_env(),
    )
    assert proc.returncode == 0, explain(proc)
    assert "Joblib.Parallel" in proc.stdout + proc.stderr  # the jobs really went through joblib's workers
    client = MlflowClient(uri.replace(f"alice:{URI_PASSWORD}@", ""))
    experiment = client.get_experiment_by_name("joblib_sweep")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("attnseq.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("attnseq.kind") == "train"]
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert sorted(c.info.status for c in children) == ["FINISHED", "FINISHED"]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}
    assert children[0].data.params["mlflow.tracking_uri"].startswith("http://***@127.0.0.1:")
    assert leaks([proc.stdout, proc.stderr], tmp_path / "multi", server_root) == []


@pytest.mark.slow
def test_submitit_pickles_and_hydras_failure_line_hold_no_secret(tmp_path):
    """A job that fails while it trains (the schedule makes the learning rate absurd after epoch 0, the
    loss NaN; a bad value would be refused before any job starts): submitit has written its pickles
    and Hydra its failure line with the job's overrides."""
    proc = run_cli(
        tmp_path, "-m", "hydra/launcher=submitit_local", f"+db.password={DB_SECRET}",
        f"+db.url=postgresql://bob:{URI_PASSWORD}@db.example/attnseq", "scheduler.gamma=1e30",
        *tiny(max_epochs=2, heatmaps=False), *outputs_under(tmp_path), env=user_env(),
    )
    assert proc.returncode != 0, explain(proc)
    assert list((tmp_path / "multi" / ".submitit").rglob("*_submitted.pkl")), explain(proc)
    assert list((tmp_path / "multi" / ".submitit").rglob("*_result.pkl")), explain(proc)
    assert "Error executing job with overrides" in proc.stderr, explain(proc)
    parents, children = runs_by_kind(tracking_uri(tmp_path))
    assert [p.info.status for p in parents] == ["FAILED"] and [c.info.status for c in children] == ["FAILED"]
    assert leaks([proc.stdout, proc.stderr], tmp_path) == []


# -- point 4: secrets on the error paths -------------------------------------------------------------
@pytest.mark.slow  # starts the module's server when it runs alone
def test_resume_of_an_unknown_run_names_the_store_without_its_credentials(server, tmp_path):
    uri, _ = server
    unknown = "0123456789abcdef0123456789abcdef"
    proc = run_cli(tmp_path, f"resume={unknown}", f"mlflow.tracking_uri={uri}", f"hydra.run.dir={tmp_path}/out",
                   env=user_env())
    assert proc.returncode == 2, explain(proc)
    assert unknown in proc.stderr and "Fix:" in proc.stderr, explain(proc)
    assert "http://***@127.0.0.1:" in proc.stderr, explain(proc)
    assert leaks([proc.stdout, proc.stderr], tmp_path) == []


def test_an_unreachable_server_with_the_full_error_masks_hydras_line_and_the_traceback(tmp_path):
    uri = f"http://alice:{URI_PASSWORD}@127.0.0.1:{free_port()}"
    proc = run_cli(tmp_path, f"+db.password={DB_SECRET}", f"mlflow.tracking_uri={uri}", "mlflow.retry_budget_s=1",
                   f"hydra.run.dir={tmp_path}/out", env=user_env(HYDRA_FULL_ERROR="1"))
    assert proc.returncode == 1, explain(proc)
    assert "Error executing job with overrides" in proc.stderr and "Traceback" in proc.stderr, explain(proc)
    assert "http://***@127.0.0.1:" in proc.stderr, explain(proc)
    assert leaks([proc.stdout, proc.stderr], tmp_path) == []


# -- point 8: sweeps that end badly ------------------------------------------------------------------
PAUSE_IN_CLOSE = """
    # test hook: pause inside the sweep's close (where its summary table is built) until a signal comes
    import importlib.abc, importlib.machinery, signal, sys, time

    def pause(*args, **kwargs):
        print("PHASE closing", flush=True)
        handler = signal.getsignal(signal.SIGTERM)
        deadline = time.monotonic() + 120
        while getattr(handler, "__self__").received is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return table(*args, **kwargs)

    class Patch(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != "attnseq.training.sweep":
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            run = spec.loader.exec_module

            def exec_module(module):
                global table
                run(module)
                table, module.job_table = module.job_table, pause

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Patch())
"""


@pytest.mark.slow
def test_sigterm_while_a_sweep_closes_marks_its_parent_killed_with_its_summary(tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent(PAUSE_IN_CLOSE))
    env = clean_env() | {"PYTHONPATH": os.pathsep.join([str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])])}
    log = tmp_path / "sweep.log"
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN_PY), "-m", "seed=0", *tiny(max_epochs=1, heatmaps=False), *outputs_under(tmp_path)],
        cwd=tmp_path, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: "PHASE closing" in log.read_text(), "pause in the sweep's close", proc, log, WAIT_S)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=CLI_TIMEOUT_S)
    finally:
        proc.kill()
    parents, children = runs_by_kind(tracking_uri(tmp_path))
    assert [c.info.status for c in children] == ["FINISHED"], log.read_text()[-4000:]
    assert [p.info.status for p in parents] == ["KILLED"], log.read_text()[-4000:]
    assert proc.returncode == 143, log.read_text()[-4000:]
    assert f"Sweep parent run {parents[0].info.run_id}: 1 jobs" in log.read_text()


def loky_workers(parent: int) -> list[int]:
    """The joblib (loky) worker processes ``parent`` started, from /proc."""
    workers = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
            if ppid == parent and b"loky" in cmdline and b"resource_tracker" not in cmdline:
                workers.append(int(stat.parent.name))
    return workers


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc")
def test_a_joblib_worker_killed_leaves_no_run_of_the_sweep_running(tmp_path):
    log = tmp_path / "sweep.log"
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN_PY), "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=0,1",
         *tiny(max_epochs=200, heatmaps=False), *outputs_under(tmp_path)],
        cwd=tmp_path, env=clean_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
    )
    uri = tracking_uri(tmp_path)

    def both_training() -> bool:
        if not (tmp_path / "mlflow.db").exists() or len(loky_workers(proc.pid)) < 2:
            return False
        with contextlib.suppress(Exception):  # the store may be mid-creation
            return sum(c.info.status == "RUNNING" for c in runs_by_kind(uri)[1]) == 2
        return False

    try:
        wait_until(both_training, "two jobs training", proc, log, WAIT_S)
        os.kill(loky_workers(proc.pid)[0], signal.SIGKILL)  # what the OOM killer does
        proc.wait(timeout=CLI_TIMEOUT_S)
    finally:
        proc.kill()
    assert proc.returncode not in (0, None), log.read_text()[-4000:]
    parents, children = runs_by_kind(uri)
    assert [p.info.status for p in parents] == ["FAILED"], log.read_text()[-4000:]
    assert len(children) == 2 and all(c.info.status in ("FAILED", "KILLED") for c in children), \
        [c.info.status for c in children]


# -- the rules themselves (no process) ---------------------------------------------------------------
def test_userinfo_is_masked_to_the_last_at_before_the_host_and_no_further():
    from attnseq.tracking.redaction import redact_text

    assert redact_text(f"http://alice:{URI_PASSWORD}@h:5000/a@b c@d") == "http://***@h:5000/a@b c@d"
    assert redact_text(f"http\\://alice\\:{URI_PASSWORD}@h\\:5000") == "http\\://***@h\\:5000"  # Hydra's escapes


def test_a_sweeps_secrets_become_environment_references_that_resolve_to_them(monkeypatch):
    from omegaconf import OmegaConf

    from attnseq.tracking.redaction import secrets_to_environment

    overrides = [f"+db.password={DB_SECRET},'{OTHER_DB_SECRET}'", f"+u=http://alice:{URI_PASSWORD}@h:1", "scorer=a,b"]
    safe, env = secrets_to_environment(overrides)
    assert leaks(safe) == [] and safe[2] == "scorer=a,b"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    choices = safe[0].split("=", 1)[1].split(",")
    resolved = [OmegaConf.create({"v": choice})["v"] for choice in choices]
    assert resolved == [DB_SECRET, OTHER_DB_SECRET]
    assert OmegaConf.create({"v": safe[1].split("=", 1)[1]})["v"] == f"http://alice:{URI_PASSWORD}@h:1"
