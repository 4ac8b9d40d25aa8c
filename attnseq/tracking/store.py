"""The tracking store: the URI's fail-fast check, and experiments."""

from __future__ import annotations

from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from attnseq.errors import ConfigError
from attnseq.tracking.redaction import redact


def check_tracking_uri(uri: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, before any training, when the tracking store cannot be used.

    A server must answer ``/health``; a SQLite file's folder must exist; the plain file store
    (``./mlruns``) is no longer accepted by MLflow.
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
        path = uri.split(":///", 1)[1] if ":///" in uri else ""
        folder = Path(path).parent if path and path != ":memory:" else None
        if folder is not None and not folder.is_dir():
            raise ConfigError(
                f"the SQLite tracking store {shown} is in a folder that does not exist ({folder}).",
                f"create it (mkdir -p {folder}) or use mlflow.tracking_uri=sqlite:///mlflow.db.",
            )
    elif scheme == "file":
        raise ConfigError(
            f"mlflow.tracking_uri={shown} is a plain file store, which MLflow 3.17 no longer accepts.",
            "use a database: mlflow.tracking_uri=sqlite:///mlflow.db (the default), or a server URL.",
        )


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """The experiment's id, created if missing (tolerating a concurrent creator)."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None and experiment.lifecycle_stage == "active":
        return experiment.experiment_id
    if experiment is not None:
        client.restore_experiment(experiment.experiment_id)
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id
