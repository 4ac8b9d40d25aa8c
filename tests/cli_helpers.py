"""Helpers shared by the tests that drive the real CLIs (``train.py``, ``evaluate.py``, ``translate.py``) in
subprocesses, with every output — MLflow store, Hydra directories — under the test's ``tmp_path``.

``run_cli`` launches them from a warm interpreter (``tests/zygote.py``: the heavy imports done once per
test process, a fork per launch) unless the launch asks for a fresh one (``fresh=True``), changes a
variable read at start, or ``ATTNSEQ_TESTS_FRESH=1`` is set for the whole session."""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import locale
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from zygote import HEADER, differs_at_startup

sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the launchers' shared probes
from probes import answers, free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRAIN_PY = REPO / "train.py"
BUILD_CORPUS_PY = REPO / "build_corpus.py"
EVALUATE_PY = REPO / "evaluate.py"
TRANSLATE_PY = REPO / "translate.py"
ZYGOTE_PY = REPO / "tests" / "zygote.py"
WARM_SCRIPTS = (TRAIN_PY, EVALUATE_PY, TRANSLATE_PY)
EXPERIMENT = "attnseq"

TRAIN_LENGTHS = (1, 6)
EVAL_LENGTHS = (1, 12)  # reaches past training; the last bucket (11-12) is narrower than the width
BUCKET_WIDTH = 5
NUM_SYMBOLS = 10
MAX_EPOCHS = 2
HEATMAP_LABELS = ("short", "medium", "long")
CLI_TIMEOUT_S = 300

GIVE_UP_BOUND_S = 150
"""How long a process may take to give up on a store that stopped answering, as the tests check it:
above what the work around the retry budget takes at load 8 on 2 cores (a CPU-bound step runs about
5× slower there), below MLflow's own HTTP retries (sleeps of 4, 8, …, 128 s: over 4 minutes), which
is what these bounds catch. The time itself is the benchmark's to measure."""

T = TypeVar("T")


# -- helpers ---------------------------------------------------------------------------------
def tiny(max_epochs: int = MAX_EPOCHS, heatmaps: bool = True) -> list[str]:
    """Overrides that make a run take seconds on a shared CPU."""
    overrides = [
        "dataset.train_size=128",
        "dataset.val_size=32",
        "dataset.test_size=32",
        f"dataset.train_lengths=[{TRAIN_LENGTHS[0]},{TRAIN_LENGTHS[1]}]",
        f"dataset.eval_lengths=[{EVAL_LENGTHS[0]},{EVAL_LENGTHS[1]}]",
        f"dataset.bucket_width={BUCKET_WIDTH}",
        f"dataset.num_symbols={NUM_SYMBOLS}",
        "model.hidden_size=16",
        "model.embedding_dim=8",
        f"trainer.max_epochs={max_epochs}",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
    ]
    if not heatmaps:
        overrides.append("tracking.heatmap_samples=0")
    return overrides


def tracking_uri(root: Path) -> str:
    return f"sqlite:///{root}/mlflow.db"


def seeded_store(root: Path) -> str:
    """The tracking URI of a store under ``root`` that already has MLflow's schema: a copy of one made
    once per test process, since making a fresh SQLite schema costs about 2 s of CPU (MLflow's
    migrations) and the suite makes dozens. Only for tests whose subject is not the store's creation,
    nor a config rejected before any store exists (those use ``tracking_uri`` and check the file)."""
    store = root / "mlflow.db"
    if not store.exists():
        root.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_schema_template(), store)
    return tracking_uri(root)


@functools.cache
def _schema_template() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="attnseq-schema-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    MlflowClient(tracking_uri(folder)).search_experiments()  # creates the schema and the Default experiment
    return folder / "mlflow.db"


def outputs_under(root: Path, seeded: bool = False) -> list[str]:
    """Send the MLflow store and Hydra's run and sweep directories under ``root`` (``seeded``: the
    store starts as a copy of an empty one, see ``seeded_store``)."""
    uri = seeded_store(root) if seeded else tracking_uri(root)
    return [f"mlflow.tracking_uri={uri}", f"hydra.run.dir={root}/out", f"hydra.sweep.dir={root}/multi"]


def clean_env() -> dict[str, str]:
    """The test's environment without anything that would redirect MLflow or join a sweep. Its OpenMP
    threads sleep while they wait (``OMP_WAIT_POLICY=PASSIVE``, unless set already): spinning, torch's
    second thread and the main one at each barrier burn about as much CPU as a tiny run does otherwise on a
    loaded 2-core machine (``benchmarks/results.md``, the fixed CPU cost of a launch), and the suite's
    training processes share those cores."""
    return {"OMP_WAIT_POLICY": "PASSIVE"} | {
        k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ATTNSEQ_"))
    } | {"HYDRA_FULL_ERROR": "1"}


def user_env(**extra: str) -> dict[str, str]:
    """What a user has: no HYDRA_FULL_ERROR, so errors must read well on their own."""
    return {k: v for k, v in clean_env().items() if k != "HYDRA_FULL_ERROR"} | extra


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = 30) -> None:
    """Signal ``proc``'s process group (it was started in a session of its own: a server's workers are
    its children), wait up to ``grace_s`` for ``proc``, then kill whatever is left of the group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_until(ready: Callable[[], object], what: str, proc: subprocess.Popen | None = None, log: Path | None = None,
               timeout: float = CLI_TIMEOUT_S, poll_s: float = 0.2) -> None:
    """Poll ``ready()`` until it is true; fail (naming ``what``, with ``log``'s tail) if ``proc`` ends first
    or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not ready():
        ended = proc is not None and proc.poll() is not None
        if ended or time.monotonic() > deadline:
            tail = "" if log is None or not log.exists() else f":\n{log.read_text()[-4000:]}"
            raise AssertionError(f"exited ({proc.returncode}) before {what}{tail}" if ended
                                 else f"no {what} within {timeout} s{tail}")
        time.sleep(poll_s)


SERVER_START_S = 180
"""How long ``mlflow server`` may take to answer its health check: far above its start at load 8."""


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 over a SQLite store under ``root`` (``server.db``, unless ``store``
    names another), its output in ``root/server.log``; in a process group of its own, so that
    ``kill`` ends its workers too. Started through ``mlflow_server``, which kills it at the end."""

    def __init__(self, root: Path, port: int | None = None, artifacts: bool = True, env: dict | None = None,
                 workers: int = 1, store: str | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store_uri = store or f"sqlite:///{root}/server.db"
        self.log = root / "server.log"
        self.argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
                     "--workers", str(workers), "--backend-store-uri", self.store_uri]
        if artifacts:
            self.argv += ["--artifacts-destination", str(root / "artifacts")]
        self.env = clean_env() | (env or {})
        self.proc: subprocess.Popen | None = None

    @property
    def backend(self) -> MlflowClient:
        """A client on the server's store itself, not through the server: it reads after the server is gone."""
        return MlflowClient(self.store_uri)

    def start(self) -> None:
        """Start it and wait until it answers; fail with its log's tail if it ends or is not ready in time."""
        with self.log.open("a") as out:  # a restart appends
            self.proc = subprocess.Popen(self.argv, cwd=self.root, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: answers(f"{self.url}/health"), "answer from mlflow server", self.proc, self.log,
                   SERVER_START_S, 0.25)

    def kill(self, sig: int = signal.SIGKILL, grace_s: float = 30) -> None:
        """``stop_group`` on it: ``sig`` to its process group, then SIGKILL what is left after ``grace_s``."""
        if self.proc is not None:
            stop_group(self.proc, sig, grace_s)

    def restart(self) -> None:
        """Kill it (SIGKILL: it dies) and start a new one on the same port and store."""
        self.kill()
        self.start()


@contextlib.contextmanager
def mlflow_server(root: Path, port: int | None = None, artifacts: bool = True, env: dict | None = None,
                  workers: int = 1, store: str | None = None) -> Iterator[MlflowServer]:
    """A started ``MlflowServer`` (``env``: variables on top of ``clean_env()``; ``artifacts``: with
    ``--artifacts-destination root/artifacts``); its process group is killed at the end."""
    server = MlflowServer(root, port, artifacts, env, workers, store)
    try:
        server.start()
        yield server
    finally:
        server.kill()


def run_cli(
    root: Path, *args: str, timeout: float = CLI_TIMEOUT_S, script: Path = TRAIN_PY, env: dict | None = None,
    stdin: str | None = None, fresh: bool = False,
) -> subprocess.CompletedProcess:
    """``script`` with ``args`` in ``root``, as ``subprocess.run(..., capture_output=True, text=True)``
    would; ``stdin``: the text it reads there (None: the test's own stdin); ``fresh``: in a new
    interpreter, not a warm one (see the module's docstring)."""
    env = clean_env() if env is None else env
    warm = None if fresh or script not in WARM_SCRIPTS else _warm_interpreter()
    warm = warm if warm is not None and not differs_at_startup(warm.env, env) else None
    if log := os.environ.get("ATTNSEQ_TESTS_LAUNCH_LOG"):  # which launches were warm: one line each
        with open(log, "a") as lines:
            lines.write(f"{'warm' if warm else 'fresh'} {script.name} {os.environ.get('PYTEST_CURRENT_TEST')}\n")
    if warm is not None:
        return warm.run(script, args, root, env, stdin, timeout)
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=root, env=env, input=stdin, capture_output=True, text=True,
        timeout=timeout,
    )


class WarmInterpreter:
    """This test process's ``tests/zygote.py`` server and the launches it runs."""

    def __init__(self) -> None:
        self.env = clean_env()
        self.folder = tempfile.mkdtemp(prefix="attnseq-zygote-")
        self.socket_path = os.path.join(self.folder, "socket")
        with open(os.path.join(self.folder, "server.log"), "wb") as log:
            self.server = subprocess.Popen(
                [sys.executable, str(ZYGOTE_PY), self.socket_path], cwd=REPO, env=self.env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
            )
        atexit.register(self.close)
        self.ready = self.server.stdout.readline() == b"ready\n"

    def close(self) -> None:
        self.server.stdin.close()  # the server's signal to end
        try:
            self.server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.server.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, script: Path, args: tuple[str, ...], cwd: Path, env: dict, stdin: str | None,
            timeout: float) -> subprocess.CompletedProcess:
        command = [sys.executable, str(script), *args]
        deadline = time.monotonic() + timeout
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin is not None else (0, None)
        request = json.dumps({"script": str(script), "args": list(args), "cwd": str(cwd), "env": env}).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self.socket_path)
            socket.send_fds(conn, [HEADER.pack(len(request))], [in_r, out_w, err_w])
            conn.sendall(request)
            for fd in (out_w, err_w) + ((in_r,) if in_w is not None else ()):
                os.close(fd)
            captured: dict[int, bytes] = {}
            threads = [threading.Thread(target=_read_all, args=(fd, captured)) for fd in (out_r, err_r)]
            if in_w is not None:
                threads.append(threading.Thread(target=_write_all, args=(in_w, stdin.encode())))
            for thread in threads:
                thread.start()
            lines = _Lines(conn)
            pid = int(lines.next(deadline))
            try:
                returncode, cpu_s = lines.next(deadline).split()
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                lines.next(None)
                for thread in threads:
                    thread.join()
                raise subprocess.TimeoutExpired(command, timeout, _text(captured[out_r]),
                                                _text(captured[err_r])) from None
        for thread in threads:
            thread.join()
        done = subprocess.CompletedProcess(command, int(returncode), _text(captured[out_r]), _text(captured[err_r]))
        done.cpu_s = float(cpu_s)  # the launch's own CPU (user + system), its children's not included
        return done


class _Lines:
    """The server's answer, a line at a time, each by a deadline (None: no limit)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buffer = b""

    def next(self, deadline: float | None) -> str:
        while b"\n" not in self.buffer:
            self.conn.settimeout(None if deadline is None else max(deadline - time.monotonic(), 0.001))
            chunk = self.conn.recv(64)  # TimeoutError past the deadline
            if not chunk:
                raise RuntimeError(f"the warm interpreter's supervisor ended mid-launch (see {self.conn})")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()


def _read_all(fd: int, into: dict[int, bytes]) -> None:
    chunks = []
    with open(fd, "rb", closefd=True) as stream:
        while chunk := stream.read1(65536):
            chunks.append(chunk)
    into[fd] = b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    with open(fd, "wb", closefd=True) as stream:
        try:
            stream.write(data)
        except BrokenPipeError:
            pass


def _text(data: bytes) -> str:
    """As ``subprocess`` decodes in text mode: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


_warm_lock = threading.Lock()


@functools.cache
def _started_warm_interpreter() -> WarmInterpreter:
    return WarmInterpreter()


def _warm_interpreter() -> WarmInterpreter | None:
    """The test process's warm interpreter, started on first use; None when switched off or it failed."""
    if os.environ.get("ATTNSEQ_TESTS_FRESH") == "1":
        return None
    with _warm_lock:
        warm = _started_warm_interpreter()
        if warm.ready and differs_at_startup(warm.env, clean_env()):  # this process's own environment moved on
            warm.close()  # (an in-process test left a variable read at start): a server that matches it again
            _started_warm_interpreter.cache_clear()
            warm = _started_warm_interpreter()
    return warm if warm.ready else None


def warm_up() -> None:
    """Start the warm interpreter now (seconds: it imports torch, Lightning and MLflow), so that a
    launch timed after it is timed from its own start, not from the server's."""
    _warm_interpreter()


def child_cpu_s(call: Callable[[], T]) -> tuple[T, float]:
    """``call()``'s result and the CPU time (user + system) of the child processes it waited for.
    Unlike the wall-clock time, CPU time does not grow with the machine's load: a bound on it holds
    on a busy machine and still tells a light command from one that imports torch."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = call()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def explain(proc: subprocess.CompletedProcess) -> str:
    return (
        f"exit code {proc.returncode}\n--- stdout (tail) ---\n{proc.stdout[-3000:]}\n"
        f"--- stderr (tail) ---\n{proc.stderr[-6000:]}"
    )


def all_runs(client: MlflowClient, experiment_name: str = EXPERIMENT) -> list:
    experiment = client.get_experiment_by_name(experiment_name)
    assert experiment is not None, f"no experiment {experiment_name!r} in the store"
    return client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL, max_results=1000)


def runs_in(root: Path) -> list:
    """The runs of the store under ``root`` (``tracking_uri``); none while it, or its experiment, is not there yet."""
    if not (root / "mlflow.db").exists():
        return []
    try:
        return all_runs(MlflowClient(tracking_uri(root)))
    except AssertionError:  # no experiment yet
        return []


def fresh_store(root: Path, artifacts: Path | None = None) -> tuple[MlflowClient, str]:
    """A store under ``root`` whose schema and the CLIs' experiment exist already (so that concurrent
    processes do not race to create them), its artifacts under ``artifacts`` (default: ``root/mlruns``, where a
    CLI started in ``root`` puts them, not this process's ./mlruns in the checkout): (client, experiment id)."""
    client = MlflowClient(tracking_uri(root))
    return client, client.create_experiment(EXPERIMENT, artifact_location=str(artifacts or root / "mlruns"))


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    paths: set[str] = set()
    for info in client.list_artifacts(run_id, path):
        paths |= artifact_paths(client, run_id, info.path) if info.is_dir else {info.path}
    return paths


def is_child(run) -> bool:
    return MLFLOW_PARENT_RUN_ID in run.data.tags


