"""The process-wide effects belong to the entry points' runtime (``attnseq.runtime``) alone.

- ``train(cfg)`` and ``evaluate(cfg)`` called in-process (a notebook, a test) leave the signal
  handlers, logging's record factory and filters, ``os.environ`` and torch's thread count as they
  found them;
- a ``Runtime`` applies its settings and undoes them at its exit; at the interpreter's exit, after every
  exit handler registered after it, it spares the teardown its full collections;
- a command line that Hydra cannot compose is answered before torch is imported, with nothing
  written to disk; a sweep is composed job by job;
- no private attribute of Hydra or MLflow is used anywhere in the package.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import warnings

import pytest
import torch
from cli_helpers import REPO, TRAIN_PY, clean_env, explain  # noqa: E402  (tests/ is on sys.path under pytest)
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from mlflow.tracking import MlflowClient

from attnseq.cli import CONF_DIR, MAX_COMPOSED_JOBS, command_line_overrides, sweep_jobs
from attnseq.runtime import Runtime
from attnseq.tracking.redaction import redact_text
from attnseq.tracking.retry import BUDGET_ENV, retry_budget

PACKAGE = REPO / "attnseq"


def process_state() -> dict:
    """What a library call must leave as it found it."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in logging.root.manager.loggerDict)]
    return {
        "signals": {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)},
        "record_factory": logging.getLogRecordFactory(),
        "filters": {logger.name: list(logger.filters) for logger in loggers if isinstance(logger, logging.Logger)},
        # MLflow's telemetry thread drops its own session variable when it cannot report, whoever calls
        "environ": {name: value for name, value in os.environ.items() if not name.startswith("_MLFLOW_")},
        "threads": torch.get_num_threads(),
        "warnings": list(warnings.filters),
    }


def assert_unchanged(before: dict, after: dict) -> None:
    """The same state; a logger made meanwhile counts as unchanged if it has no filters."""
    for key in before:
        if key == "filters":
            assert {name: after[key][name] for name in before[key]} == before[key]
            assert [name for name in after[key] if name not in before[key] and after[key][name]] == []
        else:
            assert after[key] == before[key], key


def compose_train(overrides: list[str], name: str = "train"):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(name, overrides=overrides)


# -- train(cfg) from Python changes nothing process-wide ---------------------------------------------
@pytest.mark.slow
def test_train_and_evaluate_called_in_process_leave_the_process_as_they_found_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow puts a SQLite store's artifacts under ./mlruns
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = compose_train([
        "debug=fdr", f"paths.output_dir={tmp_path / 'out'}", f"mlflow.tracking_uri={uri}",
        f"threads={torch.get_num_threads() + 1}",  # a thread count the runtime would set, train() must not
        "model.embedding_dim=8", "model.hidden_size=16", "dataset.train_lengths=[1,6]",
        "dataset.eval_lengths=[1,10]", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
    ])
    from attnseq.evaluation import evaluate
    from attnseq.training import train

    logging.getLogger("lightning.pytorch.utilities.rank_zero")  # exists before, so its filters are compared
    before = process_state()
    train(cfg)

    assert_unchanged(before, process_state())
    (run,) = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("attnseq").experiment_id])
    assert run.info.status == "FINISHED"  # it did train

    (result,) = evaluate(compose_train([
        f"run_id={run.info.run_id}", f"mlflow.tracking_uri={uri}", f"paths.output_dir={tmp_path / 'eval'}",
        "eval.size=16", "eval.counterfactual=false", f"threads={torch.get_num_threads() + 1}"], "evaluate"))
    assert_unchanged(before, process_state())
    assert result.metrics  # it did evaluate


# -- the runtime applies and undoes --------------------------------------------------------------
def test_a_runtime_applies_its_settings_and_undoes_them_at_its_exit():
    secret = "s3cr3t-value"
    cfg = compose_train([f"mlflow.tracking_uri=http://me:{secret}@host:5000", "mlflow.retry_budget_s=120",
                         f"threads={torch.get_num_threads() + 1}"])
    threads = torch.get_num_threads()
    before = process_state()
    with Runtime() as runtime:
        assert signal.getsignal(signal.SIGTERM) is runtime.signals.handler and Runtime.active() is runtime
        runtime.configure(cfg)
        assert torch.get_num_threads() == threads + 1 and os.environ["OMP_NUM_THREADS"] == str(threads + 1)
        assert retry_budget() == 120 and os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "6"
        assert os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] == "true"
        assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
        assert redact_text(f"name {secret}") == "name ***"
        record = logging.getLogRecordFactory()("x", logging.INFO, __file__, 1, "said %s", (secret,), None)
        assert record.getMessage() == "said ***"
        with runtime.handed_off({"ATTNSEQ_HANDED": "1"}):
            assert os.environ["ATTNSEQ_HANDED"] == "1"
        assert "ATTNSEQ_HANDED" not in os.environ
        with Runtime.joined() as joined:  # a job in the same process joins the process's runtime
            assert joined is runtime
    assert_unchanged(before, process_state())
    assert Runtime.active() is None and BUDGET_ENV not in os.environ
    assert redact_text(f"name {secret}") == f"name {secret}"


def test_an_evaluations_bootstrap_seed_reaches_sacrebleu_for_the_runtime_only():
    """sacreBLEU's paired bootstrap reads its seed from ``SACREBLEU_SEED`` alone: the runtime of
    ``evaluate.py`` hands it ``eval.bootstrap_seed`` and takes it back at its exit."""
    from attnseq.metrics.significance import sacrebleu_seed

    cfg = compose_train(["eval.bootstrap_seed=4242"], name="evaluate")
    before = os.environ.get("SACREBLEU_SEED")
    with Runtime() as runtime:
        runtime.configure(cfg)
        assert os.environ["SACREBLEU_SEED"] == "4242" and sacrebleu_seed() == "4242"
    assert os.environ.get("SACREBLEU_SEED") == before


def test_a_runtime_not_entered_touches_nothing():
    before = process_state()
    runtime = Runtime()
    runtime.configure(compose_train(["threads=3", "mlflow.retry_budget_s=120"]))
    with runtime.handed_off({"ATTNSEQ_HANDED": "1"}):
        assert "ATTNSEQ_HANDED" not in os.environ
    assert_unchanged(before, process_state())


def test_a_data_parallel_worker_of_a_sweep_job_runs_its_job_not_the_sweep(monkeypatch):
    """Lightning starts a worker with the sweep's own command line (``-m``, every swept value) plus
    its ``hydra.*`` additions: the worker reads its job's command instead, Lightning's additions kept."""
    runtime = Runtime()
    sweep = ["-m", "scorer=additive,dot", "trainer=ddp", 'hydra.run.dir="outputs/x"',
             "hydra.job.name=train_ddp_process_1", "hydra.output_subdir=null"]
    job = ["scorer=dot", "trainer=ddp", 'hydra.run.dir="/runs/multi/1"']
    with Runtime() as rank_zero, rank_zero.handed_off({}, command=job):
        handed = dict(os.environ)
    monkeypatch.setattr(os, "environ", handed | {"LOCAL_RANK": "1"})
    assert runtime.job_command_line(sweep) == [*job, "hydra.job.name=train_ddp_process_1", "hydra.output_subdir=null"]
    monkeypatch.setattr(os, "environ", handed | {"LOCAL_RANK": "0"})  # rank 0 reads its own command line
    assert runtime.job_command_line(sweep) == sweep


def test_a_job_gives_back_what_lightnings_launcher_set_and_the_process_group(monkeypatch, tmp_path):
    """The next job of a sweep in the same process must start its own workers in a group of its own."""
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with Runtime() as runtime, runtime.job():
        os.environ.update(MASTER_PORT="29999", LOCAL_RANK="0", WORLD_SIZE="1", NODE_RANK="0")
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    assert not dist.is_initialized()
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"  # the user's own, kept
    assert not {"MASTER_PORT", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK"} & set(os.environ)


# -- the command line, composed before anything heavy -----------------------------------------------
def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """``translate.py … | head -1``: the pipe's reader leaves; the command ends with the shell's SIGPIPE
    status (141) and no traceback, the rest of its output dropped."""
    writer = ("from attnseq.runtime import Runtime\n"
              "with Runtime():\n"
              "    for n in range(10**6):\n"
              "        print(f'line {n}')\n")
    proc = subprocess.Popen([sys.executable, "-c", writer], cwd=REPO, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_the_interpreters_teardown_collects_nothing_after_the_libraries_exit_handlers(tmp_path):
    """An entry point's runtime freezes the heap (``gc.freeze``) at the interpreter's exit, after the exit handlers
    the libraries register later (torch's, MLflow's: they still run on a heap the collector sees), so the teardown
    skips its full collections; an exit handler registered before the runtime runs after the freeze. Nothing is
    lost on the way out: what the command printed and wrote is all there."""
    script = ("import atexit, gc, sys\n"
              "atexit.register(lambda: print('first registered, run last: frozen', gc.get_freeze_count() > 0))\n"
              "from attnseq.runtime import Runtime\n"
              "runtime = Runtime().install()\n"
              "Runtime().install()  # once per process, however many runtimes install\n"
              "atexit.register(lambda: print('a library, registered later: frozen', gc.get_freeze_count() > 0))\n"
              "cycle = [open(sys.argv[1], 'w')]\n"
              "cycle.append(cycle)\n"
              "cycle[0].write('written before the exit')\n"
              "cycle[0].flush()\n"
              "with runtime:\n"
              "    print('work done', flush=True)\n")
    written = tmp_path / "written.txt"
    proc = subprocess.run([sys.executable, "-c", script, str(written)], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["work done", "a library, registered later: frozen False",
                                        "first registered, run last: frozen True"]
    assert written.read_text() == "written before the exit"


def test_the_command_line_overrides_and_hydra_flags():
    assert command_line_overrides(["scorer=dot", "-m", "model.heads=1,4"]) == (["scorer=dot", "model.heads=1,4"], True)
    assert command_line_overrides(["--cfg", "job", "scorer=dot"]) == (["scorer=dot"], False)
    assert command_line_overrides(["--config-name", "other", "scorer=dot"]) is None  # Hydra's to compose


def test_a_sweep_is_composed_job_by_job():
    parse = OverridesParser.create().parse_overrides
    jobs = sweep_jobs(parse(["scorer=dot,general", "model.heads=1,4", "seed=3"]))
    assert jobs == [[f"scorer={s}", f"model.heads={h}", "seed=3"] for s in ("dot", "general") for h in (1, 4)]
    assert sweep_jobs(parse(["model.heads=range(1,4)"])) == [["model.heads=1"], ["model.heads=2"], ["model.heads=3"]]
    big = sweep_jobs(parse([f"seed=range(0,{MAX_COMPOSED_JOBS + 1})", "scorer=dot,general"]))
    # too many for every combination: each value once, the other key at its first value
    assert len(big) == MAX_COMPOSED_JOBS + 1 + 1 and big[:2] == [["seed=0", "scorer=dot"], ["seed=1", "scorer=dot"]]
    assert big[-1] == ["seed=0", "scorer=general"]
    assert sweep_jobs(parse(["optimizer.lr=interval(0.001,0.1)"])) == [[]]  # the sweeper samples it


@pytest.mark.parametrize(("override", "fragment"), [
    ("scorer=dott", "Did you mean scorer=dot?"),
    ("modle.heads=2", "Did you mean model.heads?"),
    ("+model.heads=2", "drop the +: model.heads=<value>."),
    ("model.heads=[1", "an override cannot be parsed"),
])
@pytest.mark.parametrize("multirun", [False, True], ids=["run", "sweep"])
def test_a_composition_error_is_answered_before_torch_loads_and_writes_nothing(tmp_path, override, fragment,
                                                                                multirun):
    env = {k: v for k, v in clean_env().items() if k != "HYDRA_FULL_ERROR"} | {"PYTHONPATH": str(REPO)}
    args = ["-m", "seed=1,2", override] if multirun else [override]
    proc = subprocess.run([sys.executable, "-X", "importtime", str(TRAIN_PY), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, explain(proc)
    assert fragment in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", proc.stderr, re.M))
    assert "hydra" in imported and not imported & {"torch", "lightning", "mlflow"}, sorted(imported)
    assert list(tmp_path.iterdir()) == []  # no outputs/, no multirun/, no store


@pytest.mark.parametrize(("overrides", "bad_keys"), [
    (["model.heads=-1"], ["model.heads"]),
    (["model.heads=-1", "model.dropout=2"], ["model.heads", "model.dropout"]),
    (["dataset.train_lengths=[5,2]"], ["dataset.train_lengths"]),
    (["encoder=transformer", "encoder.heads=3"], ["encoder.heads"]),
], ids=["heads", "two-problems", "lengths", "encoder-heads"])
def test_a_bad_value_is_answered_before_torch_loads_and_writes_nothing(tmp_path, overrides, bad_keys):
    """The typed config's first stage runs on the composed command line, before the heavy imports:
    every bad key named with a fix, all at once, exit 2, no run folder, no store."""
    env = {k: v for k, v in clean_env().items() if k != "HYDRA_FULL_ERROR"} | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-X", "importtime", str(TRAIN_PY), *overrides], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, explain(proc)
    told = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    assert all(key in told for key in bad_keys) and told.count("Fix:") == len(bad_keys), told
    assert "Traceback" not in told
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", proc.stderr, re.M))
    assert not imported & {"torch", "lightning", "mlflow"}, sorted(imported)
    assert list(tmp_path.iterdir()) == []


# -- no private API of a dependency ----------------------------------------------------------------
def test_no_private_attribute_of_hydra_or_mlflow_is_used():
    private = re.compile(r"\._internal\b|\b_tracking_uri\b|\b(hydra|mlflow)(\.\w+)*\._(?!_)\w")
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if private.search(line)]
    assert found == []
