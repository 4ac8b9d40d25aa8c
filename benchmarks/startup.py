"""Start-up as a user meets it: ``train.py --help``, the first training step of ``python train.py``,
and ``make ui`` answering HTTP.

    .venv/bin/python benchmarks/startup.py            # 3 tries of each, Markdown on stdout
    .venv/bin/python benchmarks/startup.py --tries 1

- **--help**: wall time of the process.
- **first training step**: ``python train.py`` with its defaults (one step: ``+trainer.max_steps=1``,
  which changes nothing before the first step), the seconds from the process's start to its first
  training step as the run records them (``attnseq.first_step_s``). The first try opens a new SQLite
  store (MLflow creates its schema: once per store), the others the store it left.
- **make ui**: from the launch to the first HTTP 200 of ``/health``: ``make ui``'s command
  (``python -m attnseq.tracking.ui_server``, one process) beside what it replaced (``mlflow ui
  --workers 1`` without the job runner: a command-line process that starts uvicorn in another),
  alternating, on the store the trainings filled.

Medians over the tries; the goals are issue 16's, for a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from probes import answers, free_port  # benchmarks/ is first on sys.path for its scripts

REPO = Path(__file__).resolve().parents[1]
TRAIN_PY = REPO / "train.py"
EXPERIMENT = "startup"
UI_TIMEOUT_S = 180
GOALS_S = {"help": 3.0, "first_step": 8.0, "ui": 10.0}


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "ATTNSEQ_"))}


def time_help() -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, str(TRAIN_PY), "--help"], cwd=REPO, env=clean_env(), check=True,
                   capture_output=True, timeout=120)
    return time.monotonic() - started


def first_step_s(root: Path, name: str) -> float:
    """One ``python train.py`` (defaults, one step) into ``root``'s store; its ``attnseq.first_step_s``."""
    from mlflow.tracking import MlflowClient

    from attnseq.tracking import tags

    uri = f"sqlite:///{root}/mlflow.db"
    proc = subprocess.run(
        [sys.executable, str(TRAIN_PY), "+trainer.max_steps=1", "trainer.enable_progress_bar=false",
         f"mlflow.tracking_uri={uri}", f"mlflow.experiment_name={EXPERIMENT}", f"mlflow.run_name={name}",
         f"hydra.run.dir={root}/{name}"],
        cwd=root, env=clean_env(), capture_output=True, text=True, timeout=1200,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"train.py exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    [run] = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
    return float(run.data.tags[tags.FIRST_STEP_S])


UI_COMMANDS = {
    "make ui": lambda store, port: ([sys.executable, "-m", "attnseq.tracking.ui_server", "--backend-store-uri",
                                     store, "--host", "127.0.0.1", "--port", str(port)], {}),
    "mlflow ui --workers 1": lambda store, port: (
        [str(Path(sys.executable).with_name("mlflow")), "ui", "--backend-store-uri", store, "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"], {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}),
}


def time_ui(command: str, root: Path) -> float:
    """Seconds from the launch until ``/health`` answers 200; the server is stopped after."""
    port = free_port()
    argv, env = UI_COMMANDS[command](f"sqlite:///{root}/mlflow.db", port)
    with (root / "ui.log").open("w") as log:
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=root, env=clean_env() | env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        while not answers(f"http://127.0.0.1:{port}/health"):
            if proc.poll() is not None or time.monotonic() - started > UI_TIMEOUT_S:
                raise RuntimeError(f"{command} did not answer:\n{(root / 'ui.log').read_text()[-3000:]}")
            time.sleep(0.05)
        return time.monotonic() - started
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def measure(tries: int = 3, log: Callable[[str], None] = print) -> dict:
    """Every figure ``tries`` times; plain data for ``render``."""
    results: dict = {"tries": tries, "help": [], "first_step_new_store": None, "first_step": [],
                     "ui": {command: [] for command in UI_COMMANDS}}
    for _ in range(tries):
        results["help"].append(time_help())
        log(f"  --help: {results['help'][-1]:.2f} s")
    with tempfile.TemporaryDirectory(prefix="attnseq-startup-") as tmp:
        root = Path(tmp)
        results["first_step_new_store"] = first_step_s(root, "new-store")
        log(f"  first step, new store: {results['first_step_new_store']:.2f} s")
        for i in range(tries):
            results["first_step"].append(first_step_s(root, f"try-{i}"))
            log(f"  first step: {results['first_step'][-1]:.2f} s")
        commands = list(UI_COMMANDS)
        for i in range(tries):
            for command in commands[i % 2:] + commands[:i % 2]:  # alternating, the first one rotated
                results["ui"][command].append(time_ui(command, root))
                log(f"  {command}: {results['ui'][command][-1]:.2f} s")
    return results


def render(results: dict) -> str:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    def row(what: str, seconds: float, goal: float | None, note: str = "") -> str:
        verdict = "" if goal is None else ("met" if seconds < goal else f"missed by {seconds - goal:.1f} s")
        goal_text = "" if goal is None else f"< {goal:g} s"
        return f"| {what} | {seconds:.2f} | {goal_text} | {verdict} | {note} |"

    ui = results["ui"]
    old, new = median(ui["mlflow ui --workers 1"]), median(ui["make ui"])
    lines = [
        "## Start-up",
        "",
        f"Medians of {results['tries']} tries (the new-store figure: one try).",
        "",
        "| what | seconds | goal | | note |",
        "|---|---:|---|---|---|",
        row("`train.py --help`", median(results["help"]), GOALS_S["help"]),
        row("first training step, `python train.py`", median(results["first_step"]), GOALS_S["first_step"],
            "from the process's start; an existing store"),
        row("first training step, a new store", results["first_step_new_store"], None,
            "MLflow creates the store's schema first"),
        row("`make ui` answers `/health`", new, GOALS_S["ui"], f"{new / old:.2f}× `mlflow ui --workers 1`"),
        row("`mlflow ui --workers 1` (before)", old, None, "two processes"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args(argv)
    results = measure(args.tries, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
