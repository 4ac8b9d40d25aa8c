"""Shared test settings and fixtures.

Tests build tiny models: with more than one torch thread per process they spend their time in
thread hand-offs (and fight the CLI subprocesses for the two cores), so the test process uses one.

The fixtures that train through the real ``train.py`` are session-scoped: several modules read the
same tiny run (or the same failing one), so it is trained once per test session; a reader adds
nothing to its runs. MLflow and the CLI helpers are imported when a fixture is first used, so a module
that needs neither does not pay for them.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


REPO = Path(__file__).resolve().parents[1]
GENERATED = ("mlflow.db", "mlruns", "mlartifacts", "outputs", "multirun")
"""What a run writes into the folder it starts in: a test's runs start under its tmp_path, never here."""


def generated_in_checkout() -> set[str]:
    """The checkout's generated files and folders, down to a run's or a Hydra job's own folder."""
    found = set()
    for name in GENERATED:
        top = REPO / name
        if top.exists():
            paths = [top, *(path for depth in ("*", "*/*", "*/*/*") for path in top.glob(depth))]
            found |= {str(path.relative_to(REPO)) for path in paths}
    return found


def pytest_sessionstart(session) -> None:
    session.config.stash[GENERATED_BEFORE] = generated_in_checkout()
    session.config.stash[MLFLOW_URI_BEFORE] = mlflow_process_uri()


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the session if its tests wrote runs or Hydra folders into the checkout (``make test`` would leave
    them in the user's tree); once, in the process that ran the session (not each xdist worker)."""
    if hasattr(session.config, "workerinput") or GENERATED_BEFORE not in session.config.stash:
        return
    written = sorted(generated_in_checkout() - session.config.stash[GENERATED_BEFORE])
    if written:
        listed = "\n  ".join(written[:20])
        print(f"\nerror: the tests wrote into the checkout {REPO} (run them from a tmp_path):\n  {listed}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


GENERATED_BEFORE = pytest.StashKey[set]()


def mlflow_process_uri() -> tuple[str | None, str | None]:
    """MLflow's process-wide tracking URI as ``mlflow.set_tracking_uri`` leaves it (None while MLflow is not
    imported or nothing set it) and ``MLFLOW_TRACKING_URI`` (which that call sets too)."""
    mlflow = sys.modules.get("mlflow")
    uri = mlflow.get_tracking_uri() if mlflow is not None and mlflow.is_tracking_uri_set() else None
    return uri, os.environ.get("MLFLOW_TRACKING_URI")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A test whose code (or fixture) leaves MLflow's process-wide tracking URI set, as Lightning's
    ``MLFlowLogger`` does, sends every later in-process MLflow call of its worker (``mlflow runs list`` run
    by click, ``runs:/`` URIs) to its store: after its teardown, that is an error of the test that left it,
    and the URI is put back so the tests after it run as they would alone."""
    result = yield
    left = mlflow_process_uri()
    expected = item.config.stash.get(MLFLOW_URI_BEFORE, (None, None))
    if left != expected:
        import mlflow

        mlflow.set_tracking_uri(None)  # also unsets MLFLOW_TRACKING_URI
        if expected[1] is not None:
            os.environ["MLFLOW_TRACKING_URI"] = expected[1]
        raise AssertionError(f"MLflow's process-wide tracking URI was left at {left} (before: {expected}); "
                             "wrap the code that sets it in attnseq.tracking.logged_model.logging_scope")
    return result


MLFLOW_URI_BEFORE = pytest.StashKey[tuple]()


def pytest_collection_modifyitems(config, items) -> None:
    """The modules with the most long end-to-end tests (marked ``slow``) first, each module's tests in
    their own order: ``make test`` hands whole modules to its workers (``--dist loadfile``), so the long
    ones start at once instead of leaving one worker busy after the others are done."""
    slow: dict[Path, int] = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.path])  # stable: within a module, and among equals, as collected


@dataclass(frozen=True)
class TrainedRun:
    """One ``train.py`` invocation: its folder (store under ``root/mlflow.db``, Hydra's run folder
    ``root/out``), the finished process, its runs, and when it was launched (Unix time)."""

    root: Path
    proc: object  # subprocess.CompletedProcess
    launched: float

    @property
    def uri(self) -> str:
        from cli_helpers import tracking_uri

        return tracking_uri(self.root)

    @property
    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(self.uri)

    @property
    def runs(self) -> list:
        from cli_helpers import all_runs

        return all_runs(self.client)


def train_once(root: Path, *overrides: str, env: dict | None = None) -> TrainedRun:
    from cli_helpers import outputs_under, run_cli, warm_up

    args = [*overrides, *outputs_under(root, seeded=True)]  # may first make the schema template: seconds
    warm_up()  # `launched` is then the launch's own start (a warm one's process starts at the fork)
    launched = time.time()
    proc = run_cli(root, *args, env=env)
    return TrainedRun(root, proc, launched)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny models: a second only adds contention (100× slower on a
    busy box); the count is restored after the module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A fresh SQLite store for one module's in-process tracking tests: (client, experiment id)."""
    from cli_helpers import seeded_store
    from mlflow.tracking import MlflowClient

    from attnseq.tracking.store import ensure_experiment

    root = tmp_path_factory.mktemp("store")
    client = MlflowClient(tracking_uri=seeded_store(root))
    return client, ensure_experiment(client, "tests")


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> TrainedRun:
    """The default configuration (copy, GRU, additive, Bahdanau, 1 head) at ``tiny()`` sizes, trained
    once through ``train.py`` into its own store; it must finish with exactly one run."""
    from cli_helpers import explain, tiny

    trained = train_once(tmp_path_factory.mktemp("tiny_run"), *tiny())
    assert trained.proc.returncode == 0, explain(trained.proc)
    assert len(trained.runs) == 1, [r.info.run_name for r in trained.runs]
    return trained


@pytest.fixture(scope="session")
def copy_run(tmp_path_factory) -> TrainedRun:
    """A run that copies: 5 symbols, source lengths 1-5, 3,200 examples, 4 epochs at a high learning
    rate, one thread (about 15 s of CPU). Its validation exact match within the training lengths is
    1.000 (0.97 after 3 epochs), so a test may assert a short source's output literally; ``tiny_run``,
    barely trained, outputs noise."""
    from cli_helpers import explain

    overrides = ["dataset.train_size=3200", "dataset.val_size=64", "dataset.test_size=32", "dataset.num_symbols=5",
                 "dataset.train_lengths=[1,5]", "dataset.eval_lengths=[1,10]", "model.hidden_size=32",
                 "model.embedding_dim=16", "optimizer.lr=0.01", "trainer.max_epochs=4", "threads=1",
                 "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
                 "tracking.heatmap_samples=0"]
    trained = train_once(tmp_path_factory.mktemp("copy_run"), *overrides)
    assert trained.proc.returncode == 0, explain(trained.proc)
    assert len(trained.runs) == 1, [r.info.run_name for r in trained.runs]
    return trained


@pytest.fixture(scope="session")
def nan_run(tmp_path_factory) -> TrainedRun:
    """A run that fails mid-way, after its MLflow run exists: epoch 0 trains normally, then the
    schedule makes the learning rate finite but absurd (3e27) and the loss becomes NaN. Run as a
    user runs it (no HYDRA_FULL_ERROR)."""
    from cli_helpers import tiny, user_env

    return train_once(tmp_path_factory.mktemp("nan_run"), *tiny(max_epochs=3, heatmaps=False), "scheduler.gamma=1e30",
                      env=user_env())


@pytest.fixture(scope="session")
def sweep_with_a_bad_job(tmp_path_factory) -> TrainedRun:
    """A three-job sweep whose middle job fails mid-way, after its MLflow run exists (``scheduler.gamma=1e30``:
    its loss becomes NaN in epoch 1, as ``nan_run``'s), while the other two train. (A value that validation
    rejects stops the whole sweep before any job: ``test_train_cli.py``.)"""
    from cli_helpers import tiny

    return train_once(tmp_path_factory.mktemp("bad_job_sweep"), "-m", "scheduler.gamma=0.5,1e30,0.9",
                      *tiny(max_epochs=2, heatmaps=False))
