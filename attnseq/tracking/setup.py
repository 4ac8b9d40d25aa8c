"""``TrackingSetup``: a Hydra callback that masks the secrets in the files Hydra writes in a run's
output folder (``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``) and in a sweep's
``multirun.yaml``, as soon as Hydra has written them.

Registered in ``conf/train.yaml`` and ``conf/evaluate.yaml`` under ``hydra.callbacks``, first. The
rest of redaction (log records, remembered secrets) and the retry budget are the process's: the
entry point's runtime sets them (``attnseq.runtime``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from attnseq.tracking.redaction import redact_config

HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
MULTIRUN_FILE = "multirun.yaml"


class TrackingSetup(Callback):
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra = config.hydra
        if hydra.output_subdir is not None:
            for name in HYDRA_FILES:
                redact_yaml_file(Path(hydra.runtime.output_dir) / str(hydra.output_subdir) / name)
        if hydra.mode == RunMode.MULTIRUN:
            redact_yaml_file(Path(str(hydra.sweep.dir)) / MULTIRUN_FILE)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        redact_yaml_file(Path(str(config.hydra.sweep.dir)) / MULTIRUN_FILE)


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
