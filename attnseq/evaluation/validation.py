"""Checking ``conf/evaluate.yaml``: every key (``validate_evaluate``, torch-free), then the filter as
MLflow search syntax (``check_config``, the first thing ``evaluate(cfg)`` does); that the store holds the
runs chosen is ``trained_runs.check_selection``."""

from __future__ import annotations

from omegaconf import DictConfig

from attnseq.config import EvalConfig, shown, validate_evaluate
from attnseq.errors import ConfigError

EXAMPLE_FILTER = "\"filter='params.\\\"scorer.name\\\" = \\\"dot\\\" and metrics.\\\"val/acc\\\" > 0.9'\""
"""A filter as the shell passes it to Hydra intact: the override in the shell's double quotes, its value
in Hydra's single quotes, MLflow's names and values in (escaped) double quotes."""


def check_config(cfg: DictConfig) -> EvalConfig:
    """The typed config, or ``ConfigError`` naming every bad value, what it must be and the fix."""
    config = validate_evaluate(cfg)
    check_filter(config)
    return config


def check_filter(cfg: EvalConfig) -> None:
    """``filter`` goes with ``experiment_name`` and is MLflow search syntax (parsed by MLflow on an empty store
    in memory, not by the run's store: ``tracking.store.runs_filter_problem``)."""
    search = cfg.filter
    if search is None:
        return
    if not cfg.experiment_name:
        raise ConfigError(
            f"filter={shown(search)} selects among an experiment's runs, but experiment_name is not set.",
            "add experiment_name=<name>, or drop the filter.",
        )
    from attnseq.tracking.store import runs_filter_problem

    problem = runs_filter_problem(search)
    if problem is not None:
        raise ConfigError(
            f"filter={shown(search)} is not MLflow search syntax: {problem}",
            f"write it like {EXAMPLE_FILTER} (pasted as printed: for MLflow, values and names with dots or "
            "slashes in double quotes).",
        )

