"""One Optuna study shared by two workers (``hparams_search=optuna`` with ``hydra.sweeper.storage`` and
``study_name``): two ``train.py -m`` processes started at once, each in a folder of its own, sharing only
the study's SQLite database and an ``mlflow server`` started here. What they leave is read back from the
study (Optuna's own ``load_study``) and from the server's store: trial numbers unique, the requested
number of trials in total, one study parent run, every trial's run its child; a worker killed mid-trial
(SIGKILL) leaves its trial FAIL and its run KILLED, and the other worker finishes the study."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from cli_helpers import (
    TRAIN_PY,
    clean_env,
    explain,
    is_child,
    mlflow_server,
    run_cli,
    stop_group,
    tiny,
    user_env,
    wait_until,
)
from mlflow.entities import ViewType
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

STUDY = "shared"
JOB_NUM = "attnseq.job_num"  # the tag a sweep's job carries its number in (here: its trial's number)
SURPLUS = "attnseq.surplus"  # a trial asked past n_trials in a race between the workers, never run
WORKER_S = 600


def start_worker(folder: Path, storage: str, server_url: str, n_trials: int, *extra: str,
                 env: dict | None = None) -> subprocess.Popen:  # fmt: skip
    """The same command a user starts on each machine; only its folders are its own."""
    folder.mkdir(parents=True)
    argv = [
        sys.executable, str(TRAIN_PY), "-m", "hparams_search=optuna",
        f"hydra.sweeper.storage={storage}", f"hydra.sweeper.study_name={STUDY}", f"hydra.sweeper.n_trials={n_trials}",
        "hydra.sweeper.heartbeat_interval_s=1", "hydra.sweeper.grace_period_s=4",
        f"mlflow.tracking_uri={server_url}", f"hydra.run.dir={folder}/out", f"hydra.sweep.dir={folder}/multi",
        *tiny(max_epochs=1, heatmaps=False), *extra,
    ]  # fmt: skip
    log = (folder / "worker.log").open("w")
    return subprocess.Popen(argv, cwd=folder, env=clean_env() | (env or {}), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def ended(proc: subprocess.Popen, folder: Path) -> int:
    try:
        return proc.wait(timeout=WORKER_S)
    except subprocess.TimeoutExpired:
        stop_group(proc, signal.SIGKILL)
        raise AssertionError(f"worker in {folder} still running after {WORKER_S} s:\n{log_of(folder)}") from None


def log_of(folder: Path) -> str:
    return (folder / "worker.log").read_text()[-4000:]


def trials_of(storage: str, env: dict | None = None) -> tuple[list, list]:
    """The study's trials that ran, and those told FAIL at once as surplus."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        trials = optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
    return [t for t in trials if not t.user_attrs.get(SURPLUS)], [t for t in trials if t.user_attrs.get(SURPLUS)]


def runs_of(server) -> tuple[list, list]:
    client = server.backend
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, run_view_type=ViewType.ALL, max_results=1000)
    return [r for r in runs if not is_child(r)], [r for r in runs if is_child(r)]


def job_folders(folder: Path) -> set[int]:
    """The trial numbers whose job folder (``<sweep dir>/<trial number>``) is under this worker's folder."""
    multi = folder / "multi"
    return {int(p.name) for p in multi.iterdir() if p.is_dir() and p.name.isdigit()} if multi.exists() else set()


@pytest.fixture(params=["sqlite", "postgresql"])
def study_storage(request, tmp_path) -> Iterator[tuple[str, dict]]:
    """The study's storage URL and what its workers' environment adds: an SQLite file (one machine), or
    a PostgreSQL server started here, its password in ``PGPASSWORD`` as docs/operations.md has it."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/study.db", {}
        return
    from test_tracking_server import postgres_server

    with postgres_server("study_user", "s3cret-study", "studies") as port:
        yield f"postgresql+psycopg://study_user@127.0.0.1:{port}/studies", {"PGPASSWORD": "s3cret-study"}


@pytest.mark.slow
def test_two_workers_share_one_study_its_total_and_one_parent(tmp_path, study_storage):
    trials = 4
    storage, env = study_storage
    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as server:
        folders = [tmp_path / "machine-a", tmp_path / "machine-b"]
        workers = [start_worker(folder, storage, server.url, trials, env=env) for folder in folders]  # one instant
        codes = [ended(proc, folder) for proc, folder in zip(workers, folders)]
        assert codes == [0, 0], "\n".join(log_of(folder) for folder in folders)

        ran, surplus = trials_of(storage, env)
        assert sorted(t.number for t in ran) == list(range(trials))  # unique numbers, the total, not per worker
        assert all(t.state == optuna.trial.TrialState.COMPLETE for t in ran)
        assert all(t.state == optuna.trial.TrialState.FAIL and t.number >= trials for t in surplus)

        [parent], children = runs_of(server)  # one study parent, whichever worker made it
        assert parent.data.tags["attnseq.study"] == STUDY and parent.info.status == "FINISHED"
        assert {r.data.tags[MLFLOW_PARENT_RUN_ID] for r in children} == {parent.info.run_id}
        assert sorted(int(r.data.tags[JOB_NUM]) for r in children) == list(range(trials))
        assert all(r.info.status == "FINISHED" for r in children)
        # each trial ran in exactly one worker's folder; both folders together hold them all
        a, b = (job_folders(folder) for folder in folders)
        assert not a & b and a | b == set(range(trials))


@pytest.mark.slow
def test_a_worker_killed_mid_trial_leaves_its_trial_failed_its_run_killed_and_the_other_finishes(tmp_path):
    trials = 3
    storage = f"sqlite:///{tmp_path}/study.db"
    longer = ["trainer.max_epochs=4", "dataset.train_size=256"]  # a trial long enough to be killed in
    (tmp_path / "server").mkdir()
    with mlflow_server(tmp_path / "server") as server:
        doomed_folder, survivor_folder = tmp_path / "machine-a", tmp_path / "machine-b"
        doomed = start_worker(doomed_folder, storage, server.url, trials, *longer)
        survivor = start_worker(survivor_folder, storage, server.url, trials, *longer)

        def doomed_mid_trial() -> bool:  # a run of the study RUNNING whose job is in the doomed worker's folder
            mine = job_folders(doomed_folder)
            return any(r.info.status == "RUNNING" and int(r.data.tags.get(JOB_NUM, -1)) in mine
                       for r in runs_of(server)[1])  # fmt: skip

        wait_until(doomed_mid_trial, "a trial running in the first worker", doomed, doomed_folder / "worker.log",
                   timeout=WORKER_S, poll_s=0.3)  # fmt: skip
        [killed_number] = [n for n in job_folders(doomed_folder)
                           if any(int(r.data.tags.get(JOB_NUM, -1)) == n and r.info.status == "RUNNING"
                                  for r in runs_of(server)[1])]  # fmt: skip
        stop_group(doomed, signal.SIGKILL)  # no handler, no atexit: only the heartbeat can tell

        assert ended(survivor, survivor_folder) == 0, log_of(survivor_folder)
        ran, _ = trials_of(storage)
        assert sorted(t.number for t in ran) == list(range(trials))
        states = {t.number: t.state for t in ran}
        assert states.pop(killed_number) == optuna.trial.TrialState.FAIL
        assert set(states.values()) == {optuna.trial.TrialState.COMPLETE}  # the survivor finished the total

        [parent], children = runs_of(server)
        by_number = {int(r.data.tags[JOB_NUM]): r for r in children}
        assert sorted(by_number) == list(range(trials))
        assert {r.data.tags[MLFLOW_PARENT_RUN_ID] for r in children} == {parent.info.run_id}
        assert by_number.pop(killed_number).info.status == "KILLED"
        assert {r.info.status for r in by_number.values()} == {"FINISHED"}
        assert parent.info.status == "FAILED"  # closed by the last worker: one of its trials did not finish


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("hydra.sweeper.storage=mongodb://localhost/optuna", "hydra.sweeper.storage"),  # not a database Optuna keeps
        ("hydra.sweeper.storage=sqlite:///{root}/no/such/folder/study.db", "hydra.sweeper.storage"),  # cannot open
        ("hydra.sweeper.storage=sqlite://", "hydra.sweeper.storage"),  # in memory: no other worker can join
        ("hydra.sweeper.n_trials=0", "hydra.sweeper.n_trials"),
        ("hydra.sweeper.grace_period_s=1", "hydra.sweeper.grace_period_s"),  # not longer than the heartbeat
        ("hydra.sweeper.n_jobs=abc", "hydra.sweeper.n_jobs"),  # not a whole number
        ("hydra.sweeper.study_name=' '", "hydra.sweeper.study_name"),  # blank: no worker could find it
    ],
)
def test_a_bad_study_setting_fails_before_any_run_naming_its_key(tmp_path, override, key):
    proc = run_cli(tmp_path, "-m", "hparams_search=optuna", "hydra.sweeper.study_name=s",
                   "hydra.sweeper.heartbeat_interval_s=2", override.format(root=tmp_path),
                   f"mlflow.tracking_uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.sweep.dir={tmp_path}/multi",
                   env=user_env())  # fmt: skip
    assert proc.returncode == 2, explain(proc)
    assert key in proc.stderr and "Fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no store, no sweep folder


def test_the_search_space_is_the_sweep_overrides_a_fixed_value_winning():
    """``params`` then the command line, as the sweeper reads them: each sweep override an Optuna
    distribution over the values Hydra's own sweeper would list; a key fixed later leaves the space."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from attnseq.training.study import search_space

    space, fixed = search_space([
        "model.hidden_size=choice(64, 128)", "optimizer.lr=tag(log, interval(0.0003, 0.01))",
        "model.dropout=interval(0.0, 0.5)", "model.heads=range(1, 9, 3)", "seed=range(0.5, 2.0, 0.5)",
        "model.hidden_size=16", "trainer.max_epochs=1",
    ])  # fmt: skip
    assert fixed == ["model.hidden_size=16", "trainer.max_epochs=1"]
    assert space["optimizer.lr"] == FloatDistribution(0.0003, 0.01, log=True)
    assert space["model.dropout"] == FloatDistribution(0.0, 0.5)
    [heads] = OverridesParser.create().parse_overrides(["model.heads=range(1, 9, 3)"])
    grid = [int(v) for v in heads.sweep_string_iterator()]  # Hydra's own listing of the range
    assert grid == [1, 4, 7] and space["model.heads"] == IntDistribution(grid[0], grid[-1], step=3)
    assert space["seed"] == CategoricalDistribution([0.5, 1.0, 1.5])  # a float range: its values, as Hydra lists them
    assert sorted(space) == ["model.dropout", "model.heads", "optimizer.lr", "seed"]
