"""A new SQLite store's schema made by a child process during the training's start-up
(``attnseq.tracking.prepared_store``): taken into place only when the store is opened, never left behind."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import explain, outputs_under, run_cli, tiny, tracking_uri, user_env
from hydra import compose, initialize_config_dir
from mlflow.tracking import MlflowClient

from attnseq.cli import CONF_DIR
from attnseq.tracking.prepared_store import PREPARED, PreparedStore, new_sqlite_store, prepared_file
from attnseq.tracking.store import open_store
from attnseq.training.pipeline import Detached, train

REPO = Path(__file__).resolve().parents[1]


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as connection:
        return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def dead_pid() -> int:
    """The pid of a process that has just exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_schema_is_made_aside_and_renamed_into_place_only_when_the_store_opens(tmp_path):
    uri = tracking_uri(tmp_path)
    prepared = PreparedStore.start(uri)
    assert prepared is not None
    made = prepared.claim(uri)
    assert made == prepared_file(tmp_path / "mlflow.db", os.getpid()) and made.is_file()
    assert not (tmp_path / "mlflow.db").exists()  # nothing at the store's own path before it is opened
    assert {"experiments", "runs", "metrics", "alembic_version"} <= tables(made)

    client = open_store(uri, prepared)
    assert not made.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db", "mlflow.db.lock"]
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "m", 1.0)
    assert MlflowClient(uri).get_metric_history(run.info.run_id, "m")[0].value == 1.0


def test_a_store_made_meanwhile_is_kept_and_the_prepared_schema_removed(tmp_path):
    uri = tracking_uri(tmp_path)
    prepared = PreparedStore.start(uri)
    made = prepared.claim(uri)
    other = tmp_path / "other"
    other.mkdir()
    existing = open_store(tracking_uri(other))  # another process's store, moved into place meanwhile
    existing.create_experiment("kept")
    os.replace(other / "mlflow.db", tmp_path / "mlflow.db")

    client = open_store(uri, prepared)
    assert client.get_experiment_by_name("kept") is not None  # not replaced by the empty schema
    assert made.is_file()  # not taken: removed at the training's exit
    prepared.discard()
    assert not list(tmp_path.glob(f"mlflow.db{PREPARED}*"))


@pytest.mark.parametrize("uri", ["sqlite:///{root}/existing.db", "sqlite:///{root}/missing/mlflow.db",
                                 "sqlite:////proc/attnseq-mlflow.db",  # a folder nobody writes, root included
                                 "sqlite:///:memory:", "http://127.0.0.1:5000", "postgresql://u@localhost/db"])
def test_nothing_is_prepared_but_for_a_new_sqlite_file_in_a_writable_folder(tmp_path, uri):
    (tmp_path / "existing.db").write_bytes(b"SQLite format 3\x00" + bytes(100))
    uri = uri.format(root=tmp_path)
    assert new_sqlite_store(uri) is None and PreparedStore.start(uri) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.db"]


def test_on_one_core_nothing_is_started(tmp_path, monkeypatch):
    """The child would only take the training's core: the training makes the schema itself."""
    from attnseq.tracking import prepared_store

    monkeypatch.setattr(prepared_store, "usable_cores", lambda: 1)
    assert PreparedStore.start(tracking_uri(tmp_path)) is None
    assert list(tmp_path.iterdir()) == []


def test_an_empty_file_left_by_a_check_counts_as_a_new_store(tmp_path):
    (tmp_path / "mlflow.db").touch()
    assert new_sqlite_store(tracking_uri(tmp_path)) == tmp_path / "mlflow.db"


def test_discard_stops_the_child_at_once_and_leaves_nothing(tmp_path):
    uri = tracking_uri(tmp_path)
    prepared = PreparedStore.start(uri)
    time.sleep(1.0)  # the child is importing MLflow, or making the schema
    prepared.discard()
    assert prepared.process.returncode is not None
    assert list(tmp_path.iterdir()) == []


def test_a_claim_for_another_store_gets_nothing(tmp_path):
    prepared = PreparedStore.start(tracking_uri(tmp_path))
    assert prepared.claim(f"sqlite:///{tmp_path}/other.db") is None
    assert prepared.claim("http://127.0.0.1:5000") is None
    prepared.discard()
    assert list(tmp_path.iterdir()) == []


def test_a_child_whose_training_is_gone_removes_what_it_made(tmp_path):
    store = tmp_path / "mlflow.db"
    command = [sys.executable, "-m", "attnseq.tracking.store", str(store)]
    gone = subprocess.run([*command, str(prepared_file(store, 1)), str(dead_pid())], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert gone.returncode == 0, gone.stderr
    assert list(tmp_path.iterdir()) == []
    kept = subprocess.run([*command, str(prepared_file(store, 2)), str(os.getpid())], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert kept.returncode == 0, kept.stderr
    assert [p.name for p in tmp_path.iterdir()] == [f"mlflow.db{PREPARED}2"]  # its training (this test) is alive


def test_the_files_of_trainings_that_no_longer_exist_are_removed_when_the_store_opens(tmp_path):
    dead, alive = dead_pid(), os.getpid()
    for name in (f"mlflow.db{PREPARED}{dead}", f"mlflow.db{PREPARED}{dead}.creating",
                 f"mlflow.db{PREPARED}{dead}.creating-journal", f"mlflow.db{PREPARED}{alive}"):
        (tmp_path / name).write_bytes(b"")
    open_store(tracking_uri(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db", "mlflow.db.lock", f"mlflow.db{PREPARED}{alive}"]


class Prepared(Detached):
    """A runtime whose entry point had the store's schema made aside (``Runtime.prepare_store``)."""

    def __init__(self, uri: str) -> None:
        super().__init__()
        self.child = PreparedStore.start(uri)
        self.asked: list[str] = []

    def prepared_store(self) -> PreparedStore | None:
        self.asked.append(self.child)
        return self.child


def test_the_training_takes_the_schema_when_it_opens_its_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow puts a SQLite store's artifacts under ./mlruns
    uri = tracking_uri(tmp_path)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", [*tiny(max_epochs=1, heatmaps=False), f"mlflow.tracking_uri={uri}",
                                f"paths.output_dir={tmp_path / 'out'}", "trainer.enable_progress_bar=false"])
    runtime = Prepared(uri)
    made = runtime.child.claim(uri)  # done before the training asks, so that the take can be seen
    inode = made.stat().st_ino
    train(cfg, runtime)
    assert runtime.asked == [runtime.child]  # once
    assert (tmp_path / "mlflow.db").stat().st_ino == inode  # the prepared file became the store
    assert not list(tmp_path.glob(f"mlflow.db{PREPARED}*"))
    [run] = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("attnseq").experiment_id])
    assert run.info.status == "FINISHED"


@pytest.mark.parametrize("problem", [["+trainer.foo=1"], ["dataset=tsv", "dataset.path=/nonexistent/corpus"]],
                         ids=["lightning-argument", "missing-corpus"])
def test_a_refused_training_into_a_new_store_leaves_nothing(tmp_path, problem):
    proc = run_cli(tmp_path, *problem, *outputs_under(tmp_path), env=user_env())
    assert proc.returncode == 2, explain(proc)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "out") == [], explain(proc)


def test_a_training_into_a_new_store_leaves_the_store_alone(tmp_path):
    proc = run_cli(tmp_path, *tiny(max_epochs=1, heatmaps=False), *outputs_under(tmp_path), env=user_env())
    assert proc.returncode == 0, explain(proc)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in ("out", "mlruns")) == \
        ["mlflow.db", "mlflow.db.lock"]
