"""The tracking store: the URI's fail-fast check, the schema created once, and experiments."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote, urlsplit, urlunsplit

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from sqlalchemy.exc import SQLAlchemyError

from attnseq.errors import ConfigError
from attnseq.tracking.prepared_store import PreparedStore, files_of, remove_stale, sqlite_path
from attnseq.tracking.redaction import redact, redact_text


def check_tracking_uri(uri: str, timeout_s: float = 5.0, prepared: PreparedStore | None = None) -> None:
    """Fail in seconds, before any training, when the tracking store cannot be used; for a
    database store, also create its schema (``open_store``; a new SQLite store's from the one ``prepared``
    is making beside it, where given, once the checks have passed).

    A server must answer ``/health``; a SQLite file must be a database this process can write, or
    a new file in a writable folder; any other database must accept a connection within
    ``timeout_s``; the plain file store (``./mlruns``) is no longer accepted by MLflow. Every
    failure is one ``ConfigError``.
    """
    shown = redact("", uri)
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else "file"
    if scheme in ("http", "https"):
        import requests

        try:
            response = requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
        except requests.RequestException as error:
            raise ConfigError(
                f"the MLflow tracking server at {shown} cannot be reached ({type(error).__name__}).",
                "start it (docker compose -f docker/compose.yaml up -d), or point mlflow.tracking_uri "
                "(or MLFLOW_TRACKING_URI) at a running server; mlflow.tracking_uri=sqlite:///mlflow.db "
                "needs no server.",
            ) from None
        if response.status_code != 200:
            raise ConfigError(
                f"the MLflow tracking server at {shown} answered /health with HTTP {response.status_code}.",
                "check the server's logs; a 403 usually means its --allowed-hosts list does not include "
                "the host name in the URI.",
            )
    elif scheme == "sqlite":
        _check_sqlite(uri, shown)
        open_store(uri, prepared)
    elif scheme.split("+")[0] in ("postgresql", "mysql", "mssql"):
        _check_database(uri, shown, scheme, timeout_s)
        open_store(uri)
    elif scheme == "file":
        raise ConfigError(
            f"mlflow.tracking_uri={shown} is a plain file store, which MLflow 3.17 no longer accepts.",
            "use a database: mlflow.tracking_uri=sqlite:///mlflow.db (the default), or a server URL.",
        )


def check_store_to_read(uri: str) -> None:
    """``check_tracking_uri`` for a command that reads runs someone trained (evaluation, translation): a
    SQLite file that is not there is a wrong URI, not a new store, so it is not created."""
    path = sqlite_path(uri) if uri.lower().startswith("sqlite:") else None
    if path is not None and not path.is_file():
        raise ConfigError(f"there is no MLflow store at {redact('', uri)} (no file {path}).",
                          "point mlflow.tracking_uri (or MLFLOW_TRACKING_URI) at the store the runs were trained "
                          "into, e.g. mlflow.tracking_uri=sqlite:///$PWD/mlflow.db.")
    check_tracking_uri(uri)


def _check_sqlite(uri: str, shown: str) -> None:
    path = sqlite_path(uri)
    if path is None:
        return
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(
            f"the SQLite tracking store {shown} is in a folder that does not exist ({folder}).",
            f"create it (mkdir -p {shlex.quote(str(folder))}) or use mlflow.tracking_uri=sqlite:///mlflow.db.",
        )
    if path.is_dir():
        raise ConfigError(
            f"the SQLite tracking store {shown} names a folder ({path}), not a database file.",
            f"name a file in it: {shlex.quote('mlflow.tracking_uri=sqlite:///' + str(path / 'mlflow.db'))}.",
        )
    if path.is_file() and path.stat().st_size and not _has_sqlite_header(path):
        raise ConfigError(
            f"the SQLite tracking store {shown}: {path} is not an SQLite database.",
            "point mlflow.tracking_uri at the store's database file, or at a new file (it is created).",
        )
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as connection:
            connection.execute("BEGIN IMMEDIATE")  # needs write access; waits out other writers
            connection.rollback()
    except sqlite3.Error as error:
        raise ConfigError(
            f"the SQLite tracking store {shown} cannot be written ({error}).",
            f"use a file in a writable folder (check the permissions of {folder}), e.g. "
            "mlflow.tracking_uri=sqlite:///mlflow.db.",
        ) from None


def _has_sqlite_header(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(16) == b"SQLite format 3\x00"


def _check_database(uri: str, shown: str, scheme: str, timeout_s: float) -> None:
    """One connection attempt, bounded by ``timeout_s`` (MLflow itself retries for minutes)."""
    import sqlalchemy

    dialect = scheme.split("+")[0]
    connect_args = {"connect_timeout": max(1, int(timeout_s))} if dialect in ("postgresql", "mysql") else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=connect_args)
    except (ImportError, sqlalchemy.exc.NoSuchModuleError, sqlalchemy.exc.ArgumentError) as error:
        raise ConfigError(
            f"mlflow.tracking_uri={shown} needs a database driver that is not installed ({error}).",
            "install the driver the URI names (e.g. pymysql for mysql+pymysql://), or use "
            "mlflow.tracking_uri=sqlite:///mlflow.db.",
        ) from None
    try:
        with engine.connect():
            pass
    except Exception as error:  # noqa: BLE001 - every driver has its own errors; all mean the same here
        reason = redact_text(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
        raise ConfigError(
            f"the tracking database {shown} cannot be reached ({reason}).",
            "start the database, or check the host, port, user and password in mlflow.tracking_uri; "
            "mlflow.tracking_uri=sqlite:///mlflow.db needs no server.",
        ) from None
    finally:
        engine.dispose()


def open_store(uri: str, prepared: PreparedStore | None = None) -> MlflowClient:
    """A client of the store, its schema created or migrated first.

    MLflow creates a database store's tables when a process first opens it, in steps that a signal
    can cut in half, and two processes opening a fresh SQLite file at once would both migrate it.
    For SQLite the first opening is therefore done under an exclusive lock on ``<db file>.lock``,
    and a fresh store's schema is made in ``<db file>.creating`` beside it, then renamed into place
    (``create_sqlite_store``): the store is either whole or not there; the schema ``prepared`` made beside it
    in a child process (``attnseq.tracking.prepared_store``; waited for here), is renamed into place instead.
    The store then stays open (MLflow caches it per URI) for the clients this process makes later.
    """
    path = sqlite_path(uri) if uri.lower().startswith("sqlite:") else None
    with _file_lock(path.with_name(path.name + ".lock") if path is not None else None):
        if path is not None:
            remove_stale(path)
        if path is not None and is_fresh(path):
            made = None if prepared is None else prepared.claim(uri)
            if made is not None:
                os.replace(made, path)
            else:
                create_sqlite_store(path)
        try:
            return MlflowClient(tracking_uri=uri)
        except (MlflowException, SQLAlchemyError) as error:
            raise _cannot_open(uri, path, error) from None


def is_fresh(path: Path) -> bool:
    """No store there yet: no file, or a database without a table (``_check_sqlite`` may have made it)."""
    if not path.is_file() or not path.stat().st_size:
        return True
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as connection:
            return connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    except sqlite3.Error:  # damaged: MLflow's own error says how (``_cannot_open``)
        return False


def create_sqlite_store(path: Path) -> None:
    """Make the store's schema (MLflow's tables, migrations and default experiment) in a file beside
    ``path`` and rename it into place; a signal or a crash on the way leaves ``path`` as it was."""
    from mlflow.store.tracking import DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    aside = path.with_name(path.name + ".creating")
    aside.unlink(missing_ok=True)  # left by a process killed while creating
    try:
        # the artifact root MLflow's client gives a database store (the default experiment's location)
        store = SqlAlchemyStore(f"sqlite:///{aside.resolve()}", DEFAULT_LOCAL_FILE_AND_ARTIFACT_PATH)
        store.engine.dispose()
        os.replace(aside, path)
    except (MlflowException, SQLAlchemyError) as error:
        raise ConfigError(
            f"a new SQLite tracking store cannot be created at {path} ({redact_text(str(error).splitlines()[0])}).",
            f"check the free space and permissions of {path.parent}, or use another file, e.g. "
            "mlflow.tracking_uri=sqlite:///mlflow.db.",
        ) from None
    finally:
        aside.unlink(missing_ok=True)


def _cannot_open(uri: str, path: Path | None, error: Exception) -> ConfigError:
    """What is wrong with a store MLflow cannot open, and a fix that works for that store."""
    shown = redact("", uri)
    reason = redact_text(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)
    if path is None:
        return ConfigError(
            f"the tracking store {shown} cannot be opened: {reason}",
            f"for a store made by an older MLflow, take a backup, then upgrade its schema (mlflow db upgrade "
            f"{shlex.quote(shown)}); or use a new store, e.g. mlflow.tracking_uri=sqlite:///mlflow.db.",
        )
    moved = path.with_name(path.name + ".damaged")
    move = f"mv {shlex.quote(str(path))} {shlex.quote(str(moved))}"
    if _holds_no_runs(path):
        return ConfigError(
            f"the SQLite tracking store {path} is damaged and holds no runs (its creation was cut short, "
            f"or it comes from another program): {reason}",
            f"move it aside ({move}) and run the command again: a new store is created in its place.",
        )
    return ConfigError(
        f"the SQLite tracking store {path} holds runs but MLflow cannot open it: {reason}",
        f"if an older MLflow made it, take a backup (cp {shlex.quote(str(path))} {shlex.quote(f'{path}.backup')}) "
        f"and upgrade it (mlflow db upgrade {shlex.quote(f'sqlite:///{path.resolve()}')}); otherwise move it aside "
        f"({move}) to start a new store there, or point mlflow.tracking_uri at another file.",
    )


def _holds_no_runs(path: Path) -> bool:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as connection:
            return connection.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    except sqlite3.Error:  # no runs table, or not readable as a database
        return True


@contextlib.contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    try:
        handle = path.open("a")
    except OSError:  # a folder we may not write beside: the store itself was checked writable
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


EXPERIMENT_KIND = "mlflow.experimentKind"
"""MLflow's experiment tag for the kind of work an experiment holds (its UI's kind selector writes it)."""
MODEL_TRAINING_KIND = "custom_model_development"
"""The value of ``EXPERIMENT_KIND`` for model training (the UI labels it "Machine learning")."""
WORKFLOW_TYPE = "workflowType=machine_learning"
"""The query that makes MLflow 3.17's UI open a page in the model-training view.

The UI (its built ``main.*.js``, module 31080) picks the view from the page's ``workflowType`` query,
else from the last choice saved in the browser, else the GenAI view; a feature flag that is always on
in the open-source build (module 89511, export ``Z0``) makes it ignore the experiment's
``EXPERIMENT_KIND`` tag. Every URL attnseq prints therefore carries this query; the tag is still set,
so the experiment reads as model training wherever the tag is honoured.
"""


FILTER_CHECK_STORE = "sqlite:///:memory:"
"""An empty store in memory, where a filter's syntax is checked (``runs_filter_problem``)."""


def runs_filter_problem(search: str) -> str | None:
    """What MLflow finds wrong with ``search`` as a runs filter (its own message), or None: MLflow's
    search through its public client, on an empty store in memory, so that neither the user's store
    is opened (nor created) for it nor a file written. Its schema takes about a second to make, once
    per process (MLflow keeps the store per URI)."""
    client = MlflowClient(tracking_uri=FILTER_CHECK_STORE)
    try:
        client.search_runs(["0"], search, max_results=1)  # "0": the default experiment, in every store
    except MlflowException as error:
        return error.message
    return None


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """The experiment's id, created if missing (tolerating a concurrent creator), tagged as model
    training (``EXPERIMENT_KIND``) unless it already says what it is."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, tags={EXPERIMENT_KIND: MODEL_TRAINING_KIND})
        except MlflowException:
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage != "active":
        client.restore_experiment(experiment.experiment_id)
    if EXPERIMENT_KIND not in experiment.tags:  # a kind someone chose in the UI is kept
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING_KIND)
    return experiment.experiment_id


def ui_url(tracking_uri: str, experiment_id: str, run_id: str | None = None,
           ui_address: str = "http://127.0.0.1:5000", runs_filter: str | None = None) -> str:
    """The address of an experiment's page, or of one of its runs, in the model-training view.

    For a tracking server (``http(s)://``) the server itself serves the UI (its credentials are left
    out: the browser asks for them); for any other store it is ``ui_address``, where ``mlflow ui``
    started on that store listens. The UI routes after ``#``:
    ``<address>/#/experiments/<id>/runs/<run id>?workflowType=machine_learning``. With ``runs_filter``
    (a search filter, or ``""``: none) the experiment's Runs tab, filtered as its search box would be
    (the UI reads its ``searchFilter`` query).
    """
    is_server = tracking_uri.lower().startswith(("http://", "https://"))
    parts = urlsplit(tracking_uri if is_server else ui_address)
    address = urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path.rstrip("/"), "", ""))
    if runs_filter is not None:
        search = f"&searchFilter={quote(runs_filter, safe='')}" if runs_filter else ""
        return f"{address}/#/experiments/{experiment_id}/runs?{WORKFLOW_TYPE}{search}"
    return f"{address}/{ui_route(experiment_id, run_id)}"


def ui_route(experiment_id: str, run_id: str | None = None, artifact: str | None = None) -> str:
    """The UI's route to an experiment's page, one of its runs, or one of a run's artifacts (its
    Artifacts tab, that file open), in the model-training view:
    ``#/experiments/<id>/runs/<run id>/artifacts/<path>?workflowType=machine_learning``. It is what
    follows the address in ``ui_url``; on its own, a link relative to whatever address serves the UI
    (a run's note links its pictures with it)."""
    page = f"/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    if artifact is not None:
        if run_id is None:
            raise ValueError("an artifact's route needs its run")
        page += f"/artifacts/{quote(artifact, safe='/')}"
    return f"#{page}?{WORKFLOW_TYPE}"


UI_HOST = "127.0.0.1"
UI_PORT = 5000
"""Where ``mlflow ui`` (and ``make ui``) serves a local store by default."""


class UiLinks(NamedTuple):
    """How to look at a run in the MLflow UI."""

    open_with: str | None  # the command that starts a UI on the store; None when a server already serves it
    url: str  # the page of the experiment, or of the run (``ui_url``)


def ui_links(tracking_uri: str, experiment_id: str, run_id: str | None = None, port: int = UI_PORT,
             runs_filter: str | None = None) -> UiLinks:
    """The command that opens the store (its absolute path, so it works from any folder) and the URL
    of the experiment's or run's page in the model-training view. For an ``http(s)`` store the URL is
    the server's own; for any other store it is the local ``mlflow ui`` the command starts. Every
    link attnseq prints is built here."""
    url = ui_url(tracking_uri, experiment_id, run_id, ui_address=f"http://{UI_HOST}:{port}", runs_filter=runs_filter)
    if tracking_uri.lower().startswith(("http://", "https://")):
        return UiLinks(None, redact_text(url))
    store = tracking_uri
    path = sqlite_path(tracking_uri) if tracking_uri.lower().startswith("sqlite:") else None
    if path is not None:
        store = f"sqlite:///{path.resolve()}"
    return UiLinks(f"mlflow ui --backend-store-uri {redact('', store)} --port {port}", url)


def prepare_schema(store: Path, prepared: Path, owner: int) -> None:
    """A new store's schema made at ``prepared`` for the training process ``owner`` (``prepared_store``):
    nothing if ``store`` was made meanwhile; removed again if ``owner`` is gone by the time it is made."""
    if not is_fresh(store):
        return
    create_sqlite_store(prepared)
    if os.getppid() != owner:  # the training is gone: nobody will take it
        for leftover in files_of(prepared):
            leftover.unlink(missing_ok=True)


if __name__ == "__main__":  # the child process of ``prepared_store.PreparedStore.start``
    import sys

    prepare_schema(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
