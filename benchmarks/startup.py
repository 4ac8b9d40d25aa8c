"""Start-up as a user meets it: ``train.py --help``, the first training step of ``python train.py``,
and ``make ui`` answering HTTP.

    .venv/bin/python benchmarks/startup.py            # 3 tries of each, Markdown on stdout
    .venv/bin/python benchmarks/startup.py --tries 1

- **--help**: wall time of the process.
- **first training step**: ``python train.py`` with its defaults (one step: ``+trainer.max_steps=1``,
  which changes nothing before the first step), the seconds from the process's start to its first
  training step as the run records them (``attnseq.first_step_s``): ``--tries`` launches into a new SQLite
  store each (its schema made once per store, beside the imports), then as many into the store the first left.
- **make ui**: from the launch to the first HTTP 200 of ``/health``: ``make ui``'s command
  (``python -m attnseq.tracking.ui_server``, one process) beside what it replaced (``mlflow ui
  --workers 1`` without the job runner: a command-line process that starts uvicorn in another),
  alternating, on the store the trainings filled.

Medians over the tries; the goals are issue 16's, for a quiet machine.

The fixed CPU cost of a launch (``--launch-cost``; the full benchmark's start-up section runs it too):

    .venv/bin/python benchmarks/startup.py --launch-cost                      # this checkout
    .venv/bin/python benchmarks/startup.py --launch-cost --against /work/main # and another, alternating

- **per launch**: the CPU seconds (user + sys, the process and its children) of a tiny ``train.py`` run
  (``LAUNCH_OVERRIDES``: one epoch of 64 examples, 32 validated), into a store that already has its
  schema (a copy of an empty one, as the tests make it); with ``--against``, the other checkout's
  launch runs after each of this one's, into the same kind of store, and the ratio is of the medians.
- **where it goes**: the same launches, each function of ``PHASES`` wrapped as its module is imported so
  that its calls' CPU seconds (the process's clock: torch's threads included) add up to its phase's; a
  few calls each, so the timing costs nothing measurable. The phases' medians are of those launches.

The first launch into a new store (``--new-store``):

    .venv/bin/python benchmarks/startup.py --new-store --against /path/to/other/checkout --tries 8

- ``python train.py`` with its defaults and one step into a new SQLite store (a new folder each launch), this
  checkout alternating with the other's: the run's ``attnseq.first_step_s``, the wall seconds to the exit and
  the CPU seconds of the launch and its children (``train.py`` makes a new store's schema in a process of its
  own while it loads its libraries: ``attnseq.tracking.prepared_store``); with ``--against``, the ratios of the
  medians and Welch's p.

How each command ends (``--exits``):

    .venv/bin/python benchmarks/startup.py --exits --against /path/to/other/checkout

- one tiny run trained into a store (``LAUNCH_OVERRIDES``), then each entry point launched on it in turn,
  ``--tries`` times, alternating with the other checkout's (its own scripts and package, this
  interpreter): ``train.py`` (a tiny run), ``evaluate.py`` (``EVALUATE_OVERRIDES``), ``translate.py`` (one
  source). Each line the process prints (standard output and error) is timed as it arrives: **to the last
  line** is the command's work as the user sees it, **the exit** what follows it until the process is gone
  (the interpreter's teardown: what ``attnseq.runtime.skip_final_collection`` cuts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
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


def first_step_s(root: Path, name: str, repo: Path | None = None) -> float:
    """One ``python train.py`` (defaults, one step) into ``root``'s store; its ``attnseq.first_step_s``.
    ``repo``: another checkout's ``train.py`` and package (this one's by default)."""
    from mlflow.tracking import MlflowClient

    from attnseq.tracking import tags

    uri = f"sqlite:///{root}/mlflow.db"
    proc = subprocess.run(
        [sys.executable, str((repo or REPO) / "train.py"), "+trainer.max_steps=1", "trainer.enable_progress_bar=false",
         f"mlflow.tracking_uri={uri}", f"mlflow.experiment_name={EXPERIMENT}", f"mlflow.run_name={name}",
         f"hydra.run.dir={root}/{name}"],
        cwd=root, env=clean_env() | ({"PYTHONPATH": str(repo)} if repo else {}), capture_output=True, text=True,
        timeout=1200,
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
    results: dict = {"tries": tries, "help": [], "first_step_new_store": [], "first_step": [],
                     "ui": {command: [] for command in UI_COMMANDS}}
    for _ in range(tries):
        results["help"].append(time_help())
        log(f"  --help: {results['help'][-1]:.2f} s")
    with tempfile.TemporaryDirectory(prefix="attnseq-startup-") as tmp:
        root = Path(tmp)
        for i in range(tries):  # the first makes the store the other launches find; each other in a folder of its own
            with tempfile.TemporaryDirectory(prefix="attnseq-startup-new-") as other:
                results["first_step_new_store"].append(first_step_s(root if i == 0 else Path(other), f"new-{i}"))
            log(f"  first step, new store: {results['first_step_new_store'][-1]:.2f} s")
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
        f"Medians of {results['tries']} tries (each new store in a folder of its own).",
        "",
        "| what | seconds | goal | | note |",
        "|---|---:|---|---|---|",
        row("`train.py --help`", median(results["help"]), GOALS_S["help"]),
        row("first training step, `python train.py`", median(results["first_step"]), GOALS_S["first_step"],
            "from the process's start; an existing store"),
        row("first training step, a new store", median(results["first_step_new_store"]), None,
            "MLflow's schema made beside the imports (`attnseq.tracking.prepared_store`)"),
        row("`make ui` answers `/health`", new, GOALS_S["ui"], f"{new / old:.2f}× `mlflow ui --workers 1`"),
        row("`mlflow ui --workers 1` (before)", old, None, "two processes"),
    ]
    return "\n".join(lines) + "\n"


LAUNCH_OVERRIDES = ["trainer.max_epochs=1", "dataset.train_size=64", "dataset.val_size=32",
                    "trainer.enable_progress_bar=false"]
"""A tiny run: what the tests launch (``tests/cli_helpers.tiny``) is about as small; its seconds are the
fixed cost of a launch, next to nothing of them training."""

PHASES: list[tuple[str, list[str]]] = [
    ("imports of the training pipeline (torch, Lightning, MLflow)", ["attnseq.training.pipeline:<import>"]),
    ("tracking store checked (a new one: created)", ["attnseq.tracking.store:check_tracking_uri"]),
    ("figures drawn by matplotlib (heatmaps, accuracy vs length)", ["attnseq.training.artifacts:attention_heatmap",
                                                                    "attnseq.training.artifacts:accuracy_vs_length",
                                                                    "attnseq.training.artifacts:figure_to_array"]),
    ("attention heatmaps: decoded and drawn", ["attnseq.training.artifacts:RunArtifacts.heatmap_images"]),
    ("images and pictures written to the run", ["attnseq.tracking.run:TrackedRun.log_image_step",
                                                "attnseq.training.artifacts:RunArtifacts.log_picture"]),
    ("checkpoints uploaded during training", ["attnseq.training.artifacts:UploadedCheckpoint.upload"]),
    ("final checkpoints, model file and MLflow model", ["attnseq.training.artifacts:RunArtifacts.log_checkpoints"]),
    ("training, validation and all of the above inside `fit`", ["attnseq.training.pipeline:fit"]),
]
"""The phases of a launch: a label and the functions (``module:qualified name``; ``module:<import>``: the
module's import, its own imports included) whose CPU seconds it sums, each call counted once however deep
it nests in itself or another of the phase's functions. A call made inside an earlier phase is that phase's;
a later phase holds the earlier ones its functions call (the heatmaps their drawing, ``fit`` most of them)."""

TIMED_CHILD = """
import importlib.abc, importlib.util, json, resource, runpy, sys, time
out, clock, phases, script, *args = sys.argv[1:]
phases, clock, began_at = json.loads(phases), getattr(time, clock), time.perf_counter()
seconds, own, active, open_calls = [0.0] * len(phases), [0.0] * len(phases), [0] * len(phases), []

def timed(index, function):
    def wrapper(*a, **k):
        if any(active[:index + 1]):  # inside this phase already, or an earlier one: counted there
            return function(*a, **k)
        active[index] += 1
        open_calls.append([index, 0.0])  # [its phase, the seconds of the timed calls inside it]
        began = clock()
        try:
            return function(*a, **k)
        finally:
            elapsed = clock() - began
            _, inside = open_calls.pop()
            seconds[index] += elapsed
            own[index] += elapsed - inside  # its own: without the other phases' calls it made
            if open_calls:
                open_calls[-1][1] += elapsed
            active[index] -= 1
    return wrapper

wanted = {}
for index, (_, targets) in enumerate(phases):
    for target in targets:
        module, _, name = target.partition(":")
        wanted.setdefault(module, []).append((index, name))

class Timing(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name not in wanted:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        self.loaders = getattr(self, "loaders", {}) | {name: spec.loader}
        spec.loader = self
        return spec

    def exec_module(self, module):
        name = module.__name__
        imported = [index for index, what in wanted[name] if what == "<import>"]
        run = self.loaders[name].exec_module
        for index in imported:
            run = timed(index, run)
        run(module)
        for index, what in wanted[name]:  # wrapped before anyone imports them by name
            if what != "<import>":
                owner, _, attribute = what.rpartition(".")
                holder = getattr(module, owner) if owner else module
                setattr(holder, attribute, timed(index, getattr(holder, attribute)))

sys.meta_path.insert(0, Timing())
sys.argv = [script, *args]
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as done:
    if done.code not in (0, None):
        raise
finally:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(out, "w") as handle:
        json.dump({"phases": seconds, "own": own, "total": usage.ru_utime + usage.ru_stime,
                   "wall": time.perf_counter() - began_at}, handle)
"""
"""Runs ``script`` with ``args`` as ``__main__``, each function of ``phases`` (a JSON list of ``[label,
targets]``, as ``PHASES``) wrapped as its module is imported, timed on ``clock`` (``process_time``: CPU of
the process; ``perf_counter``: wall), and writes to ``out`` each phase's seconds (``phases``: its calls', the
other phases' inside them included; ``own``: without them), the process's CPU (``total``) and its wall time
(``wall``). argv: ``out clock phases script *args``."""


def seeded_store(root: Path, template: Path) -> str:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, root / "mlflow.db")
    return f"sqlite:///{root}/mlflow.db"


def schema_template(folder: Path) -> Path:
    """An empty store with MLflow's schema, made once per benchmark (what the tests copy)."""
    from mlflow.tracking import MlflowClient

    MlflowClient(f"sqlite:///{folder}/template.db").search_experiments()
    return folder / "template.db"


def launch_cpu_s(repo: Path, root: Path, phases_to: Path | None = None, env: dict[str, str] | None = None) -> float:
    """One tiny ``train.py`` of checkout ``repo`` into ``root`` (its store already there or not): the CPU
    seconds of the process and its children; with ``phases_to``, each of ``PHASES``'s seconds written there
    (JSON) by the same launch; ``env``: variables added to its environment."""
    uri = f"sqlite:///{root}/mlflow.db"
    args = [*LAUNCH_OVERRIDES, f"mlflow.tracking_uri={uri}", f"mlflow.experiment_name={EXPERIMENT}",
            f"hydra.run.dir={root}/out"]
    script = str(repo / "train.py")
    argv = [sys.executable, script, *args] if phases_to is None else \
        [sys.executable, "-c", TIMED_CHILD, str(phases_to), "process_time", json.dumps(PHASES), script, *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, cwd=root, env=clean_env() | (env or {}) | {"PYTHONPATH": str(repo)},
                          capture_output=True, text=True, timeout=1200)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def phase_seconds(timed: Path) -> dict[str, float]:
    """The CPU seconds of each of ``PHASES`` in a launch (``launch_cpu_s``'s ``phases_to``), and of the whole."""
    measured = json.loads(timed.read_text())
    return {label: seconds for (label, _), seconds in zip(PHASES, measured["phases"])} | \
        {"the whole launch": measured["total"]}


def measure_launch_cost(tries: int = 3, against: Path | None = None, env: dict[str, str] | None = None,
                        log: Callable[[str], None] = print) -> dict:
    """``tries`` tiny launches of this checkout (alternating with ``against``'s), each timed, and the phases
    of each launch summed; the phases' medians are of the same launches."""
    checkouts = {"this": REPO, **({"against": against.resolve()} if against else {})}
    results: dict = {"tries": tries, "overrides": LAUNCH_OVERRIDES, "cpu_s": {who: [] for who in checkouts},
                     "checkouts": {who: str(path) for who, path in checkouts.items()}, "phases": {}, "env": env or {}}
    with tempfile.TemporaryDirectory(prefix="attnseq-launch-") as tmp:
        template = schema_template(Path(tmp))
        for i in range(tries):
            order = list(checkouts) if i % 2 == 0 else list(checkouts)[::-1]  # alternating, first one rotated
            for who in order:
                root = Path(tmp) / f"{who}-{i}"
                seeded_store(root, template)
                cpu = launch_cpu_s(checkouts[who], root, phases_to=root / "phases.json", env=env)
                results["cpu_s"][who].append(cpu)
                for label, seconds in phase_seconds(root / "phases.json").items():
                    results["phases"].setdefault(who, {}).setdefault(label, []).append(seconds)
                log(f"  launch {who} ({checkouts[who]}): {results['cpu_s'][who][-1]:.2f} s CPU")
    return results


def render_launch_cost(results: dict) -> str:
    cpu = {who: statistics.median(values) for who, values in results["cpu_s"].items()}
    lines = [
        "### The fixed CPU cost of a launch",
        "",
        f"`{''.join(f'{k}={v} ' for k, v in results['env'].items())}train.py {' '.join(results['overrides'])}` "
        "into a store with its schema; CPU seconds (user + sys), "
        f"medians of {results['tries']} launches" + (", alternating with the other checkout." if "against" in cpu
                                                      else "."),
        "",
    ]
    who = list(cpu)
    header = " | ".join(f"{w} (`{results['checkouts'][w]}`)" for w in who)
    lines += [f"| | {header} |" + (" ratio |" if len(who) > 1 else ""), "|---|" + "---:|" * (len(who) + (len(who) > 1))]
    ratio = f" {cpu['this'] / cpu['against']:.2f}× |" if len(who) > 1 else ""
    lines.append(f"| CPU s per launch | {' | '.join(f'{cpu[w]:.2f}' for w in who)} |{ratio}")
    for label in results["phases"][who[0]]:
        values = [statistics.median(results["phases"][w][label]) for w in who]
        shown = " | ".join(f"{v:.2f}" for v in values)
        ratio = f" {values[0] / values[1]:.2f}× |" if len(who) > 1 and values[1] else (" |" if len(who) > 1 else "")
        lines.append(f"| {label} | {shown} |{ratio}")
    lines += ["", "Below the first row: where the CPU seconds go, the median of each phase over the same launches "
              "(``PHASES`` in `benchmarks/startup.py`: phases nest; the last row is the process's own, without "
              "its children)."]
    return "\n".join(lines) + "\n"


EVALUATE_OVERRIDES = ["eval.size=64", "eval.explorer_samples=0"]
"""A small evaluation of the tiny run: its launch's work is next to nothing beside its fixed cost."""


def timed_lines(argv: list[str], cwd: Path, repo: Path) -> tuple[float, float]:
    """``argv`` from launch: (seconds to its last line of output, seconds to its exit); raises on failure."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, cwd=cwd, env=clean_env() | {"PYTHONPATH": str(repo)}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    last, lines = 0.0, []
    for line in process.stdout:
        last = time.perf_counter() - started
        lines.append(line)
    process.wait()
    ended = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:3])} exited {process.returncode}:\n{''.join(lines)[-3000:]}")
    return last, ended


def exit_commands(repo: Path, root: Path, run_id: str, i: int) -> dict[str, list[str]]:
    """Each entry point of checkout ``repo`` on the store in ``root`` (its trained run ``run_id``), launch ``i``."""
    uri = [f"mlflow.tracking_uri=sqlite:///{root}/mlflow.db"]
    return {
        "train.py": [sys.executable, str(repo / "train.py"), *LAUNCH_OVERRIDES, *uri,
                     f"mlflow.experiment_name={EXPERIMENT}", f"hydra.run.dir={root}/out-{i}"],
        "evaluate.py": [sys.executable, str(repo / "evaluate.py"), f"run_id={run_id}", *EVALUATE_OVERRIDES, *uri,
                        f"hydra.run.dir={root}/evaluate-{i}"],
        "translate.py": [sys.executable, str(repo / "translate.py"), f"run_id={run_id}", *uri, "s3 s1 s4"],
    }


def measure_exits(tries: int = 3, against: Path | None = None, log: Callable[[str], None] = print) -> dict:
    """``tries`` launches of each entry point of this checkout (alternating with ``against``'s) on one trained
    run: the seconds to each launch's last line of output and to its exit."""
    from mlflow.tracking import MlflowClient

    checkouts = {"this": REPO, **({"against": against.resolve()} if against else {})}
    results: dict = {"tries": tries, "checkouts": {who: str(path) for who, path in checkouts.items()}, "seconds": {}}
    with tempfile.TemporaryDirectory(prefix="attnseq-exits-") as tmp:
        root = Path(tmp)
        seeded_store(root, schema_template(root))
        timed_lines(exit_commands(REPO, root, "", 0)["train.py"], root, REPO)  # the run the others read
        client = MlflowClient(f"sqlite:///{root}/mlflow.db")
        [run] = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
        for i in range(tries):
            for who in list(checkouts) if i % 2 == 0 else list(checkouts)[::-1]:
                for command, argv in exit_commands(checkouts[who], root, run.info.run_id, i + 1).items():
                    last, ended = timed_lines(argv, root, checkouts[who])
                    results["seconds"].setdefault(command, {}).setdefault(who, []).append((last, ended))
                    log(f"  {who} {command}: last line at {last:.2f} s, exit at {ended:.2f} s")
    return results


def render_exits(results: dict) -> str:
    median = statistics.median
    who = list(results["checkouts"])
    lines = [
        "### How each command ends",
        "",
        f"`python benchmarks/startup.py --exits{' --against <checkout>' if len(who) > 1 else ''}`: one tiny run "
        f"(`train.py {' '.join(LAUNCH_OVERRIDES)}`), then each entry point launched on it, "
        f"{results['tries']} times" + (", alternating with the other checkout" if len(who) > 1 else "")
        + "; wall seconds from launch to the last line it prints and to its exit (medians). `evaluate.py "
        + " ".join(EVALUATE_OVERRIDES) + "`; `translate.py` translates one source.",
        "",
        "| command | checkout | to the last line s | the exit s | launch to exit s |",
        "|---|---|---:|---:|---:|",
    ]
    for command, by_who in results["seconds"].items():
        for w in who:
            last = median(a for a, _ in by_who[w])
            tail = median(b - a for a, b in by_who[w])
            lines.append(f"| `{command}` | {w} (`{results['checkouts'][w]}`) | {last:.2f} | {tail:.2f} | "
                         f"{median(b for _, b in by_who[w]):.2f} |")
    return "\n".join(lines) + "\n"


def measure_new_store(tries: int = 3, against: Path | None = None, log: Callable[[str], None] = print) -> dict:
    """``tries`` first launches into a new store (a new folder each) of this checkout, alternating with
    ``against``'s: each launch's ``attnseq.first_step_s``, its wall seconds to the exit and its CPU seconds
    (the process and its children: the schema's own process included)."""
    checkouts = {"this": REPO, **({"against": against.resolve()} if against else {})}
    results: dict = {"tries": tries, "checkouts": {who: str(path) for who, path in checkouts.items()},
                     "first_step_s": {who: [] for who in checkouts}, "wall_s": {who: [] for who in checkouts},
                     "cpu_s": {who: [] for who in checkouts}}
    for i in range(tries):
        for who in list(checkouts) if i % 2 == 0 else list(checkouts)[::-1]:
            with tempfile.TemporaryDirectory(prefix="attnseq-new-store-") as tmp:
                before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
                results["first_step_s"][who].append(first_step_s(Path(tmp), f"new-{i}", checkouts[who]))
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                results["wall_s"][who].append(time.monotonic() - started)
                results["cpu_s"][who].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            log(f"  {who}: first step {results['first_step_s'][who][-1]:.2f} s, "
                f"exit {results['wall_s'][who][-1]:.2f} s, CPU {results['cpu_s'][who][-1]:.2f} s")
    return results


def render_new_store(results: dict) -> str:
    from attnseq.metrics.significance import welch_p

    median = statistics.median
    who = list(results["checkouts"])
    compared = len(who) > 1
    lines = [
        "### The first launch into a new store",
        "",
        f"`python benchmarks/startup.py --new-store{' --against <checkout>' if compared else ''} --tries "
        f"{results['tries']}`: `python train.py +trainer.max_steps=1` (the defaults, one step) into a new SQLite "
        f"store, a new folder each time{', alternating with the other checkout' if compared else ''}; medians. "
        "First step: the run's `attnseq.first_step_s`; CPU: the launch and its children.",
        "",
        "| checkout | first step s | launch to exit s | CPU s |",
        "|---|---:|---:|---:|",
    ]
    for w in who:
        lines.append(f"| {w} (`{results['checkouts'][w]}`) | {median(results['first_step_s'][w]):.2f} | "
                     f"{median(results['wall_s'][w]):.2f} | {median(results['cpu_s'][w]):.2f} |")
    if compared:
        lines.append("")
        for key, what in (("first_step_s", "first step"), ("wall_s", "launch to exit"), ("cpu_s", "CPU")):
            this, other = results[key]["this"], results[key]["against"]
            lines.append(f"- {what}: this / against **{median(this) / median(other):.2f}×** "
                         f"(Welch p = {welch_p(this, other):.3f})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--launch-cost", action="store_true", help="only the fixed CPU cost of a tiny launch")
    parser.add_argument("--exits", action="store_true", help="only how each command ends: its last line, its exit")
    parser.add_argument("--new-store", action="store_true",
                        help="only the first launch into a new store: its first step, exit and CPU seconds")
    parser.add_argument("--against", type=Path,
                        help="with --launch-cost, --exits or --new-store: another checkout, measured alternately")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="with --launch-cost: a variable for every launch's environment (repeatable)")
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.exits:
        print(render_exits(measure_exits(args.tries, args.against, log=log)))
        return 0
    if args.new_store:
        print(render_new_store(measure_new_store(args.tries, args.against, log=log)))
        return 0
    if args.launch_cost:
        env = dict(item.split("=", 1) for item in args.env)
        print(render_launch_cost(measure_launch_cost(args.tries, args.against, env, log=log)))
        return 0
    results = measure(args.tries, log=log)
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
