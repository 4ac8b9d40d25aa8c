"""Checking ``conf/evaluate.yaml``: every key (``validate_evaluate``, torch-free), then the filter as
MLflow search syntax (``check_config``, the first thing ``evaluate(cfg)`` does); before Hydra makes the
run folder, ``evaluate.py`` also checks the store holds the runs chosen (``check_selection``)."""

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


def check_selection(cfg: EvalConfig) -> None:
    """The store is there and holds the runs ``cfg`` chooses (the experiment, the run ids, the sweep):
    ``evaluate.py`` asks before Hydra makes the run folder, so a wrong one leaves nothing on disk and
    a missing SQLite store is not created."""
    from attnseq.evaluation.trained_runs import chosen_runs
    from attnseq.tracking.client import TrackingClient
    from attnseq.tracking.store import check_store_to_read

    check_store_to_read(cfg.mlflow.tracking_uri)
    chosen_runs(TrackingClient(cfg.mlflow.tracking_uri), cfg)
