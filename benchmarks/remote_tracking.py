"""What a tracking server costs a training run: the same training (same config, seed and number of
steps) through ``train.py``, logging to an SQLite store directly, to ``mlflow server`` on loopback
with every call waited for, and to the same server with MLflow's asynchronous logging (attnseq's
default for a server: ``attnseq.tracking.run``).

    .venv/bin/python benchmarks/remote_tracking.py            # the full measurement, Markdown on stdout
    .venv/bin/python benchmarks/remote_tracking.py --quick    # one small repeat
    .venv/bin/python benchmarks/remote_tracking.py --backlog  # records queued while the server stalls

The server is started here (SQLite backend in a temporary folder, ``--workers 1``, no job runner)
and stopped at the end. The variants run one after another, alternating, their order rotated each
repeat, so that a busy machine slows them alike. A run's training time is from its first training
step (``attnseq.first_step_s``, counted from the process's start) to the moment the run is marked
FINISHED: every epoch's validation, checkpoint uploads and records, and the end of training's
uploads (the server's share of them is what is measured); throughput is the training target tokens
(EOS included) over that time. ``cost`` is a variant's time over the direct SQLite store's, minus one.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probes import answers, free_port  # benchmarks/ is first on sys.path for its scripts

REPO = Path(__file__).resolve().parents[1]
TRAIN_PY = REPO / "train.py"
EXPERIMENT = "remote-tracking"
SERVER_START_S = 180
RUN_TIMEOUT_S = 1800

VARIANTS = {
    "sqlite": "SQLite store, direct",
    "server sync": "mlflow server, every call waited for",
    "server async": "mlflow server, asynchronous logging",
}
ASYNC_ENV = "MLFLOW_ENABLE_ASYNC_LOGGING"


@dataclass
class Settings:
    train_size: int = 6400  # 100 batches of 64 per epoch
    val_size: int = 256
    epochs: int = 2
    repeats: int = 3
    threads: int = 2
    overrides: list[str] = field(default_factory=list)


QUICK = Settings(train_size=640, val_size=64, epochs=1, repeats=1)


@dataclass
class Measurement:
    variant: str
    repeat: int
    train_s: float
    tokens: int
    window_steps: int
    window_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.train_s


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ATTNSEQ_"))}


@dataclass(frozen=True)
class Server:
    url: str
    group: int  # its process group: its workers too

    @contextlib.contextmanager
    def stalled(self) -> Iterator[None]:
        """The server stopped (SIGSTOP: connections wait, nothing answers) for the block's duration."""
        os.killpg(self.group, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(self.group, signal.SIGCONT)


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[Server]:
    """``mlflow server`` on loopback with an SQLite backend under ``root``."""
    port = free_port()
    log = (root / "server.log").open("w")
    argv = [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
            f"sqlite:///{root}/server.db", "--artifacts-destination", str(root / "server-artifacts"),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    proc = subprocess.Popen(argv, cwd=root, env=clean_env() | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not answers(f"{url}/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start:\n{(root / 'server.log').read_text()[-3000:]}")
            time.sleep(0.25)
        yield Server(url, proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def training_overrides(settings: Settings) -> list[str]:
    return [
        f"dataset.train_size={settings.train_size}",
        f"dataset.val_size={settings.val_size}",
        f"trainer.max_epochs={settings.epochs}",
        f"threads={settings.threads}",
        "seed=0",
        "trainer.enable_progress_bar=false",
        f"mlflow.experiment_name={EXPERIMENT}",
        *settings.overrides,
    ]


def train_tokens(settings: Settings) -> int:
    """Target tokens (EOS included) the training sees: every training example once per epoch."""
    from hydra import compose, initialize_config_dir

    from attnseq.config import resolvers, validate_train  # noqa: F401  (resolvers registers ${attnseq.unique:})
    from attnseq.training.build import build_datamodule

    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*training_overrides(settings), "paths.output_dir=/nonexistent"])
    datamodule = build_datamodule(validate_train(cfg))
    datamodule.setup()
    return settings.epochs * sum(len(example.tgt) + 1 for example in datamodule.train_examples)


def train_once(root: Path, name: str, tracking_uri: str, settings: Settings,
               env: dict[str, str]) -> tuple[float, int, float]:
    """One training run through ``train.py``: its training time in seconds (see the module's
    docstring), and the loop window: the steps and seconds between the first and the last
    ``train/loss_step`` it logged (stamped when logged)."""
    from mlflow.tracking import MlflowClient

    from attnseq.tracking import tags

    out = root / name
    launched = time.time()
    proc = subprocess.run(
        [sys.executable, str(TRAIN_PY), *training_overrides(settings), f"mlflow.tracking_uri={tracking_uri}",
         f"hydra.run.dir={out}", f"mlflow.run_name={name}"],
        cwd=root, env=clean_env() | env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: train.py exited {proc.returncode}\n{proc.stderr[-4000:]}")
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    [run] = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
    first_step_at = launched + float(run.data.tags[tags.FIRST_STEP_S])
    losses = sorted(client.get_metric_history(run.info.run_id, "train/loss_step"), key=lambda m: m.step)
    if len(losses) < 2:  # too short a run to hold a loop window
        return run.info.end_time / 1000 - first_step_at, 0, 0.0
    window_steps = losses[-1].step - losses[0].step
    window_s = (losses[-1].timestamp - losses[0].timestamp) / 1000
    return run.info.end_time / 1000 - first_step_at, window_steps, window_s


def measure(settings: Settings, log: Callable[[str], None] = print) -> dict:
    """Every variant ``settings.repeats`` times, alternating; plain data for ``render``."""
    tokens = train_tokens(settings)
    measurements: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="attnseq-remote-") as tmp:
        root = Path(tmp)
        with mlflow_server(root) as server:
            url = server.url
            targets = {
                "sqlite": (f"sqlite:///{root}/direct.db", {}),
                "server sync": (url, {ASYNC_ENV: "false"}),
                "server async": (url, {}),
            }
            order = list(VARIANTS)
            for repeat in range(settings.repeats):
                rotated = order[repeat % len(order):] + order[:repeat % len(order)]
                for variant in rotated:
                    uri, env = targets[variant]
                    name = f"{variant.replace(' ', '-')}-{repeat}"
                    seconds, window_steps, window_s = train_once(root, name, uri, settings, env)
                    measurements.append(Measurement(variant, repeat, seconds, tokens, window_steps, window_s))
                    log(f"  {name}: {seconds:.1f} s, {tokens / seconds:,.0f} tokens/s; "
                        f"{window_steps} steps in {window_s:.1f} s")
    return {"settings": settings.__dict__, "tokens": tokens,
            "runs": [m.__dict__ | {"tokens_per_s": m.tokens_per_s} for m in measurements]}


def summary(results: dict) -> dict[str, dict[str, float]]:
    """Per variant: the median training time and throughput, and the cost against the SQLite store."""
    by_variant: dict[str, list[dict]] = {}
    for run in results["runs"]:
        by_variant.setdefault(run["variant"], []).append(run)
    rows = {}
    for variant, runs in by_variant.items():
        times = [run["train_s"] for run in runs]
        windows = [run["window_s"] / run["window_steps"] for run in runs if run["window_steps"]]
        median_s = statistics.median(times)
        rows[variant] = {"train_s": median_s, "tokens_per_s": results["tokens"] / median_s,
                         "spread_s": max(times) - min(times),
                         "step_ms": 1000 * statistics.median(windows) if windows else float("nan")}
    for row in rows.values():
        row["cost"] = row["train_s"] / rows["sqlite"]["train_s"] - 1
        row["loop_cost"] = row["step_ms"] / rows["sqlite"]["step_ms"] - 1
    return rows


def render(results: dict) -> str:
    s = results["settings"]
    lines = [
        "## Remote tracking: mlflow server on loopback vs the SQLite store",
        "",
        f"`train.py` defaults (copy, GRU, additive, Bahdanau) with {s['train_size']} training and "
        f"{s['val_size']} validation examples, "
        f"{s['epochs']} epoch(s), seed 0, {s['threads']} threads; {s['repeats']} repeat(s) of each variant, "
        "alternating. Training time: first training step to the run marked FINISHED (uploads at the end "
        "included); loop: milliseconds per step between the first and the last logged `train/loss_step` "
        "(the epoch ends in between included); medians over repeats.",
        "",
        "| variant | training s | tokens/s | cost vs SQLite | spread s | loop ms/step | loop cost |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for variant, row in summary(results).items():
        cost = "—" if variant == "sqlite" else f"{row['cost']:+.1%}"
        no_window = math.isnan(row["step_ms"])  # runs too short to log the step loss twice
        loop_cost = "—" if variant == "sqlite" or no_window else f"{row['loop_cost']:+.1%}"
        step_ms = "—" if no_window else f"{row['step_ms']:.1f}"
        lines.append(f"| {VARIANTS[variant]} | {row['train_s']:.1f} | {row['tokens_per_s']:,.0f} | {cost} | "
                     f"{row['spread_s']:.1f} | {step_ms} | {loop_cost} |")
    return "\n".join(lines) + "\n"


BACKLOGS = (300, 1000, 3000)
"""Records (one ``log_metrics`` call of two metrics each) queued while the server stalls (``--backlog``)."""


def backlog(sizes: tuple[int, ...] = BACKLOGS, repeats: int = 3, log: Callable[[str], None] = print) -> dict:
    """What a run queued while its server stalled costs once the server answers again: ``size`` records
    logged to a stopped server (``Server.stalled``), then the seconds from its resumption until every
    record is stored and the run FINISHED (``TrackedRun.finish``), and the ``log_batch`` calls it took;
    medians of ``repeats``. In this process (no training): only the sender is measured."""
    from mlflow.tracking import MlflowClient

    from attnseq.tracking.run import TrackedRun
    from attnseq.tracking.store import ensure_experiment

    rows = []
    with tempfile.TemporaryDirectory(prefix="attnseq-backlog-") as tmp, mlflow_server(Path(tmp)) as server, \
            quiet_run_links():
        client = MlflowClient(server.url)
        experiment = ensure_experiment(client, "backlog")
        calls: list[int] = []
        send = client.log_batch

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            return send(*args, **kwargs)

        client.log_batch = counted
        for size in sizes:
            seconds, counts = [], []
            for repeat in range(repeats):
                run = TrackedRun.create(client, experiment, f"backlog-{size}-{repeat}", {})
                calls.clear()
                with server.stalled():
                    for step in range(size):
                        run.log_metrics({"m": float(step), "n": float(-step)}, step)
                    time.sleep(0.2)  # the sender holds the first record, waiting for an answer
                    resumed = time.perf_counter()
                run.finish("FINISHED")
                seconds.append(time.perf_counter() - resumed)
                counts.append(len(calls))
                stored = len(client.get_metric_history(run.run_id, "m"))
                if stored != size:
                    raise RuntimeError(f"{stored} of {size} records stored")
            log(f"  backlog {size}: {statistics.median(seconds):.2f} s, {statistics.median(counts):.0f} calls")
            rows.append({"records": size, "seconds": statistics.median(seconds), "calls": statistics.median(counts)})
    return {"repeats": repeats, "rows": rows}


@contextlib.contextmanager
def quiet_run_links() -> Iterator[None]:
    """MLflow's client prints a "View run … at: <url>" line to stdout as each run ends on a server (as
    ``train.py``'s own summary does not need): not for the many short runs of ``backlog``."""
    name = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
    before = os.environ.get(name)
    os.environ[name] = "true"
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def render_backlog(results: dict) -> str:
    lines = ["## A stalled server's backlog", "",
             f"Records (two metrics each) logged while `mlflow server` was stopped (SIGSTOP), then resumed: seconds "
             f"from the resumption to every record stored and the run FINISHED, and the `log_batch` calls; medians "
             f"of {results['repeats']}.", "",
             "| records queued | seconds to FINISHED | calls |", "|---:|---:|---:|"]
    lines += [f"| {row['records']:,} | {row['seconds']:.2f} | {row['calls']:.0f} |" for row in results["rows"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one small repeat")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--train-size", type=int)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--threads", type=int, help="torch threads of each training (default 2)")
    parser.add_argument("--backlog", action="store_true", help="only what a stalled server's backlog costs")
    args = parser.parse_args(argv)
    if args.backlog:
        print(render_backlog(backlog(repeats=args.repeats or 3, log=lambda line: print(line, file=sys.stderr))))
        return 0
    settings = Settings(**QUICK.__dict__) if args.quick else Settings()
    for key in ("repeats", "train_size", "epochs", "threads"):
        if getattr(args, key) is not None:
            setattr(settings, key, getattr(args, key))
    results = measure(settings, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
