"""The schema of ``conf/evaluate.yaml``: every key checked before the store is opened
(``check_config``, the first thing ``evaluate(cfg)`` does)."""

from __future__ import annotations

from omegaconf import DictConfig

from attnseq.config import (
    Check,
    check_groups,
    check_table,
    flag,
    length_range,
    number,
    optional,
    shown,
    text,
    texts,
    value_at,
    whole,
)
from attnseq.errors import ConfigError

EVALUATE_SCHEMA: dict[str, Check] = {
    "run_id": optional(text(example="<run id>")),
    "run_ids": optional(texts(example=["<run id>", "<run id>"])),
    "parent_run_id": optional(text(example="latest")),
    "experiment_name": optional(text(example="bottleneck")),
    "filter": optional(text(example="params.`scorer.name` = 'dot'")),  # and MLflow search syntax
    "eval.lengths": optional(length_range(example=[1, 80])),
    "eval.bucket_width": optional(whole(1, example=5)),
    "eval.size": whole(1, example=2000),
    "eval.batch_size": whole(1, example=128),
    "eval.beam_size": whole(1, example=1),
    "eval.counterfactual": flag(),
    "eval.seed": whole(0, 2**32 - 1, example=1),
    "eval.sentences": texts(example=["Unknown object"]),
    "compare": flag(),
    "threads": optional(whole(1, example=1)),
    "mlflow.tracking_uri": text(example="sqlite:///mlflow.db"),
    "mlflow.retry_budget_s": number(0, above=True, example=30),
    "paths.output_dir": text(example="outputs/eval/my-evaluation"),
}
"""Every key of ``conf/evaluate.yaml``, with what its value must be."""


def check_config(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` naming the first key whose value cannot work, what it must be, and the fix."""
    check_groups(cfg, ("eval", "mlflow", "paths"))
    check_table(cfg, EVALUATE_SCHEMA)
    check_filter(cfg)


def check_filter(cfg: DictConfig) -> None:
    """``filter`` goes with ``experiment_name`` and is MLflow search syntax (parsed here, not by the store)."""
    search = value_at(cfg, "filter")
    if search is None:
        return
    if not cfg.get("experiment_name"):
        raise ConfigError(
            f"filter={shown(search)} selects among an experiment's runs, but experiment_name is not set.",
            "add experiment_name=<name>, or drop the filter.",
        )
    from mlflow.exceptions import MlflowException
    from mlflow.utils.search_utils import SearchUtils

    try:
        SearchUtils.parse_search_filter(search)
    except MlflowException as error:
        raise ConfigError(
            f"filter={shown(search)} is not MLflow search syntax: {error.message}",
            "write it like filter=\"params.`scorer.name` = 'dot' and metrics.`val/acc` > 0.9\" (quote values "
            "with ', names with dots or slashes with `).",
        ) from None
