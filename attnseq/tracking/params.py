"""A run's record of its config: the composed config as resolved (``config_record``, made once per
run), written as flat params and as the resolved YAML artifact (``paths.RESOLVED_CONFIG``). The record,
not the typed config, is what a run stores: it keeps the config's own key order and spelling (``30``
stays ``30``, where the typed ``heartbeat.every_s`` reads ``30.0``), so both read as the yaml."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from attnseq.tracking.redaction import redact_config


def config_record(cfg: DictConfig) -> dict[str, Any]:
    """The composed config as plain, resolved values: what ``config_params`` and ``config_yaml`` write."""
    return OmegaConf.to_container(cfg, resolve=True)


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


def config_params(record: Mapping[str, Any]) -> dict[str, Any]:
    """Every config value by its dotted key (``TrackedRun.log_params`` masks secrets)."""
    return dict(sorted(flatten(record).items()))


def config_yaml(record: Mapping[str, Any]) -> str:
    """The config as saved with a run (``paths.RESOLVED_CONFIG``), secrets masked."""
    return OmegaConf.to_yaml(OmegaConf.create(redact_config(record)))
