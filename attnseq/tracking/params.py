"""A composed config as a run records it: flat params, and the resolved YAML artifact."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from attnseq.tracking.redaction import redact_config


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"heads": 2}}`` → ``{"model.heads": 2}``; lists stay whole values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def config_params(cfg: DictConfig) -> dict[str, Any]:
    """Every resolved config value by its dotted key (``TrackedRun.log_params`` masks secrets)."""
    return dict(sorted(flatten(OmegaConf.to_container(cfg, resolve=True)).items()))


def config_yaml(cfg: DictConfig) -> str:
    """The resolved config as saved with a run (``paths.RESOLVED_CONFIG``), secrets masked."""
    return OmegaConf.to_yaml(OmegaConf.create(redact_config(OmegaConf.to_container(cfg, resolve=True))))
