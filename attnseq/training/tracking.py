"""MLflow bookkeeping: the tracking URI from the config, experiments, run names, tags, params,
and the parent run that groups a sweep.

A sweep's parent run is created in the launching process (``SweepParentRun``, a Hydra callback)
before any job starts — which also creates the store's schema and the experiment there, since
concurrent first-time SQLite migrations from parallel jobs race. Its id reaches every job, in
process or in a joblib worker, through the environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Param

from attnseq.errors import ConfigError
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME
from omegaconf import DictConfig, OmegaConf

PARENT_RUN_ENV = "ATTNSEQ_MLFLOW_PARENT_RUN_ID"
SWEEP_KEYS_ENV = "ATTNSEQ_SWEEP_KEYS"
"""Set by the sweep callback in the launching process, read by every job of the sweep."""

_URI_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^@/]+)@")
_SECRET_KEY = re.compile(r"(password|passwd|secret|token|api_key|access_key|credential)", re.IGNORECASE)


def redact(key: str, value: Any) -> str:
    """A value safe to store as a param or tag: no credentials from URIs, no secret-named keys."""
    if _SECRET_KEY.search(key):
        return "***"
    return _URI_CREDENTIALS.sub(r"\g<scheme>***@", str(value))


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    """Command-line overrides with secret-named values and URI credentials masked."""
    safe = []
    for override in overrides:
        key, sep, value = override.partition("=")
        safe.append(f"{key}{sep}{redact(key, value)}" if sep else redact("", override))
    return safe


def redact_config(node: Any, key: str = "") -> Any:
    """A resolved config (dicts and lists) with every secret-named value and URI credential masked."""
    if isinstance(node, Mapping):
        return {k: redact_config(v, f"{key}.{k}" if key else str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [redact_config(v, key) for v in node]
    if isinstance(node, str) or _SECRET_KEY.search(key):
        return redact(key, node)
    return node


def check_tracking_uri(uri: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, before any training, when the tracking store cannot be used.

    A server must answer ``/health``; a SQLite file's folder must exist; the plain file store
    (``./mlruns``) is not accepted by MLflow 3.17 any more.
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


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"heads": 2}}`` → ``{"model.heads": 2}``; lists stay whole values."""
    flat: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def config_params(cfg: DictConfig) -> list[Param]:
    """Every resolved config value as an MLflow param, secrets redacted."""
    resolved = redact_config(OmegaConf.to_container(cfg, resolve=True))
    return [Param(key, str(value)[:6000]) for key, value in sorted(flatten(resolved).items())]


def config_yaml(cfg: DictConfig) -> str:
    """The resolved config as saved with a run (``config/resolved.yaml``), secrets redacted."""
    return OmegaConf.to_yaml(OmegaConf.create(redact_config(OmegaConf.to_container(cfg, resolve=True))))


def git_commit(cwd: Path | None = None) -> tuple[str | None, bool]:
    """The checkout's commit and whether its tracked files have uncommitted changes."""
    cwd = cwd or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        return commit, bool(dirty)
    except (OSError, subprocess.SubprocessError):
        return None, False


def describe_choices(cfg: DictConfig) -> str:
    """A default run name from the choices users sweep over: ``copy-gru-additive-bahdanau-h1``."""
    scorer = cfg.scorer.name
    parts = [cfg.dataset.task, cfg.encoder.name, scorer]
    if scorer != "none":
        parts += [cfg.decoder.convention, f"h{cfg.model.heads}"]
    return "-".join(str(p) for p in parts)


def sweep_run_name(task_overrides: Iterable[str], sweep_keys: Iterable[str], job_num: int | None) -> str:
    """A sweep job's name from the overrides that vary across the sweep: ``scorer=dot model.heads=4``."""
    keys = set(sweep_keys)
    varying = [o for o in task_overrides if o.split("=", 1)[0].lstrip("+~") in keys]
    name = " ".join(varying) or "job"
    return f"{name} (#{job_num})" if job_num is not None else name


def sweep_context() -> tuple[str | None, list[str]]:
    """The parent run id and the varying override keys, when this process runs a sweep job."""
    parent = os.environ.get(PARENT_RUN_ENV) or None
    keys = json.loads(os.environ.get(SWEEP_KEYS_ENV, "[]"))
    return parent, keys


def create_run(
    client: MlflowClient,
    experiment_id: str,
    run_name: str,
    tags: Mapping[str, str],
    parent_run_id: str | None,
) -> str:
    all_tags = {MLFLOW_RUN_NAME: run_name, **tags}
    if parent_run_id:
        all_tags[MLFLOW_PARENT_RUN_ID] = parent_run_id
    return client.create_run(experiment_id, tags=all_tags, run_name=run_name).info.run_id
