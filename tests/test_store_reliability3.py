"""The tracking store at its edges, through the real ``train.py``: a signal while a fresh SQLite store
is created leaves a store the next run opens; a damaged store says what is wrong and a fix that
works; a slow tracking server never gets a run twice, and one slow on every call stops with the
retry message; a SQLite store locked mid-training is waited for within the retry budget."""

from __future__ import annotations

import http.client
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from cli_helpers import (
    REPO,
    all_runs,
    clean_env,
    explain,
    mlflow_server,
    outputs_under,
    run_cli,
    tiny,
    tracking_uri,
    user_env,
)
from mlflow.tracking import MlflowClient
from pauses import pause_at

from attnseq.tracking.retry import DEFAULT_BUDGET_S, schedule_for

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


@pytest.mark.slow
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


# -- point 5: a slow tracking server ----------------------------------------------------------------
class SlowProxy:
    """An HTTP proxy in front of ``upstream`` that forwards every request at once and holds back the
    answer to those whose path contains ``slow`` for ``delay_s`` (the server has done the work; its
    answer is late). ``delayed`` counts them."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        self.upstream = urlsplit(upstream).netloc
        self.delay_s = delay_s
        self.slow: str | None = None
        self.delayed = 0
        self.stopping = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Forward)
        self.server.daemon_threads = True
        self.server.proxy = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> SlowProxy:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def forward(self) -> None:
        proxy: SlowProxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        upstream = http.client.HTTPConnection(proxy.upstream, timeout=120)
        upstream.request(self.command, self.path, body=body, headers=headers | {"Host": proxy.upstream})
        answer = upstream.getresponse()
        data = answer.read()
        upstream.close()
        if proxy.slow and proxy.slow in self.path:
            proxy.delayed += 1
            proxy.stopping.wait(proxy.delay_s)
        try:
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client stopped waiting
            pass

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = forward

    def log_message(self, *args) -> None:
        pass


SLOW_S = schedule_for(DEFAULT_BUDGET_S).timeout_s + 20
"""Longer than any attempt waits at the default budget, or at the 6 s the test gives: every delayed
answer comes after the client stopped waiting."""


@pytest.mark.slow
def test_a_slow_server_gets_each_run_once_and_one_slow_on_every_call_stops_with_the_retry_message(tmp_path):
    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as server, SlowProxy(server.url, SLOW_S) as proxy:
        proxy.slow = "/api/"  # every call of MLflow's REST API, the experiment lookup first
        dead = run_cli(tmp_path, *tiny(max_epochs=1, heatmaps=False), f"mlflow.tracking_uri={proxy.url}",
                       "++mlflow.retry_budget_s=6", f"hydra.run.dir={tmp_path}/dead", env=user_env(),
                       timeout=DEADLINE_S)
        proxy.slow, delayed = "/runs/create", proxy.delayed
        slow = run_cli(tmp_path, *tiny(max_epochs=1, heatmaps=False), f"mlflow.tracking_uri={proxy.url}",
                       f"hydra.run.dir={tmp_path}/out", env=user_env(), timeout=DEADLINE_S)
        runs = all_runs(MlflowClient(server.url))
    assert delayed >= 1 and dead.returncode == 1, explain(dead)
    assert "Traceback" not in dead.stderr, dead.stderr[-3000:]
    assert "stopped answering" in dead.stderr and "mlflow.retry_budget_s" in dead.stderr, dead.stderr[-3000:]
    assert proxy.delayed > delayed and slow.returncode == 0, explain(slow)  # its answer came too late
    assert [run.info.status for run in runs] == ["FINISHED"], [(r.info.run_id, r.info.status) for r in runs]


# -- point 8: a SQLite store locked mid-training ----------------------------------------------------
LOCKED_BUDGET_S = 10


@pytest.mark.slow
def test_a_store_locked_mid_training_past_the_budget_stops_with_how_to_resume(tmp_path):
    """Another process holds the SQLite store in an exclusive transaction from the end of the first
    epoch on: the training waits the budget out, then stops with exit code 1, the store and the
    resume command, no traceback."""
    import sqlite3

    checkpoint = tmp_path / "out" / "checkpoints" / "last.ckpt"
    with (tmp_path / "stderr").open("w") as stderr:
        training = subprocess.Popen(
            [sys.executable, str(REPO / "train.py"), *tiny(max_epochs=500, heatmaps=False), *outputs_under(tmp_path),
             f"++mlflow.retry_budget_s={LOCKED_BUDGET_S}"],
            cwd=tmp_path, env=user_env(), stdout=subprocess.DEVNULL, stderr=stderr,
        )
    lock = None
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not checkpoint.is_file():  # the run exists and trains
            assert training.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, f"no checkpoint after {DEADLINE_S} s"
            time.sleep(0.2)
        lock = sqlite3.connect(tmp_path / "mlflow.db", timeout=DEADLINE_S, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")  # held until the training has given up
        code = training.wait(timeout=DEADLINE_S)
    finally:
        if lock is not None:
            lock.close()
        if training.poll() is None:
            training.kill()
    (run,) = all_runs(MlflowClient(tracking_uri(tmp_path)))
    text = (tmp_path / "stderr").read_text()
    assert code == 1, text[-3000:]
    assert "Traceback" not in text and "mlflow.retry_budget_s" in text, text[-3000:]
    assert str(tmp_path / "mlflow.db") in text, text[-3000:]
    assert f"python train.py resume={run.info.run_id}" in text, text[-3000:]
