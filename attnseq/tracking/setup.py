"""``TrackingSetup``: a Hydra callback that sets up the tracking layer in every process Hydra
starts (``train.py``, ``evaluate.py``, a sweep's launcher and each job), before anything is
recorded.

- the retry budget (``mlflow.retry_budget_s``, ``retry``) for MLflow's HTTP client;
- redaction: the secrets of the config and the command line are remembered, every log record
  (Hydra's launcher lists each job's overrides) is redacted, and MLflow's own "View run at" lines,
  which would print a URI's credentials, are turned off;
- the files Hydra writes in the output folder (``.hydra/config.yaml``, ``hydra.yaml``,
  ``overrides.yaml``) and a sweep's ``multirun.yaml`` are rewritten with secrets masked, as soon
  as Hydra has written them.

Registered in ``conf/train.yaml`` and ``conf/evaluate.yaml`` under ``hydra.callbacks``, first.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from attnseq.errors import ConfigError
from attnseq.tracking.redaction import redact_config, redact_log_records, remember_secrets, secrets_in
from attnseq.tracking.retry import set_retry_budget

HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
MULTIRUN_FILE = "multirun.yaml"


class TrackingSetup(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        prepare_process(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        prepare_process(config)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        prepare_process(config)
        hydra = config.hydra
        if hydra.output_subdir is not None:
            for name in HYDRA_FILES:
                redact_yaml_file(Path(hydra.runtime.output_dir) / str(hydra.output_subdir) / name)
        if hydra.mode == RunMode.MULTIRUN:
            redact_yaml_file(Path(str(hydra.sweep.dir)) / MULTIRUN_FILE)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        redact_yaml_file(Path(str(config.hydra.sweep.dir)) / MULTIRUN_FILE)


def prepare_process(config: DictConfig) -> None:
    """Redaction and the retry budget for this process, from its composed config."""
    redact_log_records()
    try:
        tree = OmegaConf.to_container(config, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation that fails here fails later with its own message
        tree = OmegaConf.to_container(config, resolve=False)
    remember_secrets(secrets_in(tree))
    uri = str(OmegaConf.select(config, "mlflow.tracking_uri", default="") or "")
    if secrets_in(uri):
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    budget = OmegaConf.select(config, "mlflow.retry_budget_s", default=None)
    try:
        set_retry_budget(check_budget(budget))
    except ConfigError as error:  # raised outside the task, where the CLI's error handling is not
        print(f"error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(error.exit_code) from None


def check_budget(value: Any) -> float | None:
    if value is None:
        return None
    try:
        budget = float(value)
    except (TypeError, ValueError):
        budget = float("nan")
    if not 0 < budget < float("inf"):
        raise ConfigError(
            f"mlflow.retry_budget_s={value} must be a positive number of seconds.",
            "set mlflow.retry_budget_s=30 (the default), or more to wait out a store that restarts.",
        )
    return budget


def redact_yaml_file(path: Path) -> None:
    """Rewrite a YAML file Hydra wrote with every secret masked (in place, atomically)."""
    if not path.is_file():
        return
    text = path.read_text()
    data = yaml.safe_load(text)
    safe = redact_config(data)
    if safe == data:
        return
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        yaml.safe_dump(safe, handle, sort_keys=False, allow_unicode=True)
    os.replace(handle.name, path)
