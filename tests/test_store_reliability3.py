"""The tracking store at its edges, through the real ``train.py``: a signal while a fresh SQLite store
is created leaves a store the next run opens; a damaged store says what is wrong and a fix that
works; a slow tracking server never gets a run twice, and one slow on every call stops with the
retry message; a SQLite store locked mid-training is waited for within the retry budget."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from cli_helpers import REPO, all_runs, clean_env, explain, outputs_under, run_cli, tiny, tracking_uri, user_env
from mlflow.tracking import MlflowClient
from pauses import pause_at

DEADLINE_S = 240
"""How long a test waits for a subprocess to reach a point: far above what it takes at load 8."""


def wait_for_line(proc: subprocess.Popen, line: str) -> None:
    """Read ``proc``'s stdout until ``line`` (it prints it and waits there)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        got = proc.stdout.readline()
        if got.strip() == line:
            return
        if not got and proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before {line!r}:\n{proc.stderr.read()[-3000:]}")
    pytest.fail(f"no {line!r} after {DEADLINE_S} s")


# -- point 1: a signal during a fresh store's creation --------------------------------------------
@pytest.mark.slow
def test_a_signal_while_the_store_is_created_leaves_a_store_the_next_run_opens(tmp_path):
    """SIGTERM amid MLflow's migrations of a fresh store (Ctrl-C takes the same handler): the store is
    not there, or whole; the next run into it trains."""
    signum = signal.SIGTERM
    first = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *tiny(max_epochs=1, heatmaps=False), *outputs_under(tmp_path)],
        cwd=tmp_path, env=pause_at("schema", clean_env()), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for_line(first, "PHASE schema")  # the tables are being made
        first.send_signal(signum)
        first.wait(timeout=DEADLINE_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 128 + signum, first.stderr.read()[-3000:]
    second = run_cli(tmp_path, *tiny(max_epochs=1, heatmaps=False), *outputs_under(tmp_path), env=user_env())
    assert second.returncode == 0, explain(second)
    (run,) = all_runs(MlflowClient(tracking_uri(tmp_path)))
    assert run.info.status == "FINISHED"


def test_a_damaged_store_says_so_and_the_fix_it_prints_works(tmp_path):
    """A store whose migrations were cut short (as the code before this fix left one: its schema
    version older than its tables) is named with a fix; after that fix, the store opens."""
    import shlex
    import sqlite3

    uri = tracking_uri(tmp_path)
    MlflowClient(tracking_uri=uri).search_experiments()  # a whole store
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        db.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")  # MLflow's first migration
    proc = run_cli(tmp_path, *tiny(max_epochs=1), *outputs_under(tmp_path), env=user_env(), timeout=DEADLINE_S)
    assert proc.returncode == 2, explain(proc)
    assert "Traceback" not in proc.stderr and str(tmp_path / "mlflow.db") in proc.stderr, proc.stderr
    fix = proc.stderr.split("Fix:", 1)[1]
    move = fix[fix.index("mv "):].split(")", 1)[0]
    subprocess.run(shlex.split(move), check=True, cwd=tmp_path)
    opened = subprocess.run(  # what the next run does first (another process: this one keeps the old file open)
        [sys.executable, "-c", OPEN_STORE, uri], cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
        timeout=DEADLINE_S,
    )
    assert opened.returncode == 0 and opened.stdout.split() == ["Default"], opened.stderr[-3000:]


OPEN_STORE = """
import sys
from attnseq.tracking.store import check_tracking_uri, open_store
check_tracking_uri(sys.argv[1])
print(*(experiment.name for experiment in open_store(sys.argv[1]).search_experiments()))
"""
